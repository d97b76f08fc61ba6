/* Chapter 06: sliding window and attention sinks on the CPU.
 *
 * Predicted before measured:
 *  - the retention maps (kv_window.h) list exactly the positions the equivalent mask keeps,
 *    in order, each in its own row of the S+W a slot owns;
 *  - windowed attention equals full attention with the equivalent mask, bit for bit, for
 *    every length (W-1, W, W+1, k·W+r ...), layout (contiguous, paged) and per-token format:
 *    the retained rows are visited in position order and a masked position only adds
 *    exp(-inf) = 0 to the sum and 0·v to the output;
 *  - StreamingLLM positions: attention over keys stored before RoPE and rotated by their cache
 *    index equals attention over the gathered keys rotated by kv_rope(), bit for bit;
 *  - the forward pass: paged == contiguous, chunked prefill == token by token, and a window
 *    no shorter than the context == no window, all bit for bit; the paged table stops at
 *    ceil((S+W)/B) blocks;
 *  - no drift: after a long stream, a one-layer model's logits equal (bit for bit) those of a
 *    fresh cache holding only the retained tokens (StreamingLLM positions), and the cache's
 *    bytes never change. `test_window slow` streams 1M tokens.
 *
 *   test_window [slow]  */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"

#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kv_window.h"

#include <string.h>

#define H 4
#define HKV 2
#define D 64

static kv_config attn_config(void) { return kv_test_config_attn(H, HKV, D, 32, 1 << 20); }

/* ---- the maps ------------------------------------------------------------------------ */

static void test_maps(void)
{
    const int Ws[] = {1, 2, 5, 8, 13};
    const int Ss[] = {0, 1, 4};
    long bad = 0;
    for (int wi = 0; wi < 5; wi++)
        for (int si = 0; si < 3; si++) {
            const int W = Ws[wi], S = Ss[si];
            for (int64_t t = 0; t < 4 * (W + S) + 7; t++) {
                /* the list == the mask, in order, in distinct rows below S+W */
                int64_t n = kv_window_count(W, S, t), i = 0, rows_seen[64];
                for (int64_t s = 0; s <= t; s++) {
                    if (!kv_window_visible(W, S, t, s)) continue;
                    if (i >= n || kv_window_pos(W, S, t, i) != s) bad++;
                    const int64_t r = kv_window_row(W, S, s);
                    if (r < 0 || r >= S + W) bad++;
                    for (int64_t j = 0; j < i && j < 64; j++) bad += rows_seen[j] == r;
                    if (i < 64) rows_seen[i] = r;
                    i++;
                }
                if (i != n || n != (t + 1 < S + W ? t + 1 : S + W)) bad++;
                /* the walk attention uses visits the same list with the same rows */
                kv_window_walk k;
                kv_window_walk_start(&k, W, S, t);
                for (int64_t j = 0; j < n; j++, kv_window_walk_next(&k))
                    if (k.pos != kv_window_pos(W, S, t, j) ||
                        k.row != kv_window_row(W, S, k.pos))
                        bad++;
                if (kv_window_query_pos(W, S, KV_POS_CACHE, t) != n - 1) bad++;
                if (kv_window_query_pos(W, S, KV_POS_ORIGINAL, t) != t) bad++;
                /* a chunk's first wave never overwrites a row one of its tokens reads */
                for (int len = 1; len < 3 * (W + S); len += 3) {
                    const int m = kv_window_chunk(W, S, t, len);
                    if (m < 1 || m > len) bad++;
                    for (int64_t u = t; u < t + m; u++)      /* written */
                        for (int64_t q = t; q < u; q++)       /* an earlier query of the wave */
                            for (int64_t s = 0; s <= q; s++)  /* reads s: not overwritten */
                                if (kv_window_visible(W, S, q, s) && s != u &&
                                    kv_window_row(W, S, s) == kv_window_row(W, S, u))
                                    bad++;
                }
                /* the counters' closed form */
                double sum = 0.0;
                for (int64_t p = t; p < t + 9; p++) sum += (double)kv_window_count(W, S, p);
                if (kv_window_attended(W, S, t, 9) != sum) bad++;
            }
        }
    KV_CHECK(bad == 0, "retention maps: %ld inconsistencies", bad);
    KV_CHECK(kv_window_row(0, 0, 123456) == 123456 && kv_window_count(0, 0, 99) == 100 &&
                 kv_window_attended(0, 0, 10, 5) == 11 + 12 + 13 + 14 + 15,
             "W = 0 keeps everything");
    KV_CHECK(kv_window_scheme_parse("streaming") == KV_POS_CACHE &&
                 kv_window_scheme_parse("original") == KV_POS_ORIGINAL &&
                 kv_window_scheme_parse("x") == -1, "scheme names");
}

/* ---- specs ------------------------------------------------------------------------------ */

static void test_specs(void)
{
    kv_config cfg = attn_config();
    kv_err e;
    kv_cache c;
    kv_cache_spec s = kv_cache_spec_default(2, 1 << 22); /* 4M positions: a position bound */
    s.window.size = 100;
    s.window.n_sinks = 4;
    s.quant.dtype = KV_QF_F16;
    KV_CHECK(kv_cache_create(&c, &cfg, &s, &e) == KV_OK, "windowed cache: %s", e.msg);
    kv_cache_spec f = kv_cache_spec_default(2, 104);
    f.quant.dtype = KV_QF_F16;
    kv_cache full;
    KV_CHECK(kv_cache_create(&full, &cfg, &f, &e) == KV_OK, "full cache: %s", e.msg);
    KV_CHECK(kv_cache_bytes(&c) == kv_cache_bytes(&full) && c.rows == 104,
             "a window of 100 + 4 sinks holds the bytes of a 104-token cache (%zu vs %zu)",
             kv_cache_bytes(&c), kv_cache_bytes(&full));
    kv_cache_free(&c);
    kv_cache_free(&full);

    /* the shared check refuses a window (a device without retention), the caps one accepts */
    KV_CHECK(kv_cache_spec_check("dev", &cfg, &s, &e) == KV_ERR_UNSUPPORTED &&
                 strstr(e.msg, "window"), "no-retention device refuses: %s", e.msg);
    KV_CHECK(kv_cache_spec_check_caps("cpu", &cfg, &s, KV_CACHE_CAN_WINDOW, &e) == KV_OK,
             "caps accept: %s", e.msg);
    kv_cache_spec k = s;
    k.quant.dtype = KV_QF_INT4_KIVI;
    KV_CHECK(kv_cache_create(&c, &cfg, &k, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "int4"),
             "KIVI + window refused, named: %s", e.msg);
    const int bad[][3] = {{-1, 0, 0}, {0, 4, 0}, {0, 0, 1}, {10, -1, 0}, {10, 0, 7}};
    for (int i = 0; i < 5; i++) {
        kv_cache_spec b = kv_cache_spec_default(1, 64);
        b.window.size = bad[i][0];
        b.window.n_sinks = bad[i][1];
        b.window.pos_scheme = bad[i][2];
        KV_CHECK(kv_cache_create(&c, &cfg, &b, &e) == KV_ERR_ARG, "bad window spec %d refused "
                 "(%s)", i, e.msg);
    }
}

/* ---- attention: windowed == full with the equivalent mask ------------------------------ */

static int make_cache(kv_cache *c, const kv_config *cfg, int dtype, int paged, int B, int W,
                      int S, int scheme, int capacity)
{
    kv_err e;
    kv_cache_spec s = kv_test_spec_window(dtype, W, S, scheme, capacity);
    const int64_t rows = W ? (S + W < capacity ? S + W : capacity) : capacity;
    if (paged) kv_test_spec_paged(&s, B, (int)((rows + B - 1) / B) + 3);
    int rc = kv_cache_create(c, cfg, &s, &e);
    if (rc) {
        printf("  cache: %s\n", e.msg);
        return rc;
    }
    if (paged) { /* a scrambled table: logical block i is physical block n-1-i */
        rc = kv_test_blocks_reversed(c, s.layout.n_blocks, c->max_blocks, &e);
        if (rc) printf("  blocks: %s\n", e.msg);
    }
    return rc;
}

/* Full attention of one head over positions 0..t with the window's mask: masked scores are
 * -inf, then the fast path's three passes (kv_attention_fast.c; its exponentials:
 * kv_attn_exp_sum(), its rows: kv_attn_row_factored(), its scores: kv_attn_score()).
 * kv [Hkv][*] views. */
static void masked_ref(const float *qh, const kv_head_view *kh, const kv_head_view *vh, int W,
                       int S, int t, float *oh)
{
    float att[4096], row[D];
    int16_t q16[D]; /* int8 keys are scored in integers (kv_attn_int_keys()) */
    const int qint = kv_attn_int_keys(kh);
    const float step = qint ? kv_attn_query_q16(qh, D, q16) : 0.0f;
    float max = -INFINITY;
    for (int s = 0; s <= t; s++) {
        if (kv_window_visible(W, S, t, s)) {
            const float f = kv_attn_row_factored(kh, s, row);
            att[s] = kv_attn_score(qh, qint ? q16 : NULL, step, row, f, D);
        } else {
            att[s] = -INFINITY;
        }
        if (att[s] > max) max = att[s];
    }
    const float sum = kv_attn_exp_sum(att, t + 1, max); /* masked entries: exactly 0 */
    for (int i = 0; i < D; i++) oh[i] = 0.0f;
    for (int s = 0; s <= t; s++) {
        const float wf = att[s] * kv_attn_row_factored(vh, s, row);
        kv_attn_add_row(vh, oh, wf, row, D);
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < D; i++) oh[i] *= inv;
}

/* StreamingLLM reference: gather the retained rows of the full cache (keys unrotated),
 * rotate key i by kv_rope() at position i, and attend over them with masked_ref()'s passes
 * (value rows as kv_attention() reads them: kv_attn_row_factored()). */
static void stream_ref(const float *q_rot, const kv_cache *full, const kv_config *cfg, int W,
                       int S, int t, float *out)
{
    const int n = (int)kv_window_count(W, S, t);
    float *k = malloc(sizeof(float) * HKV * n * D), *v = malloc(sizeof(float) * HKV * n * D);
    float vf[HKV * 4096], att[4096]; /* [Hkv][n] each value row's factor; [n] */
    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] */
    kv_rope_freqs(cfg, freq);
    for (int h = 0; h < HKV; h++) {
        kv_head_view kh = kv_cache_view(full, 0, 0, h, KV_QROLE_KEY);
        kv_head_view vh = kv_cache_view(full, 0, 0, h, KV_QROLE_VALUE);
        for (int i = 0; i < n; i++) {
            const int64_t p = kv_window_pos(W, S, t, i);
            float *kr = k + ((size_t)h * n + i) * D;
            kv_attn_row(&kh, p, kr);
            vf[h * n + i] = kv_attn_row_factored(&vh, p, v + ((size_t)h * n + i) * D);
            kv_rope(kr, &i, 1, 1, D, cfg->rotary_dim, freq);
        }
    }
    const float scale = 1.0f / sqrtf((float)D);
    for (int h = 0; h < H; h++) {
        const int kvh = kv_attn_kv_head(h, H, HKV);
        const kv_head_view vh = kv_cache_view(full, 0, 0, kvh, KV_QROLE_VALUE); /* its rows' kind */
        const float *qh = q_rot + h * D;
        float *oh = out + h * D, max = -INFINITY;
        for (int i = 0; i < n; i++) {
            att[i] = kv_dot(qh, k + ((size_t)kvh * n + i) * D, D) * scale;
            if (att[i] > max) max = att[i];
        }
        const float sum = kv_attn_exp_sum(att, n, max);
        for (int j = 0; j < D; j++) oh[j] = 0.0f;
        for (int i = 0; i < n; i++) {
            const float wf = att[i] * vf[kvh * n + i], *vr = v + ((size_t)kvh * n + i) * D;
            kv_attn_add_row(&vh, oh, wf, vr, D);
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j < D; j++) oh[j] *= inv;
    }
    free(k);
    free(v);
}

/* Write tokens 0..n-1 of K/V (unrotated for the stream scheme) into both caches, then check
 * the attention of every query position against the reference, after every token. */
static long check_case(const kv_config *cfg, int dtype, int paged, int B, int W, int S,
                       int scheme, int n_max, const char *what)
{
    kv_cache win, full;
    if (make_cache(&win, cfg, dtype, paged, B, W, S, scheme, 1 << 20) ||
        make_cache(&full, cfg, dtype, 0, 0, 0, 0, KV_POS_ORIGINAL, n_max)) {
        KV_CHECK(0, "%s: caches", what);
        return 1;
    }
    kv_rng r;
    kv_rng_seed(&r, 77 + (uint64_t)W * 31 + S);
    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] */
    kv_rope_freqs(cfg, freq);
    float *k = malloc(sizeof(float) * (size_t)n_max * HKV * D); /* [n][Hkv][d] */
    float *v = malloc(sizeof(float) * (size_t)n_max * HKV * D);
    for (long i = 0; i < (long)n_max * HKV * D; i++) {
        k[i] = kv_rng_normal(&r);
        v[i] = kv_rng_normal(&r);
    }
    float q[H * D], qr[H * D], ow[H * D], oref[H * D], att[4096];
    long bad = 0;
    kv_err e;
    for (int pos = 0; pos < n_max;) {
        /* the waves the forward pass would write (a prefill chunk up to S+W, then tokens) */
        const int m = kv_window_chunk(W, S, pos, n_max - pos);
        const size_t off = (size_t)pos * HKV * D;
        if (kv_cache_write_seq(&win, 0, 0, pos, m, k + off, v + off, &e) ||
            kv_cache_write_seq(&full, 0, 0, pos, m, k + off, v + off, &e)) {
            KV_CHECK(0, "%s: write: %s", what, e.msg);
            break;
        }
        for (int t = pos; t < pos + m; t++) { /* every query of the wave */
            for (int i = 0; i < H * D; i++) q[i] = kv_rng_normal(&r);
            if (scheme == KV_POS_CACHE) {
                memcpy(qr, q, sizeof q);
                const int qp = (int)kv_window_query_pos(W, S, scheme, t);
                kv_rope(qr, &qp, 1, H, D, cfg->rotary_dim, freq);
                stream_ref(qr, &full, cfg, W, S, t, oref);
            }
            for (int h = 0; h < H; h++) {
                const float *qh = (scheme == KV_POS_CACHE ? qr : q) + h * D;
                kv_attention_head(&win, 0, 0, t, h, H, qh, ow + h * D, att);
                if (scheme != KV_POS_CACHE) {
                    const int kvh = kv_attn_kv_head(h, H, HKV);
                    kv_head_view kh = kv_cache_view(&full, 0, 0, kvh, KV_QROLE_KEY);
                    kv_head_view vh = kv_cache_view(&full, 0, 0, kvh, KV_QROLE_VALUE);
                    masked_ref(qh, &kh, &vh, W, S, t, oref + h * D);
                }
            }
            if (memcmp(ow, oref, sizeof ow)) {
                if (bad < 3) printf("  %s: query %d differs from the reference\n", what, t);
                bad++;
            }
        }
        pos += m;
    }
    KV_CHECK(bad == 0, "%s: %ld of %d queries differ from the %s reference", what, bad, n_max,
             scheme == KV_POS_CACHE ? "gathered + kv_rope" : "masked full");
    free(k);
    free(v);
    kv_cache_free(&win);
    kv_cache_free(&full);
    return bad;
}

static void test_attention(void)
{
    const kv_config cfg = attn_config();
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_BF16, KV_QF_INT8, KV_QF_INT8_G32,
                        KV_QF_FP8_E4M3};
    char what[128];
    /* every length 1 .. 3(S+W)+5 for small windows; paged with B that does and does not
     * divide S+W */
    const int shapes[][3] = {{8, 0, 8}, {8, 3, 4}, {5, 4, 8}, {37, 4, 16}, {16, 0, 16}};
    for (int f = 0; f < 6; f++)
        for (int si = 0; si < 5; si++)
            for (int paged = 0; paged < 2; paged++)
                for (int scheme = 0; scheme < 2; scheme++) {
                    const int W = shapes[si][0], S = shapes[si][1], B = shapes[si][2];
                    if (scheme == KV_POS_CACHE && f > 1 && si > 1) continue; /* keep it short */
                    snprintf(what, sizeof what, "%s %s W %d S %d%s%s", kv_quant_name(fmts[f]),
                             paged ? "paged" : "contiguous", W, S, paged ? " B " : "",
                             paged ? (B == 8 ? "8" : B == 4 ? "4" : "16") : "");
                    if (scheme == KV_POS_CACHE) strcat(what, " (cache positions)");
                    check_case(&cfg, fmts[f], paged, B, W, S, scheme, 3 * (S + W) + 5, what);
                }
    /* a longer run: many wraps of a ring that is not a multiple of the block */
    check_case(&cfg, KV_QF_INT8, 1, 16, 100, 4, KV_POS_ORIGINAL, 7 * 104 + 13,
               "int8 paged W 100 S 4 B 16, 7 wraps");
    check_case(&cfg, KV_QF_F32, 1, 16, 100, 4, KV_POS_CACHE, 7 * 104 + 13,
               "fp32 paged W 100 S 4 B 16, 7 wraps (cache positions)");
}

/* ---- the forward pass ------------------------------------------------------------------- */

static kv_config model_config(int n_layers)
{
    kv_config c = kv_test_config(n_layers, 4, 2, 16, 1 << 22);
    c.hidden_dim = 172;
    c.vocab_size = 512;
    c.rotary_dim = 16;
    c.tied_classifier = 1;
    return c;
}

static kv_cache_spec window_spec(int dtype, int paged, int B, int W, int S, int scheme, int cap)
{
    kv_cache_spec s = kv_test_spec_window(dtype, W, S, scheme, cap);
    if (paged) kv_test_spec_paged(&s, B, 64);
    return s;
}

/* Feed tokens in steps of @p steps[] sizes (cycled); logits of the last step into out. */
static int run_stream(kv_backend *b, const int *tok, int n, const int *steps, int n_steps,
                      float *out, kv_err *e)
{
    int pos = 0, k = 0;
    b->reset(b, 0);
    while (pos < n) {
        int m = steps[k++ % n_steps];
        if (m > n - pos) m = n - pos;
        kv_seq s = {0, pos, m, tok + pos};
        int rc = b->forward(b, &s, 1, pos + m == n ? out : NULL, NULL, e);
        if (rc) return rc;
        pos += m;
    }
    return KV_OK;
}

static void test_forward(void)
{
    kv_config cfg = model_config(2);
    kv_model m;
    kv_err e;
    if (kv_test_model_random(&m, &cfg, 606)) return;
    const int N = 700, V = cfg.vocab_size;
    int tok[700];
    kv_rng r;
    kv_rng_seed(&r, 5);
    for (int i = 0; i < N; i++) tok[i] = (int)(kv_rng_u32(&r) % V);
    float *a = malloc(sizeof(float) * V), *b2 = malloc(sizeof(float) * V);
    const int chunked[] = {300, 1, 7, 1, 64}, single[] = {1};
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    for (int scheme = 0; scheme < 2; scheme++)
        for (int f = 0; f < 3; f++) {
            const char *sn = kv_window_scheme_name(scheme), *fn = kv_quant_name(fmts[f]);
            kv_backend *ct = NULL, *pg = NULL, *tk = NULL;
            kv_cache_spec sc = window_spec(fmts[f], 0, 0, 48, 4, scheme, 1 << 20);
            kv_cache_spec sp = window_spec(fmts[f], 1, 8, 48, 4, scheme, 1 << 20);
            if (kv_backend_cpu(&ct, &m, &sc, &e) || kv_backend_cpu(&pg, &m, &sp, &e) ||
                kv_backend_cpu(&tk, &m, &sc, &e)) {
                KV_CHECK(0, "backends: %s", e.msg);
                break;
            }
            /* paged == contiguous, chunked prefill == token by token, over ~13 wraps */
            int rc = run_stream(ct, tok, N, chunked, 5, a, &e);
            KV_CHECK(rc == KV_OK, "contiguous %s %s: %s", fn, sn, e.msg);
            rc = run_stream(pg, tok, N, chunked, 5, b2, &e);
            KV_CHECK(rc == KV_OK && !memcmp(a, b2, sizeof(float) * V),
                     "%s %s: paged logits == contiguous, bit for bit (%s)", fn, sn,
                     rc ? e.msg : "");
            KV_CHECK(pg->mem->paged->pool.n_used == (48 + 4 + 7) / 8 &&
                         pg->mem->paged->tables[0].n_blocks == (48 + 4 + 7) / 8,
                     "%s %s: the table stopped at ceil((S+W)/B) = 7 blocks (%d used)", fn, sn,
                     pg->mem->paged->pool.n_used);
            if (fmts[f] != KV_QF_FP8_E4M3) {
                rc = run_stream(tk, tok, N, single, 1, b2, &e);
                KV_CHECK(rc == KV_OK && !memcmp(a, b2, sizeof(float) * V),
                         "%s %s: chunked prefill == token by token, bit for bit", fn, sn);
            }
            KV_CHECK(ct->length(ct, 0) == N && pg->length(pg, 0) == N, "lengths count positions");
            kv_backend_destroy(ct);
            kv_backend_destroy(pg);
            kv_backend_destroy(tk);
        }

    /* a window no shorter than the context is no window at all, in both schemes */
    for (int scheme = 0; scheme < 2; scheme++) {
        kv_backend *w = NULL, *fu = NULL;
        kv_cache_spec sw = window_spec(KV_QF_F32, 0, 0, 690, 10, scheme, N);
        kv_cache_spec sf = kv_cache_spec_default(1, N);
        if (kv_backend_cpu(&w, &m, &sw, &e) || kv_backend_cpu(&fu, &m, &sf, &e)) {
            KV_CHECK(0, "backends: %s", e.msg);
            break;
        }
        const int steps[] = {100, 1, 33};
        run_stream(w, tok, N, steps, 3, a, &e);
        run_stream(fu, tok, N, steps, 3, b2, &e);
        KV_CHECK(!memcmp(a, b2, sizeof(float) * V), "%s: S+W = N gives the full cache's logits "
                 "bit for bit", kv_window_scheme_name(scheme));
        kv_backend_destroy(w);
        kv_backend_destroy(fu);
    }

    /* fork and prefix caching of a windowed sequence are refused, named */
    kv_cache_spec sp = window_spec(KV_QF_F16, 1, 8, 32, 4, 0, 4096);
    sp.n_slots = 2;
    kv_backend *pg = NULL;
    if (!kv_backend_cpu(&pg, &m, &sp, &e)) {
        kv_seq s = {0, 0, 40, tok};
        KV_CHECK(pg->forward(pg, &s, 1, NULL, NULL, &e) == KV_OK, "paged window step: %s", e.msg);
        KV_CHECK(kv_paged_fork(pg->mem, 1, 0, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "window"),
                 "fork refused: %s", e.msg);
        int hit = 0;
        kv_backend_enable_prefix_cache(pg, &e);
        KV_CHECK(kv_paged_match_prefix(pg->mem, 1, tok, 40, &hit, &e) == KV_ERR_UNSUPPORTED,
                 "prefix cache refused: %s", e.msg);
        kv_backend_destroy(pg);
    }

    /* counters: per-token work stops growing once the window is full */
    kv_counters c1 = {0}, c2 = {0};
    kv_cache_spec sw = window_spec(KV_QF_F32, 0, 0, 100, 4, 0, 1 << 20);
    kv_seq early = {0, 1000, 1, tok}, late = {0, 900000, 1, tok};
    kv_counters_add_step(&c1, &cfg, &sw, &early, 1);
    kv_counters_add_step(&c2, &cfg, &sw, &late, 1);
    KV_CHECK(c1.flops_attn == c2.flops_attn && c1.kv_bytes_read == 2.0 * 2 * 2 * 16 * 4 * 104,
             "attention work at 1000 == at 900000 (S+W = 104 positions: %g bytes)",
             c1.kv_bytes_read);
    free(a);
    free(b2);
    kv_model_free(&m);
}

/* ---- no drift over a long stream -------------------------------------------------------- */

static void test_drift(long n_tokens)
{
    kv_config cfg = model_config(1);
    kv_model m;
    kv_err e;
    if (kv_test_model_random(&m, &cfg, 707)) return;
    const int W = 60, S = 4, K = S + W, V = cfg.vocab_size;
    kv_backend *st = NULL, *fresh = NULL;
    kv_cache_spec ss = window_spec(KV_QF_F32, 1, 16, W, S, KV_POS_CACHE, 1 << 24);
    kv_cache_spec sf = kv_cache_spec_default(1, K);
    if (kv_backend_cpu(&st, &m, &ss, &e) || kv_backend_cpu(&fresh, &m, &sf, &e)) {
        KV_CHECK(0, "backends: %s", e.msg);
        return;
    }
    int *ring = malloc(sizeof(int) * K); /* the retained tokens, in cache order */
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    kv_rng r;
    kv_rng_seed(&r, 9);
    long checks = 0, bad = 0;
    double t0 = kv_now();
    for (long p = 0; p < n_tokens; p++) {
        int t = (int)(kv_rng_u32(&r) % V);
        const int64_t row = kv_window_row(W, S, p); /* the token's row: its slot in ring[] */
        ring[row] = t;
        const int check = p == n_tokens - 1 || (p >= K && p % 99991 == 0);
        kv_seq s = {0, (int)p, 1, &t};
        if (st->forward(st, &s, 1, check ? a : NULL, NULL, &e)) {
            KV_CHECK(0, "stream step %ld: %s", p, e.msg);
            bad++;
            break;
        }
        if (!check) continue;
        /* the retained tokens in position order: sinks, then the ring from its oldest row */
        int seq[256];
        const int n = (int)kv_window_count(W, S, p);
        for (int i = 0; i < n; i++) seq[i] = ring[kv_window_row(W, S, kv_window_pos(W, S, p, i))];
        kv_seq f = {0, 0, n, seq};
        fresh->reset(fresh, 0);
        if (fresh->forward(fresh, &f, 1, b, NULL, &e) || memcmp(a, b, sizeof(float) * V)) bad++;
        checks++;
    }
    KV_CHECK(bad == 0 && checks > 0, "after %ld streamed tokens: %ld of %ld checks differ from a "
             "fresh cache holding only the %d retained tokens", n_tokens, bad, checks, K);
    KV_CHECK(st->mem->paged->pool.n_used == (K + 15) / 16, "still %d blocks after %ld tokens",
             st->mem->paged->pool.n_used, n_tokens);
    printf("stream of %ld tokens (window %d, %d sinks, cache positions): %.0f tokens/s, %d "
           "blocks held\n",
           n_tokens, W, S, n_tokens / (kv_now() - t0), st->mem->paged->pool.n_used);
    free(ring);
    free(a);
    free(b);
    kv_backend_destroy(st);
    kv_backend_destroy(fresh);
    kv_model_free(&m);
}

int main(int argc, char **argv)
{
    const int slow = argc > 1 && !strcmp(argv[1], "slow");
    double t0 = kv_now();
    test_maps();
    test_specs();
    test_attention();
    test_forward();
    test_drift(slow ? 1000003L : 20000L);
    printf("test_window: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
