/* Chapter 05 on the CPU: the paged cache holds the same numbers as the contiguous one.
 *
 * Predicted before measured: paging changes where a row lives, never how it is computed, so
 * every check of logits below is bit for bit (memcmp), for every storage format:
 *  - paged ≡ contiguous: a batch of three sequences, chunked prefills mixed with decode steps,
 *    through kv_backend_cpu, block sizes 8/16/32, physical blocks handed out in a scrambled
 *    order so block tables are far from the identity;
 *  - kv_cache_copy_blocks moves one block's bytes (all layers, K and V, codes and metadata)
 *    and no other byte;
 *  - fork + copy-on-write: parent and child continue differently, each equals its solo run;
 *  - prefix caching: a hit skips the shared blocks and changes no logit; fp8 and KIVI refuse;
 *  - pool exhaustion refuses a step whole (nothing changes) and names the numbers;
 *  - bad input to the paged calls is refused with KV_ERR_ARG.
 * After every run all slots are reset and the pool must hold no referenced block. */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"

#include "kv_backend.h"
#include "kv_needle.h"
#include "kv_quant.h"
#include "kv_rng.h"

#include <string.h>

#define N_SLOTS 3
#define CAP 96
#define MAX_STEPS 32

/* ---- models: tiny and tiny-gqa (d = 16), and d = 128 twins for the formats whose groups
 * need a wider head (int8-g32/64/128: d a multiple of the group; KIVI: 32 | d) ---------- */

static int make_model(kv_model *m, const char *name, int wide, kv_err *e)
{
    kv_config c;
    uint64_t seed;
    int rc = kv_config_default_by_name(name, &c, &seed, e);
    if (rc) return rc;
    if (wide) { /* two query heads of d = 128; tiny-gqa keeps G = 2 (one kv head) */
        c.n_kv_heads = c.n_kv_heads == c.n_heads ? 2 : 1;
        c.n_heads = 2;
        c.dim = 256;
        c.rotary_dim = 128;
    }
    rc = kv_model_alloc(m, &c, e);
    if (!rc) kv_model_randomize(m, seed + (uint64_t)wide);
    return rc;
}

/* ---- the schedule: three sequences, chunked prefills, decode steps, a late chunk ------------ */

typedef struct {
    int n[N_SLOTS]; /* tokens each slot adds this step; 0 = not in the step */
} step_t;

static step_t SCHED[MAX_STEPS];
static int n_sched;
static int TOK[N_SLOTS][CAP]; /* the tokens each slot is fed, teacher-forced */

static void build_schedule(void)
{
    const step_t first = {{21, 9, 0}}, second = {{40, 35, 50}}, dec = {{1, 1, 1}},
                 late = {{1, 17, 1}};
    n_sched = 0;
    SCHED[n_sched++] = first;
    SCHED[n_sched++] = second;
    for (int i = 0; i < 12; i++) SCHED[n_sched++] = dec;
    SCHED[n_sched++] = late;
    for (int i = 0; i < 6; i++) SCHED[n_sched++] = dec; /* lengths 80, 79, 69 */
    kv_rng r;
    kv_rng_seed(&r, 505);
    for (int s = 0; s < N_SLOTS; s++)
        for (int t = 0; t < CAP; t++) TOK[s][t] = 1 + (int)(kv_rng_u32(&r) % 500);
}

/* Run the schedule; logits [n_sched][N_SLOTS][vocab] (rows of absent slots stay 0). */
static int run_schedule(kv_backend *b, float *logits, kv_err *e)
{
    const int V = b->config->vocab_size;
    int pos[N_SLOTS] = {0};
    for (int st = 0; st < n_sched; st++) {
        kv_seq q[N_SLOTS];
        int n = 0;
        for (int s = 0; s < N_SLOTS; s++)
            if (SCHED[st].n[s]) {
                q[n] = (kv_seq){s, pos[s], SCHED[st].n[s], TOK[s] + pos[s]};
                pos[s] += SCHED[st].n[s];
                n++;
            }
        int rc = b->forward(b, q, n, logits + (size_t)st * N_SLOTS * V, NULL, e);
        if (rc) return rc;
    }
    return KV_OK;
}

/* 1 when some slot's table is not a run of consecutive ids. */
static int scrambled(const kv_backend *b)
{
    for (int s = 0; s < b->mem->paged->n_slots; s++) {
        const kv_block_table *t = &b->mem->paged->tables[s];
        for (int i = 1; i < t->n_blocks; i++)
            if (t->blocks[i] != t->blocks[i - 1] + 1) return 1;
    }
    return 0;
}

/* Reset every slot, then: no block referenced, the pool consistent. */
static void check_released(kv_backend *b, const char *what)
{
    for (int s = 0; s < b->spec.n_slots; s++) b->reset(b, s);
    kv_err e;
    int leaked[4];
    int n = kv_pool_check_leaks(&b->mem->paged->pool, leaked, 4);
    KV_CHECK(n == 0, "%s: %d blocks still referenced after reset (first %d)", what, n, leaked[0]);
    KV_CHECK(kv_pool_validate(&b->mem->paged->pool, &e) == KV_OK, "%s: pool: %s", what, e.msg);
}

static kv_cache_spec paged(kv_cache_spec s, int B, int extra)
{
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = B;
    s.layout.n_blocks = s.n_slots * ((s.capacity + B - 1) / B) + extra;
    return s;
}

/* ---- paged ≡ contiguous ------------------------------------------------------------------ */

static void check_equivalence(const char *model_name, const kv_model *m, const char *variant)
{
    kv_err e;
    kv_cache_spec cs;
    if (kv_needle_cache_spec(variant, N_SLOTS, CAP, &cs, &e)) {
        KV_CHECK(0, "%s: %s", variant, e.msg);
        return;
    }
    const int V = m->config.vocab_size;
    const size_t n_logits = (size_t)n_sched * N_SLOTS * V;
    float *ref = calloc(n_logits, sizeof(float)), *got = calloc(n_logits, sizeof(float));
    kv_backend *b = NULL;
    int rc = kv_backend_cpu(&b, m, &cs, &e);
    if (!rc) rc = run_schedule(b, ref, &e);
    kv_backend_destroy(b);
    KV_CHECK(rc == KV_OK, "%s %s contiguous: %s", model_name, variant, e.msg);
    const int kivi = kvq_is_kivi(cs.quant.dtype);
    const int Bs[3] = {8, 16, 32};
    for (int bi = kivi ? 2 : 0; bi < 3 && !rc; bi++) {
        kv_cache_spec ps = paged(cs, Bs[bi], 5);
        int rc2 = kv_backend_cpu(&b, m, &ps, &e);
        KV_CHECK(rc2 == KV_OK, "%s %s paged B=%d: %s", model_name, variant, Bs[bi], e.msg);
        if (rc2) continue;
        kv_test_pool_shuffle(&b->mem->paged->pool, 77 + (uint64_t)bi);
        memset(got, 0, n_logits * sizeof(float));
        rc2 = run_schedule(b, got, &e);
        KV_CHECK(rc2 == KV_OK, "%s %s paged B=%d run: %s", model_name, variant, Bs[bi], e.msg);
        int bad_steps = 0, first_bad = -1;
        for (int st = 0; st < n_sched && !rc2; st++)
            if (memcmp(got + (size_t)st * N_SLOTS * V, ref + (size_t)st * N_SLOTS * V,
                       (size_t)N_SLOTS * V * sizeof(float))) {
                if (first_bad < 0) first_bad = st;
                bad_steps++;
            }
        KV_CHECK(!rc2 && bad_steps == 0, "%s %s: paged B=%d logits differ from contiguous in %d "
                 "of %d steps (first: step %d)", model_name, variant, Bs[bi], bad_steps, n_sched,
                 first_bad);
        KV_CHECK(scrambled(b), "%s %s B=%d: tables came out monotonic; the mapping was not "
                 "exercised", model_name, variant, Bs[bi]);
        char what[96];
        snprintf(what, sizeof what, "%s %s B=%d", model_name, variant, Bs[bi]);
        check_released(b, what);
        kv_backend_destroy(b);
        b = NULL;
    }
    if (kivi) { /* a KIVI key group spans 32 tokens: a 16-token block would split it */
        kv_cache_spec ps = paged(cs, 16, 0);
        rc = kv_backend_cpu(&b, m, &ps, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "multiple of 32") &&
                     strstr(e.msg, "16"), "%s paged B=16 not refused with its reason: rc %d, '%s'",
                 variant, rc, rc ? e.msg : "");
        kv_backend_destroy(rc ? NULL : b);
    }
    free(ref);
    free(got);
}

/* ---- kv_cache_copy_blocks --------------------------------------------------------------- */

static void check_copy_blocks(const kv_config *cfg, const char *variant)
{
    kv_err e;
    kv_cache_spec s;
    if (kv_needle_cache_spec(variant, 2, 64, &s, &e)) {
        KV_CHECK(0, "%s: %s", variant, e.msg);
        return;
    }
    const int B = kvq_is_kivi(s.quant.dtype) ? 32 : 16, N = 6, d = kv_config_head_dim(cfg);
    s = paged(s, B, 0);
    s.layout.n_blocks = N;
    kv_cache c;
    if (kv_cache_create(&c, cfg, &s, &e)) {
        KV_CHECK(0, "copy_blocks %s: %s", variant, e.msg);
        return;
    }
    /* every byte random, so a byte copied from the wrong place shows */
    kv_rng r;
    kv_rng_seed(&r, 99);
    for (size_t i = 0; i < c.mem_bytes; i++) c.mem[i] = (uint8_t)kv_rng_u32(&r);
    uint8_t *before = malloc(c.mem_bytes), *expect = malloc(c.mem_bytes);
    memcpy(before, c.mem, c.mem_bytes);
    memcpy(expect, c.mem, c.mem_bytes);
    const int src = 4, dst = 1;
    /* the expected bytes, from the layout: codes [H_kv][N·B][row_bytes], metadata
     * [H_kv][meta_entries] with the entries of rows r0 .. r0+B-1 from kvq_meta_index */
    for (int l = 0; l < c.n_layers; l++)
        for (int i = 0; i < c.n_planes; i++) {
            const kv_cache_plane *p = kv_cache_plane_of(c.planes, c.n_layers, i, l);
            const int qr = p->role, f = c.fmt[l];
            for (int h = 0; h < c.n_kv_heads; h++) {
                const size_t codes = (size_t)(p->codes - c.mem) + (size_t)h * c.rows * p->row_bytes;
                memcpy(expect + codes + (size_t)dst * B * p->row_bytes,
                       before + codes + (size_t)src * B * p->row_bytes, (size_t)B * p->row_bytes);
                if (!p->meta) continue;
                const size_t meta = (size_t)((uint8_t *)p->meta - c.mem) + (size_t)h * p->meta_entries * 4;
                const int64_t m0 = kvq_meta_index(f, qr, (int64_t)src * B, 0, d),
                              m1 = kvq_meta_index(f, qr, (int64_t)dst * B, 0, d),
                              mn = kvq_meta_index(f, qr, (int64_t)src * B + B, 0, d) - m0;
                memcpy(expect + meta + m1 * 4, before + meta + m0 * 4, (size_t)mn * 4);
            }
        }
    kv_block_copy pair = {src, dst};
    KV_CHECK(kv_cache_copy_blocks(&c, &pair, 1, &e) == KV_OK, "copy_blocks %s: %s", variant, e.msg);
    size_t wrong = 0, changed = 0, first = 0;
    for (size_t i = 0; i < c.mem_bytes; i++) {
        changed += c.mem[i] != before[i];
        if (c.mem[i] != expect[i] && !wrong++) first = i;
    }
    KV_CHECK(wrong == 0 && changed > 0, "copy_blocks %s: %zu bytes differ from the expected "
             "copy (first at byte %zu), %zu changed", variant, wrong, first, changed);
    /* the same, read as attention reads it: every element of block dst now decodes to the
     * element of block src (identity table: logical row = physical row) */
    int ident[6] = {0, 1, 2, 3, 4, 5}, bad = 0;
    for (int l = 0; l < c.n_layers; l++)
        for (int i = 0; i < c.n_planes; i++)
            for (int h = 0; h < c.n_kv_heads; h++) {
                const kv_cache_plane *p = kv_cache_plane_of(c.planes, c.n_layers, i, l);
                const int qr = p->role;
                kv_head_view v = kv_cache_plane_view_paged(p, c.fmt[l], qr, c.n_kv_heads, c.rows,
                                                           d, c.window, 0, h, INT64_MAX, ident, B);
                for (int t = 0; t < B; t++)
                    for (int j = 0; j < d; j++) {
                        float a = kv_cache_elem(&v, (int64_t)dst * B + t, j),
                              b = kv_cache_elem(&v, (int64_t)src * B + t, j);
                        bad += memcmp(&a, &b, sizeof a) != 0;
                    }
            }
    KV_CHECK(bad == 0, "copy_blocks %s: %d elements of the copied block decode differently", variant,
             bad);
    /* a list runs in order: 4 -> 2 then 2 -> 5 leaves 5 holding what 4 holds */
    kv_block_copy chain[2] = {{4, 2}, {2, 5}};
    KV_CHECK(kv_cache_copy_blocks(&c, chain, 2, &e) == KV_OK, "copy list: %s", e.msg);
    const kv_cache_plane *p0 = kv_cache_plane_of(c.planes, c.n_layers, 0, 0);
    KV_CHECK(!memcmp(p0->codes + (size_t)5 * B * p0->row_bytes, p0->codes + (size_t)4 * B * p0->row_bytes,
                     (size_t)B * p0->row_bytes), "copy list %s not performed in order", variant);
    free(before);
    free(expect);
    kv_cache_free(&c);
}

/* ---- fork + copy-on-write ------------------------------------------------------------------ */

/* Solo reference: prefill tokens [0, p) in one chunk, then one token at a time up to n.
 * out [1 + n - p][V]: the prefill's logits, then each decode step's. */
static int solo(const kv_model *m, const kv_cache_spec *cs, const int *tok, int p, int n,
                float *out, kv_err *e)
{
    kv_backend *b;
    const int V = m->config.vocab_size;
    int rc = kv_backend_cpu(&b, m, cs, e);
    if (rc) return rc;
    kv_seq q = {0, 0, p, tok};
    rc = b->forward(b, &q, 1, out, NULL, e);
    for (int t = p; t < n && !rc; t++) {
        kv_seq d = {0, t, 1, tok + t};
        rc = b->forward(b, &d, 1, out + (size_t)(t - p + 1) * V, NULL, e);
    }
    kv_backend_destroy(b);
    return rc;
}

static void check_fork(const char *model_name, const kv_model *m, const char *variant, int B,
                       int p)
{
    enum { STEPS = 6 };
    kv_err e;
    kv_cache_spec cs;
    if (kv_needle_cache_spec(variant, 2, CAP, &cs, &e)) {
        KV_CHECK(0, "%s: %s", variant, e.msg);
        return;
    }
    const int V = m->config.vocab_size, expect_cow = p % B ? 1 : 0;
    int par[CAP], chi[CAP];
    memcpy(par, TOK[0], sizeof par);
    memcpy(chi, TOK[0], (size_t)p * sizeof(int));
    memcpy(chi + p, TOK[1] + p, (size_t)(CAP - p) * sizeof(int)); /* differs after the fork */
    /* [1 + STEPS][V]: prefill, then the decode steps compared */
    float *ref_p = malloc((size_t)(STEPS + 1) * V * sizeof(float)),
          *ref_c = malloc((size_t)(STEPS + 1) * V * sizeof(float));
    float *got = malloc((size_t)2 * V * sizeof(float));
    int rc = solo(m, &cs, par, p, p + STEPS, ref_p, &e);
    if (!rc) rc = solo(m, &cs, chi, p, p + STEPS, ref_c, &e);
    kv_backend *b = NULL;
    kv_cache_spec ps = paged(cs, B, 2);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    KV_CHECK(rc == KV_OK, "fork %s %s: %s", model_name, variant, e.msg);
    if (rc) goto out;
    kv_test_pool_shuffle(&b->mem->paged->pool, 3);
    kv_seq q = {0, 0, p, par};
    rc = b->forward(b, &q, 1, got, NULL, &e);
    if (!rc) rc = kv_paged_fork(b->mem, 1, 0, &e);
    KV_CHECK(rc == KV_OK && b->length(b, 1) == p, "fork %s: %s", variant, rc ? e.msg : "length");
    const kv_block_table *t0 = &b->mem->paged->tables[0], *t1 = &b->mem->paged->tables[1];
    int shared = t0->n_blocks == t1->n_blocks;
    for (int i = 0; shared && i < t0->n_blocks; i++)
        shared = t0->blocks[i] == t1->blocks[i] && b->mem->paged->pool.refcount[t0->blocks[i]] == 2;
    KV_CHECK(shared, "fork %s: the child does not share every block at refcount 2", variant);
    const int64_t cow0 = b->mem->paged->n_cow;
    int bad_p = 0, bad_c = 0;
    for (int st = 0; st < STEPS && !rc; st++) {
        kv_seq two[2] = {{0, p + st, 1, par + p + st}, {1, p + st, 1, chi + p + st}};
        rc = b->forward(b, two, 2, got, NULL, &e);
        bad_p += memcmp(got, ref_p + (size_t)(st + 1) * V, (size_t)V * sizeof(float)) != 0;
        bad_c += memcmp(got + V, ref_c + (size_t)(st + 1) * V, (size_t)V * sizeof(float)) != 0;
    }
    KV_CHECK(rc == KV_OK, "fork %s steps: %s", variant, e.msg);
    KV_CHECK(bad_p == 0, "fork %s %s B=%d p=%d: the parent's logits changed in %d of %d steps",
             model_name, variant, B, p, bad_p, STEPS);
    KV_CHECK(bad_c == 0, "fork %s %s B=%d p=%d: the child differs from its solo run in %d of %d "
             "steps", model_name, variant, B, p, bad_c, STEPS);
    KV_CHECK(b->mem->paged->n_cow - cow0 == expect_cow, "fork %s B=%d p=%d: %lld copies on write, "
             "expected %d", variant, B, p, (long long)(b->mem->paged->n_cow - cow0), expect_cow);
    check_released(b, "fork");
out:
    kv_backend_destroy(b);
    free(ref_p);
    free(ref_c);
    free(got);
}

/* ---- prefix caching ------------------------------------------------------------------------ */

static void check_prefix(const kv_model *m, const char *variant, int B)
{
    kv_err e;
    kv_cache_spec cs;
    if (kv_needle_cache_spec(variant, 2, 128, &cs, &e)) {
        KV_CHECK(0, "%s: %s", variant, e.msg);
        return;
    }
    /* A's prompt: 3B + 5 tokens; B's: the first 2B + 3 of them, then 20 of its own */
    const int V = m->config.vocab_size, np = 3 * B + 5, shared = 2 * B + 3, NQ = shared + 20;
    const int adoptable = !kvq_is_fp8(cs.quant.dtype) && !kvq_is_kivi(cs.quant.dtype);
    int P[2 * CAP], Q[2 * CAP];
    memcpy(P, TOK[2], sizeof TOK[2]);
    memcpy(P + CAP, TOK[0], sizeof TOK[0]);
    memcpy(Q, P, (size_t)shared * sizeof(int));
    memcpy(Q + shared, TOK[1], (size_t)(NQ - shared) * sizeof(int));
    float *ref = malloc((size_t)4 * V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    /* without the prefix cache: Q prefilled whole, three decode steps: ref [4][V] */
    int rc = solo(m, &cs, Q, NQ - 3, NQ, ref, &e), hit = -1;
    kv_backend *b = NULL;
    kv_cache_spec ps = paged(cs, B, 2);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    if (!rc) rc = kv_backend_enable_prefix_cache(b, &e);
    KV_CHECK(rc == KV_OK, "prefix %s: %s", variant, e.msg);
    if (rc) goto out;
    /* request A: its prompt in two chunks and two decode steps, so its full blocks register */
    kv_seq a[4] = {{0, 0, B + 3, P}, {0, B + 3, np - B - 3, P + B + 3}, {0, np, 1, P + np},
                   {0, np + 1, 1, P + np + 1}};
    for (int i = 0; i < 4 && !rc; i++) rc = b->forward(b, &a[i], 1, got, NULL, &e);
    KV_CHECK(rc == KV_OK, "prefix %s request A: %s", variant, e.msg);
    /* request B shares 2B + 3 tokens: two full blocks to adopt, the rest to prefill */
    rc = kv_paged_match_prefix(b->mem, 1, Q, NQ - 3, &hit, &e);
    if (adoptable) {
        KV_CHECK(rc == KV_OK && hit == 2 * B && b->length(b, 1) == 2 * B, "prefix %s B=%d: "
                 "rc %d, hit %d tokens (expected %d), length %d: %s", variant, B, rc, hit, 2 * B,
                 b->length(b, 1), rc ? e.msg : "");
    } else {
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && hit == 0 && strstr(e.msg, "cannot be adopted") &&
                     strstr(e.msg, kv_quant_name(cs.quant.dtype)),
                 "prefix %s: adoption not refused with its reason: rc %d, '%s'", variant, rc,
                 rc ? e.msg : "");
        KV_CHECK(b->length(b, 1) == 0 && b->mem->paged->tables[1].n_blocks == 0,
                 "prefix %s: a refused adoption left slot 1 holding %d blocks", variant,
                 b->mem->paged->tables[1].n_blocks);
        hit = 0;
    }
    rc = KV_OK;
    kv_seq q = {1, hit, NQ - 3 - hit, Q + hit};
    rc = b->forward(b, &q, 1, got, NULL, &e);
    int bad = rc || memcmp(got, ref, (size_t)V * sizeof(float));
    for (int t = NQ - 3; t < NQ && !rc; t++) {
        kv_seq d = {1, t, 1, Q + t};
        rc = b->forward(b, &d, 1, got, NULL, &e);
        bad += rc || memcmp(got, ref + (size_t)(t - NQ + 4) * V, (size_t)V * sizeof(float));
    }
    KV_CHECK(rc == KV_OK && bad == 0, "prefix %s B=%d (hit %d): %d of 4 logit rows differ from "
             "a run without the prefix cache %s", variant, B, hit, bad, rc ? e.msg : "");
    if (adoptable && !rc) {
        /* both finish; their full blocks wait as CACHED. The same prompt again revives them:
         * every full block but the one holding the last prompt token, (NQ - 4) / B of them */
        b->reset(b, 0);
        b->reset(b, 1);
        const int want = (NQ - 4) / B * B;
        rc = kv_paged_match_prefix(b->mem, 0, Q, NQ - 3, &hit, &e);
        KV_CHECK(rc == KV_OK && hit == want, "prefix %s B=%d after release: hit %d, expected %d %s",
                 variant, B, hit, want, rc ? e.msg : "");
        kv_seq c = {0, hit, NQ - 3 - hit, Q + hit};
        if (!rc) rc = b->forward(b, &c, 1, got, NULL, &e);
        KV_CHECK(rc == KV_OK && !memcmp(got, ref, (size_t)V * sizeof(float)), "prefix %s B=%d: "
                 "a prompt on revived blocks differs from a run without the prefix cache %s",
                 variant, B, rc ? e.msg : "");
    }
    check_released(b, "prefix");
out:
    kv_backend_destroy(b);
    free(ref);
    free(got);
}

/* ---- exhaustion: a step the pool cannot supply changes nothing ------------------------- */

typedef struct {
    int n_free, n_used, n_cached, len[2], n_blocks[2], blocks[2][8], refcount[8];
    int64_t n_tokens[2];
} pool_snap;

static void snap(const kv_backend *b, pool_snap *s)
{
    memset(s, 0, sizeof *s);
    const kv_pool *p = &b->mem->paged->pool;
    s->n_free = p->n_free;
    s->n_used = p->n_used;
    s->n_cached = p->n_cached;
    for (int i = 0; i < p->n_blocks && i < 8; i++) s->refcount[i] = p->refcount[i];
    for (int k = 0; k < 2; k++) {
        const kv_block_table *t = &b->mem->paged->tables[k];
        s->len[k] = b->length((kv_backend *)b, k);
        s->n_blocks[k] = t->n_blocks;
        s->n_tokens[k] = t->n_tokens;
        for (int i = 0; i < t->n_blocks && i < 8; i++) s->blocks[k][i] = t->blocks[i];
    }
}

static void check_exhaustion(const kv_model *m)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec cs = kv_cache_spec_default(2, 64), ps = paged(cs, 8, 0);
    ps.layout.n_blocks = 5;
    kv_backend *b, *r;
    if (kv_backend_cpu(&b, m, &ps, &e) || kv_backend_cpu(&r, m, &cs, &e)) {
        KV_CHECK(0, "exhaustion: %s", e.msg);
        return;
    }
    float *got = malloc((size_t)2 * V * sizeof(float)), *ref = malloc((size_t)2 * V * sizeof(float));
    kv_seq a = {0, 0, 20, TOK[0]}; /* 3 blocks of 5 */
    int rc = b->forward(b, &a, 1, got, NULL, &e);
    if (!rc) rc = r->forward(r, &a, 1, ref, NULL, &e);
    KV_CHECK(rc == KV_OK, "exhaustion prefill: %s", e.msg);
    /* slot 0 +10 (to 30: one more block), slot 1 +20 (three): 4 blocks, 2 available */
    KV_CHECK(kv_paged_blocks_needed(b->mem, 0, 10) == 1 &&
                 kv_paged_blocks_needed(b->mem, 1, 20) == 3 && kv_paged_available(b->mem) == 2,
             "blocks needed %d + %d, available %d", kv_paged_blocks_needed(b->mem, 0, 10),
             kv_paged_blocks_needed(b->mem, 1, 20), kv_paged_available(b->mem));
    pool_snap s0, s1;
    snap(b, &s0);
    kv_seq big[2] = {{0, 20, 10, TOK[0] + 20}, {1, 0, 20, TOK[1]}};
    rc = b->forward(b, big, 2, got, NULL, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "needs 4 blocks") && strstr(e.msg, "2 free of 5"),
             "exhaustion: rc %d, message without the numbers: '%s'", rc, rc ? e.msg : "");
    snap(b, &s1);
    KV_CHECK(!memcmp(&s0, &s1, sizeof s0), "a refused step changed the tables or the pool");
    KV_CHECK(kv_pool_validate(&b->mem->paged->pool, &e) == KV_OK, "pool after refusal: %s", e.msg);
    /* the next, smaller step fits (slot 0 +4 stays in its third block, slot 1 +9 takes two) */
    kv_seq small[2] = {{0, 20, 4, TOK[0] + 20}, {1, 0, 9, TOK[1]}};
    rc = b->forward(b, small, 2, got, NULL, &e);
    KV_CHECK(rc == KV_OK && kv_paged_available(b->mem) == 0, "the smaller step: %s",
             rc ? e.msg : "pool not full");
    if (!rc) rc = r->forward(r, small, 2, ref, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(got, ref, (size_t)2 * V * sizeof(float)),
             "after a refused step the logits differ from contiguous");
    /* full pool: one more token in slot 0's last free row works, a new block does not */
    kv_seq one = {0, 24, 1, TOK[0] + 24};
    rc = b->forward(b, &one, 1, got, NULL, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY, "a step needing a block of a full pool: rc %d", rc);
    kv_seq fits = {1, 9, 7, TOK[1] + 9};
    KV_CHECK(b->forward(b, &fits, 1, got, NULL, &e) == KV_OK, "filling slot 1's last block: %s",
             e.msg);
    check_released(b, "exhaustion");
    KV_CHECK(kv_paged_available(b->mem) == 5, "after reset %d of 5 blocks available",
             kv_paged_available(b->mem));
    kv_backend_destroy(b);
    kv_backend_destroy(r);
    free(got);
    free(ref);
}

/* Sharers of one partly filled last block appending in the same step: only the first copies
 * it, so a pool with one free block must accept the step (and keep both equal to solo runs'
 * reference: the contiguous backend fed the same tokens). */
static void check_shared_step(const kv_model *m)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec cs = kv_cache_spec_default(2, 64), ps = paged(cs, 8, 0);
    ps.layout.n_blocks = 3; /* 12 tokens take 2 blocks, 1 left: one copy-on-write, no more */
    kv_backend *b, *r;
    if (kv_backend_cpu(&b, m, &ps, &e) || kv_backend_cpu(&r, m, &cs, &e)) {
        KV_CHECK(0, "shared step: %s", e.msg);
        return;
    }
    float *got = malloc((size_t)2 * V * sizeof(float)), *ref = malloc((size_t)2 * V * sizeof(float));
    kv_seq a = {0, 0, 12, TOK[0]};
    int rc = b->forward(b, &a, 1, got, NULL, &e);
    if (!rc) rc = kv_paged_fork(b->mem, 1, 0, &e);
    kv_seq a1 = {1, 0, 12, TOK[0]};
    if (!rc) rc = r->forward(r, &a, 1, ref, NULL, &e);
    if (!rc) rc = r->forward(r, &a1, 1, ref, NULL, &e);
    KV_CHECK(rc == KV_OK, "shared step setup: %s", rc ? e.msg : "");
    KV_CHECK(kv_paged_available(b->mem) == 1, "after the fork %d blocks free, expected 1",
             kv_paged_available(b->mem));
    kv_seq both[2] = {{0, 12, 1, TOK[0] + 12}, {1, 12, 1, TOK[1] + 12}};
    rc = b->forward(b, both, 2, got, NULL, &e);
    KV_CHECK(rc == KV_OK, "both sharers appending in one step with one free block: %s",
             rc ? e.msg : "");
    if (!rc) rc = r->forward(r, both, 2, ref, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(got, ref, (size_t)2 * V * sizeof(float)),
             "shared step: logits differ from contiguous");
    KV_CHECK(b->mem->paged->n_cow == 1, "shared step: %lld copies, expected 1",
             (long long)b->mem->paged->n_cow);
    check_released(b, "shared step");
    kv_backend_destroy(b);
    kv_backend_destroy(r);
    free(got);
    free(ref);
}

/* ---- flat slot mapping ---------------------------------------------------------------------- */

/* kv_cache_write_slots() (negative slots = padding) writes exactly the bytes kv_cache_write_seq()
 * writes for the same tokens by position through the table; fp8, KIVI and contiguous caches
 * are refused. */
static void check_write_slots(const kv_config *cfg, const char *variant)
{
    kv_err e;
    kv_cache_spec s = kv_cache_spec_default(1, 48);
    if (kv_needle_cache_spec(variant, 1, 48, &s, &e)) {
        KV_CHECK(0, "write slots %s: %s", variant, e.msg);
        return;
    }
    s = paged(s, 8, 0);
    kv_cache c, ref;
    if (kv_cache_create(&c, cfg, &s, &e) || kv_cache_create(&ref, cfg, &s, &e)) {
        KV_CHECK(0, "write slots %s: %s", variant, e.msg);
        return;
    }
    const int n = 29, m = 36, kvdim = cfg->n_kv_heads * kv_config_head_dim(cfg);
    const int table[6] = {3, 5, 0, 4, 1, 2};
    float *k = malloc(sizeof(float) * m * kvdim), *v = malloc(sizeof(float) * m * kvdim);
    float *kp = malloc(sizeof(float) * n * kvdim), *vp = malloc(sizeof(float) * n * kvdim);
    int64_t slots[36];
    kv_rng r;
    kv_rng_seed(&r, 77);
    for (int i = 0; i < m * kvdim; i++) {
        k[i] = kv_rng_uniform(&r, -2.0f, 2.0f);
        v[i] = kv_rng_uniform(&r, -2.0f, 2.0f);
    }
    for (int i = 0, t = 0; i < m; i++) {
        if (i % 5 == 2 || t == n) { /* padding: its row of k, v must land nowhere */
            slots[i] = -1;
            continue;
        }
        slots[i] = (int64_t)table[t / 8] * 8 + t % 8;
        memcpy(kp + (size_t)t * kvdim, k + (size_t)i * kvdim, sizeof(float) * kvdim);
        memcpy(vp + (size_t)t * kvdim, v + (size_t)i * kvdim, sizeof(float) * kvdim);
        t++;
    }
    const int fmt = s.quant.dtype;
    const int refuse = kvq_is_fp8(fmt) || kvq_is_kivi(fmt);
    int rc = kv_cache_set_blocks(&ref, 0, table, 6, &e);
    for (int l = 0; l < cfg->n_layers && !rc; l++) {
        rc = kv_cache_write_slots(&c, l, slots, m, k, v, &e);
        if (refuse) {
            KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "belong to a sequence"),
                     "write slots %s: refused (rc %d)", variant, rc);
            rc = -1;
            break;
        }
        if (!rc) rc = kv_cache_write_seq(&ref, l, 0, 0, n, kp, vp, &e);
    }
    if (!refuse) {
        KV_CHECK(rc == KV_OK, "write slots %s: %s", variant, rc ? e.msg : "");
        KV_CHECK(!rc && !memcmp(c.mem, ref.mem, c.mem_bytes),
                 "write slots %s: bytes == writing by position through the table", variant);
    }
    const int64_t out[1] = {(int64_t)s.layout.n_blocks * 8};
    KV_CHECK(kv_cache_write_slots(&c, 0, out, 1, k, v, &e) != KV_OK,
             "write slots %s: a slot outside the pool is refused", variant);
    kv_cache_free(&c);
    kv_cache_free(&ref);
    kv_cache cc;
    kv_cache_spec cs = kv_cache_spec_default(1, 16);
    if (kv_cache_create(&cc, cfg, &cs, &e) == KV_OK) {
        KV_CHECK(kv_cache_write_slots(&cc, 0, slots, 1, k, v, &e) == KV_ERR_ARG,
                 "write slots on a contiguous cache is refused");
        kv_cache_free(&cc);
    }
    free(k); free(v); free(kp); free(vp);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void check_bad_input(const kv_model *m)
{
    kv_err e;
    kv_cache c, cc;
    kv_cache_spec s = paged(kv_cache_spec_default(2, 32), 8, 0); /* 4 table entries, 8 blocks */
    s.layout.block_size = 0;
    int rc = kv_cache_create(&c, &m->config, &s, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "block size 0"), "block_size 0: rc %d '%s'", rc,
             rc ? e.msg : "");
    s.layout.block_size = 8;
    s.layout.n_blocks = 0;
    rc = kv_cache_create(&c, &m->config, &s, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "0 blocks"), "n_blocks 0: rc %d '%s'", rc,
             rc ? e.msg : "");
    kv_backend *b = NULL;
    rc = kv_backend_cpu(&b, m, &s, &e);
    KV_CHECK(rc == KV_ERR_ARG && !b, "backend with n_blocks 0: rc %d", rc);
    s.layout.n_blocks = 8;
    kv_cache_spec cs = kv_cache_spec_default(2, 32);
    if (kv_cache_create(&c, &m->config, &s, &e) || kv_cache_create(&cc, &m->config, &cs, &e)) {
        KV_CHECK(0, "bad input caches: %s", e.msg);
        return;
    }
    const int ok[4] = {3, 1, 6, 0}, out_hi[2] = {3, 8}, out_lo[2] = {-1, 2}, five[5] = {0, 1, 2, 3, 4};
    rc = kv_cache_set_blocks(&c, 0, out_hi, 2, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "block 8") && strstr(e.msg, "[0, 8)"),
             "id 8 of 8: '%s'", e.msg);
    rc = kv_cache_set_blocks(&c, 0, out_lo, 2, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "block -1"), "id -1: '%s'", e.msg);
    rc = kv_cache_set_blocks(&c, 0, five, 5, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "max 4"), "5 blocks of 4 entries: '%s'", e.msg);
    KV_CHECK(kv_cache_set_blocks(&c, 0, NULL, 2, &e) == KV_ERR_ARG, "NULL table refused");
    KV_CHECK(kv_cache_set_blocks(&c, 2, ok, 2, &e) == KV_ERR_ARG, "slot 2 of 2 refused");
    KV_CHECK(c.n_mapped[0] == 0, "a refused table was applied");
    rc = kv_cache_set_blocks(&cc, 0, ok, 2, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "not paged"), "set_blocks on contiguous: '%s'",
             e.msg);
    KV_CHECK(kv_cache_copy_blocks(&cc, NULL, 0, &e) == KV_ERR_ARG, "copy_blocks on contiguous");
    KV_CHECK(kv_cache_fork_slot(&cc, 1, 0, &e) == KV_ERR_ARG, "fork_slot on contiguous");
    KV_CHECK(kv_cache_set_length(&cc, 0, 4, &e) == KV_ERR_ARG, "set_length on contiguous");
    kv_block_copy bad_pair = {2, 8};
    KV_CHECK(kv_cache_copy_blocks(&c, &bad_pair, 1, &e) == KV_ERR_ARG && strstr(e.msg, "2 -> 8"),
             "copy to block 8 of 8: '%s'", e.msg);

    /* the engine on a bare paged cache: writes only inside mapped blocks */
    kv_state st;
    kv_state_init(&st);
    float *logits = malloc((size_t)m->config.vocab_size * sizeof(float));
    KV_CHECK(kv_cache_set_blocks(&c, 0, ok, 2, &e) == KV_OK, "set_blocks: %s", e.msg);
    kv_seq q = {0, 0, 17, TOK[0]};
    rc = kv_forward(m, &c, &st, &q, 1, logits, NULL, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && c.len[0] == 0, "17 tokens into 2 blocks of 8: rc %d", rc);
    q.n_tokens = 10;
    KV_CHECK(kv_forward(m, &c, &st, &q, 1, logits, NULL, &e) == KV_OK, "10 tokens: %s", e.msg);
    rc = kv_cache_set_blocks(&c, 0, ok, 1, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "cannot hold"), "a table shorter than the slot's "
             "tokens: '%s'", e.msg);
    rc = kv_cache_set_length(&c, 1, 4, &e);
    KV_CHECK(rc == KV_ERR_ARG, "set_length past the mapped blocks: rc %d", rc);
    KV_CHECK(kv_cache_set_length(&c, 0, 4, &e) == KV_ERR_ARG, "set_length on a slot in use");
    free(logits);
    kv_state_free(&st);
    kv_cache_free(&c);
    kv_cache_free(&cc);

    /* backend-level paging calls */
    s.layout.n_blocks = 8;
    if (kv_backend_cpu(&b, m, &s, &e)) {
        KV_CHECK(0, "backend: %s", e.msg);
        return;
    }
    kv_seq a = {0, 0, 5, TOK[0]};
    float *lg = malloc((size_t)m->config.vocab_size * sizeof(float));
    KV_CHECK(b->forward(b, &a, 1, lg, NULL, &e) == KV_OK, "forward: %s", e.msg);
    KV_CHECK(kv_paged_fork(b->mem, 0, 0, &e) == KV_ERR_ARG, "fork onto itself refused");
    KV_CHECK(kv_paged_fork(b->mem, 2, 0, &e) == KV_ERR_ARG, "fork to slot 2 of 2 refused");
    KV_CHECK(kv_paged_fork(b->mem, 1, 0, &e) == KV_OK, "fork: %s", e.msg);
    rc = kv_paged_fork(b->mem, 1, 0, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "in use"), "fork into a used slot: '%s'", e.msg);
    int hit = -1;
    KV_CHECK(kv_paged_match_prefix(b->mem, 1, TOK[0], 5, &hit, &e) == KV_OK && hit == 0,
             "prefix match with prefix caching off: hit %d", hit);
    kv_seq wrong = {0, 3, 1, TOK[0]};
    KV_CHECK(b->forward(b, &wrong, 1, lg, NULL, &e) == KV_ERR_ARG, "pos 3 on a slot of 5 tokens");
    check_released(b, "bad input");
    kv_backend_destroy(b);
    kv_backend *cb;
    if (!kv_backend_cpu(&cb, m, &cs, &e)) {
        rc = kv_backend_enable_prefix_cache(cb, &e);
        KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "paged"), "prefix cache on contiguous: '%s'",
                 e.msg);
        kv_backend_destroy(cb);
    }
    free(lg);
}

int main(void)
{
    const double t0 = kv_now();
    build_schedule();
    /* every format; /lA: selective layers (layer A stores the format, the other fp16) */
    static const char *const narrow[] = {"fp32", "fp16", "bf16", "int8", "fp8-e4m3/head",
                                         "fp8-e4m3", "fp8-e5m2/head", "fp8-e5m2", "int8/l1"};
    static const char *const wide[] = {"fp32", "int8-g32", "int8-g64", "int8-g128", "int4/w32",
                                       "int2/w32", "int4/w32/l0"};
    const int n_narrow = (int)(sizeof narrow / sizeof narrow[0]),
              n_wide = (int)(sizeof wide / sizeof wide[0]);
    static const char *const names[] = {"tiny", "tiny-gqa"};
    kv_model models[2][2]; /* [name][wide] */
    kv_err e;
    for (int n = 0; n < 2; n++)
        for (int w = 0; w < 2; w++)
            if (make_model(&models[n][w], names[n], w, &e)) {
                printf("model %s: %s\n", names[n], e.msg);
                return 1;
            }
    for (int n = 0; n < 2; n++) {
        char wname[32];
        snprintf(wname, sizeof wname, "%s d=128", names[n]);
        for (int i = 0; i < n_narrow; i++) check_equivalence(names[n], &models[n][0], narrow[i]);
        for (int i = 0; i < n_wide; i++) check_equivalence(wname, &models[n][1], wide[i]);
    }
    printf("paged = contiguous: %.1f s\n", kv_now() - t0);
    for (int i = 0; i < n_narrow; i++) check_copy_blocks(&models[1][0].config, narrow[i]);
    for (int i = 0; i < n_wide; i++) check_copy_blocks(&models[1][1].config, wide[i]);
    const char *fork_variants[] = {"fp32", "int8", "fp8-e4m3/head", "bf16"};
    for (int i = 0; i < 4; i++)
        for (int B = 8; B <= 16; B += 8) {
            check_fork("tiny-gqa", &models[1][0], fork_variants[i], B, 3 * B + 3); /* one CoW */
            check_fork("tiny-gqa", &models[1][0], fork_variants[i], B, 3 * B);     /* none */
        }
    check_fork("tiny-gqa d=128", &models[1][1], "int4/w32", 32, 45);
    check_fork("tiny-gqa d=128", &models[1][1], "int4/w32", 32, 64);
    for (int B = 8; B <= 32; B *= 2) check_prefix(&models[0][0], "fp32", B);
    check_prefix(&models[1][0], "int8", 16);
    check_prefix(&models[1][0], "fp16", 8);
    check_prefix(&models[1][0], "fp8-e4m3/head", 16);
    check_prefix(&models[1][0], "fp8-e5m2", 8);
    check_prefix(&models[1][1], "int4/w32", 32);
    check_exhaustion(&models[0][0]);
    check_shared_step(&models[0][0]);
    for (int i = 0; i < n_narrow; i++) check_write_slots(&models[1][0].config, narrow[i]);
    check_write_slots(&models[1][1].config, "int8-g32");
    check_bad_input(&models[0][0]);
    for (int n = 0; n < 2; n++)
        for (int w = 0; w < 2; w++) kv_model_free(&models[n][w]);
    printf("test_paged: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
