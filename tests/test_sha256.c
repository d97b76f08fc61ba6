/*
 * SHA-256 (kv_sha256.h) against the FIPS 180-2 / NIST example vectors: the empty message,
 * "abc", the 448-bit two-block message, the 896-bit one, and one million 'a' (fed in uneven
 * pieces, so block boundaries fall everywhere); the padding edges 55, 56, 63 and 64 bytes
 * (one vs two padding blocks) agree between one update and byte-by-byte updates; and
 * kv_sha256_file on a written file equals the in-memory digest, a missing file is KV_ERR_IO.
 */
#include "kv_sha256.h"
#include "common/kv_test.h"

#include <string.h>
#include <unistd.h>

static void hex_of(const void *data, size_t n, char hex[65])
{
    kv_sha256 s;
    unsigned char d[32];
    kv_sha256_init(&s);
    kv_sha256_update(&s, data, n);
    kv_sha256_final(&s, d, hex);
}

static void check(const char *msg, const char *want)
{
    char hex[65];
    hex_of(msg, strlen(msg), hex);
    KV_CHECK(strcmp(hex, want) == 0, "sha256(\"%.20s...\") = %s, want %s", msg, hex, want);
}

int main(void)
{
    check("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    check("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
          "lmnopqrsmnopqrstnopqrstu",
          "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");

    /* one million 'a', in pieces of 1, 2, ..., 997 bytes and the rest */
    static char a[1000000];
    memset(a, 'a', sizeof a);
    kv_sha256 s;
    unsigned char d[32];
    char hex[65];
    kv_sha256_init(&s);
    size_t off = 0;
    for (size_t k = 1; off < sizeof a; k = k % 997 + 1) {
        size_t n = off + k <= sizeof a ? k : sizeof a - off;
        kv_sha256_update(&s, a + off, n);
        off += n;
    }
    kv_sha256_final(&s, d, hex);
    KV_CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
             "sha256 of a million 'a' = %s", hex);

    /* padding edges: 55 bytes fit one padding block, 56..64 need a second */
    int lens[] = {55, 56, 63, 64, 65, 119, 120};
    for (int i = 0; i < (int)(sizeof lens / sizeof lens[0]); i++) {
        char whole[65], bytewise[65];
        hex_of(a, (size_t)lens[i], whole);
        kv_sha256_init(&s);
        for (int j = 0; j < lens[i]; j++) kv_sha256_update(&s, a + j, 1);
        kv_sha256_final(&s, d, bytewise);
        KV_CHECK(strcmp(whole, bytewise) == 0, "%d bytes: one update %s, bytewise %s", lens[i],
                 whole, bytewise);
    }
    /* 64 'a' (one full block + a padding block), from a second implementation (coreutils) */
    hex_of(a, 64, hex);
    KV_CHECK(strcmp(hex, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb") == 0,
             "sha256 of 64 'a' = %s", hex);

    /* a file: the same digest; a missing one: KV_ERR_IO */
    char path[] = "/tmp/kv_sha256_XXXXXX";
    int fd = mkstemp(path);
    KV_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        KV_CHECK(write(fd, a, 100000) == 100000, "write");
        close(fd);
        char from_file[65];
        kv_err err = {{0}};
        KV_CHECK(kv_sha256_file(path, from_file, &err) == KV_OK, "kv_sha256_file: %s", err.msg);
        hex_of(a, 100000, hex);
        KV_CHECK(strcmp(from_file, hex) == 0, "file digest %s, memory %s", from_file, hex);
        unlink(path);
        KV_CHECK(kv_sha256_file(path, from_file, &err) == KV_ERR_IO, "missing file not KV_ERR_IO");
    }
    return kv_test_finish();
}
