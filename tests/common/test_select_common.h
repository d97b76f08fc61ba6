/*
 * test_select_common.h: what the two selector tests share (test_select.c: ranking, bytes, L2,
 * H2O; test_select_query.c: SnapKV, Quest, attention over a kept set): a one-layer cache of
 * random tokens and the brute force every selector is held to (compute every score, sort
 * everything, take the first k, under the documented total order).
 */
#ifndef TEST_SELECT_COMMON_H
#define TEST_SELECT_COMMON_H

#include "kv_test.h"
#include "kv_test_backend.h"

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kv_select.h"

#include <stdlib.h>
#include <string.h>

/* ---- a one-layer, one-slot cache of n random tokens ---------------------------------------- */

typedef struct {
    kv_config cfg;
    kv_cache c;
    int H, Hkv, d, n;
} cache_case;

/* ints = 1: keys of small integers in {-1, 0, 1}, so norms and dots tie often; ints = 2:
 * keys clustered by page of 16 (a random centre per page and head, noise 0.05), so Quest's
 * bounds are tight and pages differ. */
static inline int make_cache(cache_case *cc, int d, int H, int Hkv, int dtype, int B, int n, int ints,
                             uint64_t seed)
{
    memset(cc, 0, sizeof *cc);
    cc->cfg = kv_test_config_attn(H, Hkv, d, d, n);
    kv_cache_spec s = kv_cache_spec_default(1, n);
    s.quant.dtype = dtype;
    kv_test_spec_paged(&s, B, (n + B - 1) / (B ? B : 1) + 2);
    if (kv_test_cache_open(&cc->c, &cc->cfg, &s, "select case")) return 0;
    kv_rng r;
    kv_rng_seed(&r, seed);
    const size_t m = (size_t)n * Hkv * d;
    float *k = malloc(m * sizeof(float)), *v = malloc(m * sizeof(float)); /* [n][H_kv][d] */
    const size_t pd = (size_t)Hkv * d; /* one token's keys */
    float *centre = malloc(((size_t)n / 16 + 1) * pd * sizeof(float)); /* [pages][H_kv][d] */
    for (size_t i = 0; i < ((size_t)n / 16 + 1) * pd; i++) centre[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < m; i++)
        k[i] = ints == 1   ? (float)((int)(kv_rng_u32(&r) % 3) - 1)
               : ints == 2 ? centre[(i / pd / 16) * pd + i % pd] + kv_rng_uniform(&r, -0.05f, 0.05f)
                           : kv_rng_uniform(&r, -1.0f, 1.0f);
    free(centre);
    for (size_t i = 0; i < m; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    if (kv_test_cache_fill(&cc->c, n, k, v)) return 0;
    cc->H = H;
    cc->Hkv = Hkv;
    cc->d = d;
    cc->n = n;
    return 1;
}

static inline float *rand_floats(size_t n, float amp, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = amp * kv_rng_uniform(&r, -1.0f, 1.0f);
    return x;
}

/* ---- the brute force: sort everything, take the first k ------------------------------------ */

static const double *bf_s; /* the scores qsort's comparator reads */
static int bf_larger, bf_earlier;

static inline int bf_cmp(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    if (bf_s[x] != bf_s[y])
        return bf_larger ? (bf_s[x] > bf_s[y] ? -1 : 1) : (bf_s[x] < bf_s[y] ? -1 : 1);
    return bf_earlier ? (x < y ? -1 : 1) : (x > y ? -1 : 1);
}

/* Indices cand [nc] sorted by score s (indexed by the candidate's value) in the given order;
 * the first k, then sorted ascending, into out; returns how many. */
static inline int bf_pick(const double *s, const int *cand, int nc, int k, int larger, int earlier,
                          int *out)
{
    int *o = malloc((size_t)(nc ? nc : 1) * sizeof(int));
    memcpy(o, cand, (size_t)nc * sizeof(int));
    bf_s = s;
    bf_larger = larger;
    bf_earlier = earlier;
    qsort(o, (size_t)nc, sizeof(int), bf_cmp);
    if (k > nc) k = nc;
    if (k < 0) k = 0;
    /* ascending: mark and sweep */
    int m = 0, maxv = 0;
    for (int i = 0; i < nc; i++)
        if (cand[i] > maxv) maxv = cand[i];
    char *mark = calloc((size_t)maxv + 1, 1);
    for (int i = 0; i < k; i++) mark[o[i]] = 1;
    for (int i = 0; i <= maxv; i++)
        if (mark[i]) out[m++] = i;
    free(mark);
    free(o);
    return m;
}

static inline int same_set(const int *a, int na, const int *b, int nb)
{
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static inline int *iota(int n)
{
    int *x = malloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) x[i] = i;
    return x;
}

#endif
