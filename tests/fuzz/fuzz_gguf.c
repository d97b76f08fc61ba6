/*
 * Fuzz target: GGUF files (kv_gguf_open), and the Llama loader on what opens.
 *
 * The input is the file. The reader must refuse it with KV_ERR_FORMAT (KV_ERR_IO only for a
 * file it cannot map), a message and no handle, or open it keeping its promises: version 2
 * or 3, a power-of-two alignment, every key and tensor name found again by lookup, every
 * string and array inside the file, every tensor's shape 1..4 dims of ne >= 1, its bytes what
 * its type and shape need, its data aligned and inside the file. The loader then either
 * refuses with a message and an empty model or gives a model whose config validates and
 * whose weights are all finite.
 */
#include "fuzz_common.h"
#include "kv_gguf_model.h"
#include "kv_gguf_quant.h"

#include <math.h>

static const unsigned char *lo, *hi; /* the mapped file, from tensor 0 when there is one */

static void inside(const void *p, uint64_t n, const char *what)
{
    if (!lo || n == 0) return;
    const unsigned char *q = p;
    FUZZ_REQUIRE(q >= lo && q <= hi && n <= (uint64_t)(hi - q), "%s outside the file", what);
}

/* a name of the file as a C string, for the lookups (names hold no NUL: the reader said so) */
static const char *cstr(kv_gguf_str s, char *buf, size_t cap)
{
    FUZZ_REQUIRE(s.n < cap && memchr(s.s, 0, s.n) == NULL, "a name of %llu bytes or with NUL",
                 (unsigned long long)s.n);
    memcpy(buf, s.s, s.n);
    buf[s.n] = 0;
    return buf;
}

static void check_tensors(const kv_gguf *g)
{
    const uint64_t align = kv_gguf_alignment(g);
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        char name[80];
        FUZZ_REQUIRE(kv_gguf_find_tensor(g, cstr(t->name, name, sizeof name)) == t,
                     "tensor %lld not found by its name", (long long)i);
        FUZZ_REQUIRE(t->n_dims >= 1 && t->n_dims <= 4, "n_dims %d", t->n_dims);
        int64_t rows = 1;
        for (int d = 0; d < 4; d++) {
            FUZZ_REQUIRE(t->ne[d] >= 1 && (d < t->n_dims || t->ne[d] == 1), "ne[%d]", d);
            if (d) rows *= t->ne[d]; /* the reader bounded the product */
        }
        uint64_t row = 0;
        FUZZ_REQUIRE(kv_ggml_row_bytes(t->type, t->ne[0], &row, NULL) == KV_OK &&
                     t->nbytes == row * (uint64_t)rows, "tensor %lld: nbytes", (long long)i);
        FUZZ_REQUIRE(t->offset % align == 0 &&
                     (kv_gguf_data_offset(g) + t->offset) % align == 0, "tensor %lld aligned",
                     (long long)i);
        inside(t->data, t->nbytes, "tensor data");
        inside(t->name.s, t->name.n, "tensor name");
    }
}

static void check_kvs(const kv_gguf *g)
{
    for (int64_t i = 0; i < kv_gguf_n_kv(g); i++) {
        const kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
        static char key[65536 + 1];
        cstr(kv->key, key, sizeof key);
        inside(kv->key.s, kv->key.n, "key");
        FUZZ_REQUIRE(kv_gguf_has(g, key) && kv->type >= 0 && kv->type < KV_GGUF_TYPE_COUNT,
                     "key %lld", (long long)i);
        kv_err err;
        int64_t v;
        double d;
        kv_gguf_str s;
        const kv_gguf_str *strs;
        uint64_t n;
        int et;
        const void *data;
        if (kv->type == KV_GGUF_STRING) {
            FUZZ_REQUIRE(kv_gguf_get_str(g, key, &s, &err) == KV_OK, "get_str: %s", err.msg);
            inside(s.s, s.n, "string");
        } else if (kv->type == KV_GGUF_ARRAY && kv->elem_type == KV_GGUF_STRING) {
            FUZZ_REQUIRE(kv_gguf_get_strings(g, key, &strs, &n, &err) == KV_OK && n == kv->n,
                         "get_strings: %s", err.msg);
            for (uint64_t k = 0; k < n; k++) inside(strs[k].s, strs[k].n, "array string");
        } else if (kv->type == KV_GGUF_ARRAY && kv->elem_type != KV_GGUF_ARRAY) {
            FUZZ_REQUIRE(kv_gguf_get_array(g, key, &et, &n, &data, &err) == KV_OK && n == kv->n,
                         "get_array: %s", err.msg);
            double sum = 0;
            for (uint64_t k = 0; k < n; k++) sum += kv_gguf_array_num(et, data, k);
            (void)sum; /* every element read: ASan sees any read past the file */
        } else if (kv->type != KV_GGUF_ARRAY) {
            FUZZ_REQUIRE(kv_gguf_get_float(g, key, &d, &err) == KV_OK, "get_float: %s", err.msg);
            const int rc = kv_gguf_get_int(g, key, &v, &err);
            FUZZ_REQUIRE(rc == KV_OK || (rc == KV_ERR_FORMAT && err.msg[0]), "get_int");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[256];
    fuzz_path("gguf", path, sizeof path);
    fuzz_write(path, data, size);
    kv_gguf *g = (kv_gguf *)1;
    kv_err err = {{0}};
    int rc = kv_gguf_open(path, &g, &err);
    remove(path); /* the mapping keeps the bytes */
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT || rc == KV_ERR_IO, "unexpected status %d", rc);
        FUZZ_REQUIRE(err.msg[0] != '\0' && g == NULL, "status %d without a message", rc);
        return 0;
    }
    FUZZ_REQUIRE(kv_gguf_version(g) == 2 || kv_gguf_version(g) == 3, "version");
    const uint64_t a = kv_gguf_alignment(g);
    FUZZ_REQUIRE(a && (a & (a - 1)) == 0, "alignment %llu", (unsigned long long)a);
    lo = hi = NULL;
    if (kv_gguf_n_tensors(g) > 0) { /* the mapping's bounds, from a tensor's data pointer */
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, 0);
        lo = (const unsigned char *)t->data - kv_gguf_data_offset(g) - t->offset;
        hi = lo + kv_gguf_file_size(g);
        FUZZ_REQUIRE(kv_gguf_file_size(g) == size, "file size");
    }
    check_tensors(g);
    check_kvs(g);

    kv_model m;
    rc = kv_gguf_model_load(g, &m, &err);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(err.msg[0] != '\0' && m.data == NULL, "loader status %d without a message",
                     rc);
    } else {
        FUZZ_REQUIRE(kv_config_validate(&m.config, NULL) == KV_OK, "loaded config");
        for (int64_t i = 0; i < m.n_floats; i++)
            FUZZ_REQUIRE(isfinite(m.data[i]), "weight %lld not finite", (long long)i);
        kv_model_free(&m);
    }
    kv_gguf_close(g);
    return 0;
}
