/* Measuring the machine for the benchmarks (kv_bench.h): its last-level cache and read
 * bandwidth, and the weight bytes of one decode token. */
#include "kv_bench.h"
#include "kv_rng.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parse "32768K" / "1M" / "512" from a sysfs size file. */
static int64_t read_size_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = {0};
    int64_t v = 0;
    if (fgets(buf, sizeof buf, f)) {
        char *end = NULL;
        v = strtoll(buf, &end, 10);
        if (end && (*end == 'K' || *end == 'k')) v <<= 10;
        else if (end && (*end == 'M' || *end == 'm')) v <<= 20;
    }
    fclose(f);
    return v > 0 ? v : 0;
}

static int read_int_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int v = -1;
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    return v;
}

int64_t kv_llc_bytes(int *level, const char **source)
{
    /* sysfs lists cpu0's caches as index0..N; the last-level one has the largest level.
     * (glibc's sysconf answer for L3 is on some virtual machines the sum over all of the
     * host's cache dies, so sysfs comes first.) */
    int64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], type[32] = {0};
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        int ok = fgets(type, sizeof type, f) != NULL;
        fclose(f);
        if (!ok || strncmp(type, "Instruction", 11) == 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        const int lv = read_int_file(path);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        const int64_t sz = read_size_file(path);
        if (lv > best_level && sz > 0) best_level = lv, best = sz;
    }
    const char *src = "sysfs";
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    if (best == 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (l3 > 0) best = l3, best_level = 3, src = "sysconf";
        else if (l2 > 0) best = l2, best_level = 2, src = "sysconf";
    }
#endif
    if (best == 0) src = "unknown";
    if (level) *level = best_level;
    if (source) *source = src;
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Wide loads: the in-order sum as eight independent 64-bit lanes, which the compiler turns
 * into vector loads and adds; GCC on x86-64 also builds an AVX2 clone (32-byte loads) that the
 * loader picks where the CPU has it. Integer adds: any order gives the same sum. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
static uint64_t sum_words(const uint64_t *p, size_t n)
{
    uint64_t acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += p[i + l];
    for (; i < n; i++) acc[0] += p[i];
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

int kv_read_bandwidth(kv_bandwidth *out, size_t buffer_bytes, int repeats, kv_err *err)
{
    return kv_read_bandwidth_chunks(out, buffer_bytes, 0, repeats, err);
}

int kv_read_bandwidth_chunks(kv_bandwidth *out, size_t buffer_bytes, size_t chunk_bytes,
                             int repeats, kv_err *err)
{
    memset(out, 0, sizeof *out);
    if (repeats <= 0) repeats = 7;
    if (repeats > 64) repeats = 64;
    if (buffer_bytes == 0) {
        const int64_t llc = kv_llc_bytes(NULL, NULL);
        buffer_bytes = (size_t)8 * (size_t)(llc > 0 ? llc : 0);
        if (buffer_bytes < ((size_t)256 << 20)) buffer_bytes = (size_t)256 << 20;
        if (buffer_bytes > ((size_t)1 << 30)) buffer_bytes = (size_t)1 << 30;
    }
    if (chunk_bytes % sizeof(uint64_t) || chunk_bytes > buffer_bytes)
        return kv_fail(err, KV_ERR_ARG, "bandwidth: chunks of %zu bytes (a multiple of 8, at "
                       "most the %zu-byte buffer)", chunk_bytes, buffer_bytes);
    const size_t cw = chunk_bytes / sizeof(uint64_t);          /* words per chunk, 0: in order */
    const size_t nc = cw ? buffer_bytes / chunk_bytes : 0;     /* chunks */
    const size_t n = cw ? nc * cw : buffer_bytes / sizeof(uint64_t);
    uint64_t *x = kv_calloc(n * sizeof *x); /* [n] */
    size_t *order = cw ? kv_calloc(nc * sizeof *order) : NULL; /* [nc] chunk read i-th */
    if (!x || (cw && !order)) {
        kv_free(x);
        return kv_fail(err, KV_ERR_NOMEM, "bandwidth: could not allocate %.0f MiB",
                       (double)buffer_bytes / 1048576.0);
    }
    /* first touch by the same static split the in-order sums use: each thread reads pages
     * it wrote */
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = i & 7;
    if (cw) { /* Fisher-Yates with a fixed seed: the same scatter in every run */
        kv_rng rng;
        kv_rng_seed(&rng, 4096);
        for (size_t i = 0; i < nc; i++) order[i] = i;
        for (size_t i = nc - 1; i > 0; i--) {
            const size_t j = (size_t)(((uint64_t)kv_rng_u32(&rng) << 32 | kv_rng_u32(&rng)) %
                                      (i + 1));
            const size_t tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
    }
    double t[64];
    volatile uint64_t sink = 0; /* keeps the sums alive */
    for (int r = -1; r < repeats; r++) { /* r = -1: warm-up (page tables, clocks) */
        const double t0 = kv_now();
        uint64_t s = 0;
        if (cw) {
            #pragma omp parallel for schedule(static) reduction(+ : s)
            for (size_t c = 0; c < nc; c++) {
                if (c + 1 < nc) { /* the next chunk asked for while this one is summed, as a
                                   * careful reader of scattered blocks does (kv_attention_avx2.c) */
                    const char *next = (const char *)(x + order[c + 1] * cw);
                    for (size_t o = 0; o < chunk_bytes; o += 64) __builtin_prefetch(next + o);
                }
                const uint64_t *p = x + order[c] * cw;
                for (size_t i = 0; i < cw; i++) s += p[i];
            }
        } else { /* each thread its contiguous share (the first touch's static split) */
            #pragma omp parallel reduction(+ : s)
            {
                const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
                const size_t lo = n * id / nt, hi = n * (id + 1) / nt;
                s += sum_words(x + lo, hi - lo);
            }
        }
        const double dt = kv_now() - t0;
        sink += s;
        if (r >= 0) t[r] = dt;
    }
    (void)sink;
    kv_free(x);
    kv_free(order);
    qsort(t, (size_t)repeats, sizeof t[0], cmp_double);
    const double med = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    const double bytes = (double)(n * sizeof(uint64_t));
    out->bytes_per_s = bytes / med;
    out->min = bytes / t[repeats - 1];
    out->max = bytes / t[0];
    out->buffer_bytes = bytes;
    out->threads = omp_get_max_threads();
    out->repeats = repeats;
    return KV_OK;
}

double kv_decode_weight_bytes(const kv_config *c)
{
    const double L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads;
    const double d = kv_config_head_dim(c), dim = c->dim, hidden = c->hidden_dim;
    const double P = L * (dim * H * d + 2.0 * dim * Hkv * d + H * d * dim + 3.0 * dim * hidden);
    return 4.0 * (P + dim * c->vocab_size + dim + (2.0 * L + 1.0) * dim);
}
