/* Chapter 06 on the GPU: the windowed device cache against the windowed CPU cache.
 *
 * Predicted before measured:
 *  - the device cache accepts what the CPU cache accepts (a window with fp32, fp16, int8 on
 *    both layouts) and refuses what it refuses (KIVI with a window, fork and prefix adoption
 *    of a windowed slot), with the same buffer size;
 *  - bytes: the same K/V written to both caches through the same waves give the same buffer,
 *    byte for byte, at every checked length (W-1, W, W+1, S+W, S+W+1, k·W+r): the ring row of
 *    each position (kv_window_row()), through a scrambled block table when paged (B 8, 16),
 *    keys as given (before RoPE under KV_POS_CACHE, as kv_forward writes them);
 *  - attention: every kernel (v1, v2, v3) over the windowed cache equals, bit for bit, the
 *    same kernel over plain arrays holding only the retained rows in position order (for
 *    KV_POS_CACHE each key rotated on the host by kv_rope() at its cache index): the kernel
 *    visits the same list, and rotates at read time with the CPU's unfused arithmetic and
 *    table. Against the CPU's kv_attention() it agrees within kv_test.h's fp32 tolerance (the
 *    dot products and sums run in another order on the GPU, as in every GPU-vs-CPU test);
 *  - v3 past one 512-position partition (S+W = 604) the same, and within tolerance of v2;
 *  - one write of more tokens than the ring holds (two land in one ring row): the device keeps
 *    the later token's row, as the CPU's in-order write does, byte for byte;
 *  - the forward pass: kvcu_forward with prefill chunks longer than S+W (waves) equals itself
 *    fed token by token and the paged device cache equals the contiguous one, bit for bit
 *    (per-row arithmetic that does not depend on the batch); its logits are within the fp32
 *    tolerance of kv_forward's at every step
 *    (fp32 caches; a quantized cache can round a key the two devices computed in another
 *    order to a neighbouring code, so there only the GPU's own bitwise properties are held);
 *  - a greedy stream through kvcu_backend_create and kv_backend_cpu on a paged windowed spec
 *    produces the same tokens, its table stopping at ceil((S+W)/B) blocks.
 * Exits 77 (skipped) without a usable device. */
#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_model.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kv_sampler.h"
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

#include <stdlib.h>
#include <string.h>

enum { H = 4, HKV = 2, D = 32, ROT = 16 };

static kv_rng rng;

/* partial rotary: dims ROT .. D-1 are read unrotated */
static kv_config attn_config(void) { return kv_test_config_attn(H, HKV, D, ROT, 1 << 20); }

static kv_cache_spec window_spec(int dtype, int paged, int B, int W, int S, int scheme,
                                 int capacity)
{
    kv_cache_spec s = kv_test_spec_window(dtype, W, S, scheme, capacity);
    if (paged) kv_test_spec_paged(&s, B, (S + W + B - 1) / B + 3);
    return s;
}

/* A device copy of n floats, or NULL (a failed check) */
static float *dev_floats(const float *h, size_t n)
{
    void *d = NULL;
    kv_err e;
    if (kvcu_malloc(&d, n * sizeof(float), &e) || (h && kvcu_upload(d, h, n * sizeof(float), &e))) {
        KV_CHECK(0, "upload of %zu floats: %s", n, e.msg);
        kvcu_free(d);
        return NULL;
    }
    return (float *)d;
}

/* The two caches of one case, the same spec; paged: the same scrambled table on both. */
typedef struct {
    kv_cache cpu;
    kvcu_cache *gpu;
} pair;

static int pair_create(pair *p, const kv_config *cfg, const kv_cache_spec *s, kv_err *e)
{
    memset(p, 0, sizeof *p);
    int rc = kv_cache_create(&p->cpu, cfg, s, e);
    if (!rc) rc = kvcu_cache_create(&p->gpu, cfg, s, e);
    if (!rc && s->layout.kind == KV_LAYOUT_PAGED) {
        int blocks[64];
        for (int i = 0; i < p->cpu.max_blocks; i++) blocks[i] = (s->layout.n_blocks - 1 - i);
        rc = kv_cache_set_blocks(&p->cpu, 0, blocks, p->cpu.max_blocks, e);
        if (!rc) rc = kvcu_cache_set_blocks(p->gpu, 0, blocks, p->cpu.max_blocks, e);
    }
    return rc;
}

static void pair_free(pair *p)
{
    kv_cache_free(&p->cpu);
    kvcu_cache_free(p->gpu);
}

/* 1 when the device buffer equals the CPU's byte for byte; prints the first difference. */
static int same_bytes(const pair *p, const char *what)
{
    kv_err e;
    const size_t n = p->cpu.mem_bytes;
    if (kvcu_cache_mem_bytes(p->gpu) != n) {
        printf("  %s: device buffer %zu bytes, CPU %zu\n", what, kvcu_cache_mem_bytes(p->gpu), n);
        return 0;
    }
    unsigned char *h = malloc(n);
    int ok = h && kvcu_cache_download(p->gpu, h, n, &e) == KV_OK;
    if (ok)
        for (size_t i = 0; i < n; i++)
            if (h[i] != p->cpu.mem[i]) {
                printf("  %s: byte %zu differs (gpu %u, cpu %u)\n", what, i, h[i], p->cpu.mem[i]);
                ok = 0;
                break;
            }
    free(h);
    return ok;
}

/* The retained rows of the query at t, gathered from the CPU cache into plain arrays
 * k, v [HKV][n][D] in position order, keys rotated by kv_rope() at their cache index under
 * KV_POS_CACHE: what the windowed kernels must see. Returns n. */
static int gather(const kv_cache *c, const kv_config *cfg, int t, float *k, float *v)
{
    const int W = c->spec.window.size, S = c->spec.window.n_sinks;
    const int n = (int)kv_window_count(W, S, t);
    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] */
    kv_rope_freqs(cfg, freq);
    for (int h = 0; h < HKV; h++) {
        const kv_head_view kh = kv_cache_view(c, 0, 0, h, KV_QROLE_KEY);
        const kv_head_view vh = kv_cache_view(c, 0, 0, h, KV_QROLE_VALUE);
        for (int i = 0; i < n; i++) {
            const int64_t row = kv_window_row(W, S, kv_window_pos(W, S, t, i));
            float *kr = k + ((size_t)h * n + i) * D;
            kv_attn_row(&kh, row, kr);
            kv_attn_row(&vh, row, v + ((size_t)h * n + i) * D);
            if (c->spec.window.pos_scheme == KV_POS_CACHE)
                kv_rope(kr, &i, 1, 1, D, cfg->rotary_dim, freq);
        }
    }
    return n;
}

/* The attention of query position t, every kernel version: vs the CPU within tolerance, vs
 * the same version over the gathered rows bit for bit. Returns the number of failures. */
static int check_query(pair *p, const kv_config *cfg, int t, const char *what)
{
    kv_err e;
    const int span = p->cpu.spec.window.size + p->cpu.spec.window.n_sinks;
    float q[H * D], ref[H * D], got[H * D], plain[H * D];
    for (int i = 0; i < H * D; i++) q[i] = kv_rng_normal(&rng);
    float *kg = malloc(sizeof(float) * HKV * span * D), *vg = malloc(sizeof(float) * HKV * span * D);
    const int n = gather(&p->cpu, cfg, t, kg, vg);
    int bad = 0;
    float att[1024]; /* one head at a time: no OpenMP team for a few hundred products */
    for (int h = 0; h < H; h++)
        kv_attention_head(&p->cpu, 0, 0, t, h, H, q + h * D, ref + h * D, att);
    /* per-token int8 keys meet the query rounded to 16 bits (kv_attn_int_keys()); the gathered
     * rows are plain floats, so the plain-array kernel is handed the query already rounded */
    float qg[H * D];
    const kv_head_view kh0 = kv_cache_view(&p->cpu, 0, 0, 0, KV_QROLE_KEY);
    for (int h = 0; h < H; h++)
        if (kv_attn_int_keys(&kh0) && !p->cpu.rope_cs)
            kv_attn_query_rounded(q + h * D, D, qg + h * D);
        else
            memcpy(qg + h * D, q + h * D, sizeof(float) * D);
    float *dq = dev_floats(q, H * D), *dqg = dev_floats(qg, H * D);
    float *dout = dev_floats(NULL, H * D);
    float *dk = dev_floats(kg, (size_t)HKV * n * D), *dv = dev_floats(vg, (size_t)HKV * n * D);
    for (int ver = 1; ver <= 3 && dq && dqg && dout && dk && dv; ver++) {
        char tag[200];
        snprintf(tag, sizeof tag, "%s t %d v%d", what, t, ver);
        int rc = kvcu_cache_attention_version(ver, p->gpu, 0, 0, t, dq, dout, NULL, H, &e);
        if (!rc) rc = kvcu_download(got, dout, sizeof got, &e);
        if (!rc) rc = kvcu_attn_decode_version(ver, dqg, dk, dv, dout, NULL, H, HKV, D, n, n, &e);
        if (!rc) rc = kvcu_download(plain, dout, sizeof plain, &e);
        if (rc) {
            printf("  %s: %s\n", tag, e.msg);
            bad++;
            continue;
        }
        if (kv_test_compare(tag, got, ref, H * D, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL)) bad++;
        if (memcmp(got, plain, sizeof got)) {
            printf("  %s: windowed kernel differs from the same kernel over the %d retained "
                   "rows\n", tag, n);
            bad++;
        }
    }
    if (!dq || !dqg || !dout || !dk || !dv) bad++;
    kvcu_free(dq);
    kvcu_free(dqg);
    kvcu_free(dout);
    kvcu_free(dk);
    kvcu_free(dv);
    free(kg);
    free(vg);
    return bad;
}

/* One case: a stream of K/V rows written to both caches in chunks that end at each checked
 * length (no chunk longer than W past the first S+W rows, so its rows are distinct), then
 * bytes and the attention of the last query compared. */
static void check_case(int fmt, int paged, int B, int W, int S, int scheme, const int *lens,
                       int n_lens)
{
    const kv_config cfg = attn_config();
    kv_err e;
    char what[160];
    snprintf(what, sizeof what, "%s %s%s%s W %d S %d %s", kv_quant_name(fmt),
             paged ? "paged" : "contiguous", paged ? " B " : "", paged ? (B == 8 ? "8" : "16") : "",
             W, S, kv_window_scheme_name(scheme));
    const kv_cache_spec s = window_spec(fmt, paged, B, W, S, scheme, 1 << 20);
    pair p;
    if (pair_create(&p, &cfg, &s, &e)) {
        KV_CHECK(0, "%s: caches: %s", what, e.msg);
        pair_free(&p);
        return;
    }
    const int n_max = lens[n_lens - 1], keep = S + W;
    float *k = malloc(sizeof(float) * (size_t)n_max * HKV * D); /* [n][Hkv][d] */
    float *v = malloc(sizeof(float) * (size_t)n_max * HKV * D);
    for (long i = 0; i < (long)n_max * HKV * D; i++) {
        k[i] = kv_rng_normal(&rng);
        v[i] = kv_rng_normal(&rng);
    }
    float *dk = dev_floats(k, (size_t)n_max * HKV * D), *dv = dev_floats(v, (size_t)n_max * HKV * D);
    int bytes_ok = 1, attn_bad = 0, pos = 0;
    for (int li = 0; li < n_lens && dk && dv; li++) {
        while (pos < lens[li]) {
            int m = lens[li] - pos;
            if (pos + m > keep) m = pos < keep ? keep - pos : (m > W ? W : m);
            const size_t off = (size_t)pos * HKV * D;
            int rc = kv_cache_write_seq(&p.cpu, 0, 0, pos, m, k + off, v + off, &e);
            if (!rc) rc = kvcu_cache_write_seq(p.gpu, 0, 0, pos, m, dk + off, dv + off, &e);
            if (rc) {
                KV_CHECK(0, "%s: write at %d: %s", what, pos, e.msg);
                goto done;
            }
            pos += m;
        }
        bytes_ok &= same_bytes(&p, what);
        attn_bad += check_query(&p, &cfg, lens[li] - 1, what);
    }
    KV_CHECK(bytes_ok, "%s: device cache bytes == CPU cache bytes at every length", what);
    KV_CHECK(attn_bad == 0, "%s: attention v1/v2/v3 == the kernels over the retained rows (bits) "
             "and == the CPU (fp32 tolerance): %d failures", what, attn_bad);
done:
    kvcu_free(dk);
    kvcu_free(dv);
    free(k);
    free(v);
    pair_free(&p);
}

static void test_grid(void)
{
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    const int shapes[][2] = {{5, 0}, {5, 4}, {8, 0}, {8, 4}}; /* W, S */
    const int layouts[][2] = {{0, 0}, {1, 8}, {1, 16}};       /* paged, B */
    for (int si = 0; si < 4; si++) {
        const int W = shapes[si][0], S = shapes[si][1];
        /* W-1, W, W+1, S+W, S+W+1, k·W+r: lengths on and off every boundary */
        int lens[8], n = 0;
        const int cand[] = {W - 1, W, W + 1, S + W, S + W + 1, 2 * W + S + 3, 4 * W + S + 2};
        for (int i = 0; i < 7; i++)
            if (cand[i] >= 1 && (n == 0 || cand[i] > lens[n - 1])) lens[n++] = cand[i];
        for (int f = 0; f < 3; f++)
            for (int li = 0; li < 3; li++)
                for (int scheme = 0; scheme < 2; scheme++) {
                    /* quantized formats: one block size per shape, alternating (time) */
                    if (f > 0 && li > 0 && li != 1 + si % 2) continue;
                    check_case(fmts[f], layouts[li][0], layouts[li][1], W, S, scheme, lens, n);
                }
    }
    /* v3 past one partition: S+W = 604 retained positions, two partitions of 512 */
    const int lens[] = {300, 603, 604, 605, 1300};
    check_case(KV_QF_F32, 0, 0, 600, 4, KV_POS_CACHE, lens, 5);
    check_case(KV_QF_INT8, 1, 16, 600, 4, KV_POS_ORIGINAL, lens, 5);
}

/* One write of more tokens than the window holds: positions p and p + W of the launch share a
 * ring row. The CPU writes in order, so the later token's row (its codes and, for int8, its
 * scales) is what stays; the device skips the superseded token instead of letting two blocks
 * race for the row, and holds the same bytes. */
static void test_wide_write(void)
{
    const kv_config cfg = attn_config();
    const int W = 5, S = 2, n = 3 * W + S + 2;
    const int fmts[] = {KV_QF_F32, KV_QF_INT8};
    float *k = malloc(sizeof(float) * (size_t)n * HKV * D), *v = malloc(sizeof(float) * (size_t)n * HKV * D);
    for (long i = 0; i < (long)n * HKV * D; i++) {
        k[i] = kv_rng_normal(&rng);
        v[i] = kv_rng_normal(&rng);
    }
    float *dk = dev_floats(k, (size_t)n * HKV * D), *dv = dev_floats(v, (size_t)n * HKV * D);
    for (int f = 0; f < 2 && dk && dv; f++)
        for (int paged = 0; paged < 2; paged++) {
            const kv_cache_spec s = window_spec(fmts[f], paged, 4, W, S, KV_POS_ORIGINAL, 64);
            kv_err e;
            pair p;
            int rc = pair_create(&p, &cfg, &s, &e);
            if (!rc) rc = kv_cache_write_seq(&p.cpu, 0, 0, 0, n, k, v, &e);
            if (!rc) rc = kvcu_cache_write_seq(p.gpu, 0, 0, 0, n, dk, dv, &e);
            KV_CHECK(!rc && same_bytes(&p, "one write past the window"),
                     "%s %s: %d tokens in one write through a ring of %d + %d sinks: device "
                     "bytes == CPU bytes (%s)", kv_quant_name(fmts[f]),
                     paged ? "paged" : "contiguous", n, W, S, rc ? e.msg : "ok");
            pair_free(&p);
        }
    kvcu_free(dk);
    kvcu_free(dv);
    free(k);
    free(v);
}

/* Specs and refusals: the device takes what the CPU takes, refuses what it refuses. */
static void test_specs(void)
{
    const kv_config cfg = attn_config();
    kv_err e;
    kv_cache c;
    kvcu_cache *g = NULL;
    kv_cache_spec s = window_spec(KV_QF_F16, 0, 0, 100, 4, KV_POS_CACHE, 1 << 22);
    int rc = kv_cache_create(&c, &cfg, &s, &e);
    if (!rc) rc = kvcu_cache_create(&g, &cfg, &s, &e);
    KV_CHECK(!rc && kvcu_cache_mem_bytes(g) == c.mem_bytes,
             "windowed device cache of S+W rows (4M positions): %zu bytes, CPU %zu (%s)",
             kvcu_cache_mem_bytes(g), c.mem_bytes, rc ? e.msg : "");
    kvcu_cache_free(g);
    kv_cache_free(&c);
    g = NULL;
    s.quant.dtype = KV_QF_INT4_KIVI;
    KV_CHECK(kvcu_cache_create(&g, &cfg, &s, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "int4"),
             "KIVI + window refused on the device, named: %s", e.msg);
    kvcu_cache_free(g);
    g = NULL;
    kv_cache_spec p = window_spec(KV_QF_F16, 1, 8, 16, 4, KV_POS_ORIGINAL, 4096);
    p.n_slots = 2;
    if (kvcu_cache_create(&g, &cfg, &p, &e) == KV_OK) {
        KV_CHECK(kvcu_cache_fork_slot(g, 1, 0, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "window"),
                 "fork of a windowed slot refused: %s", e.msg);
        KV_CHECK(kvcu_cache_set_length(g, 1, 8, &e) == KV_ERR_UNSUPPORTED,
                 "prefix adoption by a windowed slot refused: %s", e.msg);
        int blocks[3] = {0, 1, 2};
        KV_CHECK(kvcu_cache_set_blocks(g, 0, blocks, 3, &e) == KV_OK,
                 "a windowed slot maps ceil((S+W)/B) = 3 blocks: %s", e.msg);
        KV_CHECK(kvcu_cache_set_blocks(g, 0, blocks, 4, &e) == KV_ERR_ARG,
                 "and no more: %s", e.msg);
    } else {
        KV_CHECK(0, "paged windowed device cache: %s", e.msg);
    }
    kvcu_cache_free(g);
}

/* ---- the forward pass -------------------------------------------------------------------- */

static kv_config model_config(void)
{
    kv_config c = kv_test_config(2, 4, 2, 16, 1 << 20);
    c.hidden_dim = 96;
    c.vocab_size = 128;
    c.rotary_dim = 16;
    c.tied_classifier = 1;
    return c;
}

/* Feed tok[0..n) in steps of steps[] (cycled) through kvcu_forward on a fresh cache; the
 * logits of every step's last token into out [n][V] at that token's index. */
static int gpu_stream(const kvcu_model *gm, const kv_config *cfg, const kv_cache_spec *s,
                      const int *tok, int n, const int *steps, int n_steps, float *out, kv_err *e)
{
    kvcu_cache *c = NULL;
    kvcu_state *st = NULL;
    int rc = kvcu_cache_create(&c, cfg, s, e);
    if (!rc) rc = kvcu_state_create(&st, e);
    if (!rc && s->layout.kind == KV_LAYOUT_PAGED) {
        const int nb =
            (s->window.size + s->window.n_sinks + s->layout.block_size - 1) / s->layout.block_size;
        int blocks[64];
        for (int i = 0; i < nb; i++) blocks[i] = s->layout.n_blocks - 1 - i; /* scrambled */
        rc = kvcu_cache_set_blocks(c, 0, blocks, nb, e);
    }
    for (int pos = 0, k = 0; !rc && pos < n;) {
        int m = steps[k++ % n_steps];
        if (m > n - pos) m = n - pos;
        kv_seq q = {0, pos, m, tok + pos};
        rc = kvcu_forward(gm, c, st, &q, 1, out + (size_t)(pos + m - 1) * cfg->vocab_size, NULL, e);
        pos += m;
    }
    kvcu_state_free(st);
    kvcu_cache_free(c);
    return rc;
}

/* The same on the CPU (kv_forward over a kv_cache). */
static int cpu_stream(const kv_model *m, const kv_cache_spec *s, const int *tok, int n,
                      const int *steps, int n_steps, float *out, kv_err *e)
{
    kv_cache c;
    kv_state st;
    kv_state_init(&st);
    int rc = kv_cache_create(&c, &m->config, s, e);
    for (int pos = 0, k = 0; !rc && pos < n;) {
        int mm = steps[k++ % n_steps];
        if (mm > n - pos) mm = n - pos;
        kv_seq q = {0, pos, mm, tok + pos};
        rc = kv_forward(m, &c, &st, &q, 1, out + (size_t)(pos + mm - 1) * m->config.vocab_size,
                        NULL, e);
        pos += mm;
    }
    kv_state_free(&st);
    kv_cache_free(&c);
    return rc;
}

static void test_forward(void)
{
    kv_config cfg = model_config();
    kv_model m;
    kv_err e;
    kvcu_model *gm = NULL;
    if (kv_model_alloc(&m, &cfg, &e)) {
        KV_CHECK(0, "model: %s", e.msg);
        return;
    }
    kv_model_randomize(&m, 616);
    if (kvcu_model_upload(&gm, &m, &e)) {
        KV_CHECK(0, "model upload: %s", e.msg);
        kv_model_free(&m);
        return;
    }
    enum { N = 30, W = 8, S = 4 };
    const int V = cfg.vocab_size;
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int)(kv_rng_u32(&rng) % (uint32_t)V);
    /* the first step is longer than S+W = 12: written and attended in waves */
    const int chunked[] = {20, 1, 5, 1, 3}, single[] = {1};
    /* the steps' last tokens: the logits compared at each */
    int ends[N], n_ends = 0;
    for (int pos = 0, k = 0; pos < N; k++) {
        int mm = chunked[k % 5];
        if (mm > N - pos) mm = N - pos;
        pos += mm;
        ends[n_ends++] = pos - 1;
    }
    float *lc = calloc((size_t)N * V, sizeof(float)), *lg = calloc((size_t)N * V, sizeof(float));
    float *lt = calloc((size_t)N * V, sizeof(float)), *lp = calloc((size_t)N * V, sizeof(float));
    /* CPU vs GPU logits are compared on fp32 caches only: a quantized cache rounds keys that
     * the two devices computed in another summation order, and one of them landing on the
     * neighbouring fp16 / int8 code moves the logits by far more than the fp32 tolerance is
     * for. The quantized rounding itself is compared bit for bit in test_grid() (same rows
     * in, same bytes out); here quantized caches are held to the GPU's own bitwise
     * properties (waves, paged) under the scheme that exercises the most (cache positions). */
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    for (int scheme = 0; scheme < 2; scheme++)
        for (int f = 0; f < 3; f++) {
            if (fmts[f] != KV_QF_F32 && scheme != KV_POS_CACHE) continue;
            const int vs_cpu = fmts[f] == KV_QF_F32;
            char what[96];
            snprintf(what, sizeof what, "engine %s W %d S %d %s", kv_quant_name(fmts[f]), W, S,
                     kv_window_scheme_name(scheme));
            kv_cache_spec sc = window_spec(fmts[f], 0, 0, W, S, scheme, 1 << 20);
            kv_cache_spec sp = window_spec(fmts[f], 1, 8, W, S, scheme, 1 << 20);
            /* emulation time: fp16 skips the token-by-token run, int8 the paged one */
            const int do_paged = fmts[f] != KV_QF_INT8, do_single = fmts[f] != KV_QF_F16;
            int rc = vs_cpu ? cpu_stream(&m, &sc, tok, N, chunked, 5, lc, &e) : KV_OK;
            if (!rc) rc = gpu_stream(gm, &cfg, &sc, tok, N, chunked, 5, lg, &e);
            if (!rc && do_paged) rc = gpu_stream(gm, &cfg, &sp, tok, N, chunked, 5, lp, &e);
            if (!rc && do_single) rc = gpu_stream(gm, &cfg, &sc, tok, N, single, 1, lt, &e);
            KV_CHECK(rc == KV_OK, "%s: runs: %s", what, rc ? e.msg : "");
            if (rc) continue;
            long bad = 0;
            int bits_p = 1, bits_t = 1;
            for (int i = 0; i < n_ends; i++) {
                const size_t o = (size_t)ends[i] * V;
                if (vs_cpu)
                    bad += kv_test_compare(what, lg + o, lc + o, V, KV_TOL_F32_ATOL,
                                           KV_TOL_F32_RTOL);
                bits_p &= !do_paged || !memcmp(lp + o, lg + o, sizeof(float) * V);
                bits_t &= !do_single || !memcmp(lt + o, lg + o, sizeof(float) * V);
            }
            if (vs_cpu)
                KV_CHECK(bad == 0, "%s: GPU logits within the fp32 tolerance of the CPU's at "
                         "every step", what);
            if (do_paged)
                KV_CHECK(bits_p, "%s: paged (B 8) == contiguous on the GPU, bit for bit", what);
            if (do_single)
                KV_CHECK(bits_t, "%s: chunked prefill (waves) == token by token on the GPU, "
                         "bit for bit", what);
        }
    free(lc);
    free(lg);
    free(lt);
    free(lp);
    kvcu_model_free(gm);

    /* a greedy stream through the backends, paged, with the table bounded by the window */
    kv_cache_spec sp = window_spec(KV_QF_F32, 1, 16, 24, 4, KV_POS_CACHE, 1 << 20);
    sp.layout.n_blocks = 8;
    kv_backend *bc = NULL, *bg = NULL;
    if (kv_backend_cpu(&bc, &m, &sp, &e) || kvcu_backend_create(&bg, &m, &sp, &e)) {
        KV_CHECK(0, "backends: %s", e.msg);
    } else {
        float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
        enum { PROMPT = 31, GEN = 16 }; /* the prompt passes S+W = 28: waves */
        int prompt[PROMPT], ta = 0, tb = 0, same = 1, close = 1, rc = KV_OK;
        for (int i = 0; i < PROMPT; i++) prompt[i] = (int)(kv_rng_u32(&rng) % (uint32_t)V);
        kv_seq q = {0, 0, PROMPT, prompt};
        rc = bc->forward(bc, &q, 1, a, NULL, &e);
        if (!rc) rc = bg->forward(bg, &q, 1, b, NULL, &e);
        for (int step = 0; step < GEN && !rc; step++) {
            close &= kv_test_compare("backend stream", b, a, V, KV_TOL_F32_ATOL,
                                     KV_TOL_F32_RTOL) == 0;
            ta = kv_argmax(a, V);
            tb = kv_argmax(b, V);
            same &= ta == tb;
            kv_seq qa = {0, PROMPT + step, 1, &ta}, qb = {0, PROMPT + step, 1, &tb};
            rc = bc->forward(bc, &qa, 1, a, NULL, &e);
            if (!rc) rc = bg->forward(bg, &qb, 1, b, NULL, &e);
        }
        KV_CHECK(rc == KV_OK && same && close, "backend stream (fp32 paged B 16, W 24 S 4, "
                 "cache positions): %d greedy tokens after a %d-token prompt, CUDA == CPU, "
                 "logits within the fp32 tolerance (%s)", GEN, PROMPT, rc ? e.msg : "");
        KV_CHECK(bg->mem && bg->mem->paged->pool.n_used == 2 && bg->length(bg, 0) == PROMPT + GEN,
                 "the CUDA backend's table stopped at ceil((S+W)/B) = 2 blocks (%d used, %d "
                 "positions)", bg->mem ? bg->mem->paged->pool.n_used : -1, bg->length(bg, 0));
        free(a);
        free(b);
    }
    kv_backend_destroy(bc);
    kv_backend_destroy(bg);
    kv_model_free(&m);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_rng_seed(&rng, 6060);
    const double t0 = kv_now();
    test_specs();
    test_grid();
    test_wide_write();
    const double t1 = kv_now();
    test_forward();
    printf("test_gpu_window: %.1f s (caches and kernels %.1f s, engine %.1f s)\n",
           kv_now() - t0, t1 - t0, kv_now() - t1);
    return kv_test_finish();
}
