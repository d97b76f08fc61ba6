/*
 * What every fuzz target shares: the libFuzzer entry point's declaration, a scratch file to
 * hand bytes to loaders that read from a path, and a check that aborts (so libFuzzer, and the
 * replay test, see a failure) when a property the library promises does not hold.
 */
#ifndef KV_FUZZ_COMMON_H
#define KV_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the library did not hold: print it and abort, which libFuzzer reports as a
 * crash and saves the input for. */
#define FUZZ_REQUIRE(cond, ...)                                                     \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "fuzz property failed at %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
            abort();                                                                \
        }                                                                           \
    } while (0)

/* Path of a per-process scratch file "<TMPDIR>/kvfuzz_<pid>_<tag>"; fuzzers run in parallel. */
static inline const char *fuzz_path(const char *tag, char *buf, size_t n)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/kvfuzz_%ld_%s", dir && *dir ? dir : "/tmp", (long)getpid(), tag);
    return buf;
}

/* Write @p size bytes to the scratch file @p path (which the caller removes). */
static inline void fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    FUZZ_REQUIRE(f != NULL, "cannot create scratch file %s", path);
    FUZZ_REQUIRE(size == 0 || fwrite(data, 1, size, f) == size, "cannot write %s", path);
    FUZZ_REQUIRE(fclose(f) == 0, "cannot close %s", path);
}

/* A NUL-terminated copy of the input (text parsers take C strings). */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    FUZZ_REQUIRE(s != NULL, "out of memory");
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
