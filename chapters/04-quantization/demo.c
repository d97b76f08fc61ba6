/*
 * Chapter 04 demo (and `kvlab bench quant`): KV-cache formats side by side.
 *
 * For each format, one row of measurements against the fp32 cache:
 *   bytes per token   L · 2 · H_kv · d · b (b with metadata, kv_cache_spec_bytes_per_element())
 *   K, V error        ‖x − deq(q(x))‖ / ‖x‖ over the cache of a fp32 prefill (every layer)
 *   attn error        ‖o − o_fp32‖ / ‖o_fp32‖ of attention at the last position, every layer
 *   KL, top-1         mean KL(p_fp32 ‖ p_fmt) and greedy agreement over a teacher-forced
 *                     generation (the fp32 model's own greedy text)
 *   needles           recall models (direct + induction), one context, depths 0/50/100
 *   attn time         median decode-attention time over a cache of N tokens (one layer)
 * Model: a random Llama-style model, d = 64 (KIVI needs 32 | d), L 4, H 8, H_kv 4; the
 * needles use the constructed recall models (their results are properties of the
 * construction; see the README).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_attention.h"
#include "kv_forward.h"
#include "kv_needle.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "measure.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

/* The study's lengths: the prompt of the generation, the teacher-forced decode steps
 * measured, one needle context. tour --quick takes the second set: fewer steps and a shorter
 * needle context. Its 40 tokens stay inside KIVI's default window of 128 (int4, int2 keep
 * every row in fp32 there); int2/w32 still spills key groups through the same path. */
typedef struct {
    int prompt, steps, needle;
} q_sizes;
static const q_sizes q_full = {64, 128, 512}, q_quick = {32, 8, 96};
#define Q_NEEDLE 512 /* the longest needle context */

static const char *const variants[] = {
    "fp32", "fp16", "bf16", "int8", "int8-g32", "fp8-e4m3", "fp8-e4m3/head", "fp8-e5m2",
    "int4", "int2", "int4/l0,1", "int2/w32",
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

typedef struct {
    double bytes_token, k_err, v_err, attn_err, kl, time_ms, gbs;
    int top1, needles, needle_cells;
} q_row;

static kv_config study_config(void)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = 512;
    c.hidden_dim = 1024;
    c.n_layers = 4;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.vocab_size = 512;
    c.seq_len = 8192;
    kv_config_set_defaults(&c);
    return c;
}

/* K/V reconstruction and attention error: the fp32 cache's rows written into the format. */
static int part_errors(const kv_model *m, const kv_cache *ref, const kv_cache_spec *spec,
                       int n, q_row *r, kv_err *err)
{
    const kv_config *cfg = &m->config;
    const int d = kv_config_head_dim(cfg), Hkv = cfg->n_kv_heads, H = cfg->n_heads;
    kv_cache c;
    int st = kv_cache_create(&c, cfg, spec, err);
    if (st) return st;
    float *k = malloc(sizeof(float) * n * Hkv * d), *v = malloc(sizeof(float) * n * Hkv * d);
    float *row = malloc(sizeof(float) * d), *q = malloc(sizeof(float) * H * d);
    float *o = malloc(sizeof(float) * H * d), *o32 = malloc(sizeof(float) * H * d);
    if (!k || !v || !row || !q || !o || !o32) st = kv_fail(err, KV_ERR_NOMEM, "demo: memory");
    double ek = 0, nk = 0, ev = 0, nv = 0, ea = 0, na = 0;
    for (int l = 0; l < cfg->n_layers && !st; l++) {
        for (int t = 0; t < n; t++) /* [n][H_kv][d] from the fp32 cache's [H_kv][capacity][d] */
            for (int h = 0; h < Hkv; h++) {
                memcpy(k + ((size_t)t * Hkv + h) * d, kv_cache_k(ref, l, 0, h) + (size_t)t * d, sizeof(float) * d);
                memcpy(v + ((size_t)t * Hkv + h) * d, kv_cache_v(ref, l, 0, h) + (size_t)t * d, sizeof(float) * d);
            }
        st = kv_cache_write_seq(&c, l, 0, 0, n, k, v, err);
        for (int h = 0; h < Hkv && !st; h++)
            for (int role = 0; role < 2; role++) {
                const kv_head_view hv = kv_cache_view(&c, l, 0, h, role);
                const float *x = role ? k : v;
                for (int t = 0; t < n; t++) {
                    kv_attn_row(&hv, t, row);
                    for (int j = 0; j < d; j++) {
                        const double xv = x[((size_t)t * Hkv + h) * d + j], e = row[j] - xv;
                        if (role) { ek += e * e; nk += xv * xv; } else { ev += e * e; nv += xv * xv; }
                    }
                }
            }
        /* a query that looks like this model's: the last token's keys, one per query head */
        for (int h = 0; h < H && !st; h++)
            memcpy(q + (size_t)h * d, k + ((size_t)(n - 1) * Hkv + kv_attn_kv_head(h, H, Hkv)) * d,
                   sizeof(float) * d);
        if (!st && (kv_attention(&c, l, 0, n - 1, q, o, H) || kv_attention(ref, l, 0, n - 1, q, o32, H)))
            st = kv_fail(err, KV_ERR_NOMEM, "demo: attention scratch");
        for (int i = 0; i < H * d && !st; i++) {
            ea += (o[i] - o32[i]) * (double)(o[i] - o32[i]);
            na += (double)o32[i] * o32[i];
        }
    }
    r->k_err = sqrt(ek / nk);
    r->v_err = sqrt(ev / nv);
    r->attn_err = sqrt(ea / na);
    free(k); free(v); free(row); free(q); free(o); free(o32);
    kv_cache_free(&c);
    return st;
}

/* KL and top-1 over a teacher-forced generation of n->steps after n->prompt on @p device;
 * ref_logits [steps][V] from the fp32 run (filled when @p ref is 1). */
static int part_generation(const kv_model *m, const char *device, const kv_cache_spec *spec,
                           const int *text, const q_sizes *n, float *ref_logits, int ref,
                           q_row *r, kv_err *err)
{
    const int V = m->config.vocab_size;
    kv_backend *b = NULL;
    int st = kv_cli_backend(&b, device, m, spec, err);
    float *lg = malloc(sizeof(float) * V);
    if (!st && !lg) st = kv_fail(err, KV_ERR_NOMEM, "demo: logits");
    const int steps = n->steps;
    kv_seq s = {0, 0, n->prompt, text};
    double kl = 0;
    int agree = 0;
    for (int t = 0; t < steps && !st; t++) {
        st = b->forward(b, &s, 1, lg, NULL, err);
        if (st) break;
        const float *lr = ref_logits + (size_t)t * V;
        if (ref) memcpy(ref_logits + (size_t)t * V, lg, sizeof(float) * V);
        double mr = -1e30, mq = -1e30, zr = 0, zq = 0, klt = 0;
        int ar = 0, aq = 0;
        for (int i = 0; i < V; i++) {
            if (lr[i] > lr[ar]) ar = i;
            if (lg[i] > lg[aq]) aq = i;
            mr = fmax(mr, lr[i]);
            mq = fmax(mq, lg[i]);
        }
        for (int i = 0; i < V; i++) { zr += exp(lr[i] - mr); zq += exp(lg[i] - mq); }
        for (int i = 0; i < V; i++) {
            const double pr = exp(lr[i] - mr) / zr;
            klt += pr * ((lr[i] - mr - log(zr)) - (lg[i] - mq - log(zq)));
        }
        kl += klt;
        agree += ar == aq;
        s = (kv_seq){0, n->prompt + t, 1, text + n->prompt + t};
    }
    r->kl = kl / steps;
    r->top1 = agree;
    if (b) kv_backend_destroy(b);
    free(lg);
    return st;
}

/* Needles found, both recall models, one context of @p len tokens (at most Q_NEEDLE), depths
 * 0/50/100. */
static int part_needles(const kv_model *rm, const char *device, const char *variant, int len,
                        q_row *r, kv_err *err)
{
    const int depths[] = {0, 50, 100};
    static int tok[Q_NEEDLE];
    r->needles = r->needle_cells = 0;
    for (int kind = 0; kind < 2; kind++) {
        kv_needle_item it[3];
        kv_needle_result res[3];
        kv_cache_spec spec;
        kv_backend *b = NULL;
        const int k = kind ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
        int st = kv_needle_cache_spec(variant, 1, len + 8, &spec, err);
        if (!st) st = kv_needle_build(k, len, depths, 3, 1, tok, it, err);
        if (!st) st = kv_cli_backend(&b, device, &rm[kind], &spec, err);
        if (!st) st = kv_needle_run(b, 0, k, tok, len, it, 3, 0, res, NULL, NULL, 0, 0, err);
        for (int i = 0; i < 3 && !st; i++) r->needles += res[i].pass;
        r->needle_cells += 3;
        if (b) kv_backend_destroy(b);
        if (st) return st;
    }
    return KV_OK;
}

/* Median decode-attention time: one query token over N cached tokens of one layer. */
static int part_time(const kv_config *cfg, const char *device, const kv_cache_spec *spec0, int N,
                     int repeats, q_row *r, kv_err *err)
{
    const int d = kv_config_head_dim(cfg), Hkv = cfg->n_kv_heads, H = cfg->n_heads;
    kv_cache_spec spec = *spec0;
    spec.capacity = N;
    kv_config one = *cfg;
    one.n_layers = 1;
    spec.quant.dtype_layers = spec0->quant.dtype_layers & 1; /* the one layer's format as in layer 0 */
    float *k = malloc(sizeof(float) * N * Hkv * d), *v = malloc(sizeof(float) * N * Hkv * d);
    float *q = malloc(sizeof(float) * H * d), *o = malloc(sizeof(float) * H * d);
    double *ts = malloc(sizeof(double) * repeats);
    int st = (!k || !v || !q || !o || !ts) ? kv_fail(err, KV_ERR_NOMEM, "demo: memory") : KV_OK;
    kv_rng g;
    kv_rng_seed(&g, 9);
    for (int64_t i = 0; i < (int64_t)N * Hkv * d && !st; i++) {
        k[i] = kv_rng_normal(&g);
        v[i] = kv_rng_normal(&g);
    }
    for (int i = 0; i < H * d && !st; i++) q[i] = kv_rng_normal(&g) * 0.1f;
    if (!st && !strcmp(device, "cpu")) {
        kv_cache c;
        st = kv_cache_create(&c, &one, &spec, err);
        if (!st) st = kv_cache_write_seq(&c, 0, 0, 0, N, k, v, err);
        for (int i = -1; i < repeats && !st; i++) {
            const double t0 = kv_now();
            st = kv_attention(&c, 0, 0, N - 1, q, o, H);
            if (i >= 0) ts[i] = kv_now() - t0; /* the first call warms up */
        }
        kv_cache_free(&c);
    }
#ifdef KV_HAVE_CUDA
    else if (!st) {
        kvcu_cache *c = NULL;
        float *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
        const size_t kb = sizeof(float) * N * Hkv * d;
        st = kvcu_cache_create(&c, &one, &spec, err);
        if (!st) st = kvcu_malloc((void **)&dk, kb, err);
        if (!st) st = kvcu_malloc((void **)&dv, kb, err);
        if (!st) st = kvcu_malloc((void **)&dq, sizeof(float) * H * d, err);
        if (!st) st = kvcu_malloc((void **)&dout, sizeof(float) * H * d, err);
        if (!st) st = kvcu_upload(dk, k, kb, err);
        if (!st) st = kvcu_upload(dv, v, kb, err);
        if (!st) st = kvcu_upload(dq, q, sizeof(float) * H * d, err);
        if (!st) st = kvcu_cache_write_seq(c, 0, 0, 0, N, dk, dv, err);
        for (int i = -1; i < repeats && !st; i++) {
            const double t0 = kv_now();
            st = kvcu_cache_attention(c, 0, 0, N - 1, dq, dout, H, err); /* synchronous */
            if (i >= 0) ts[i] = kv_now() - t0;
        }
        kvcu_free(dk); kvcu_free(dv); kvcu_free(dq); kvcu_free(dout);
        kvcu_cache_free(c);
    }
#endif
    if (!st) { /* bytes read: 2 · H_kv · N · d · b (the layer's b, metadata included) */
        r->time_ms = kv_median(ts, repeats) * 1e3;
        r->gbs = 2.0 * Hkv * N * d * kv_cache_spec_bytes_per_element(&spec, 1, d) /
                 (r->time_ms * 1e-3) * 1e-9;
    }
    free(k); free(v); free(q); free(o); free(ts);
    return st;
}

/* Exercise 1's hook (--outlier-channels C): multiply the Wk rows of the last C key channels of
 * every KV head in every layer by `scale`, so those channels of every key are that many times
 * larger (KIVI's empirical finding on trained models: a few key channels carry most of the
 * magnitude). The last channels are RoPE's slowest pairs (angle pos · theta^(-(d-2)/d)), so
 * they stay outliers after rotation.  wk [L][H_kv*d][dim]. */
static void outlier_keys(kv_model *m, int channels, float scale)
{
    const kv_config *c = &m->config;
    const int d = kv_config_head_dim(c), kvdim = kv_config_kv_dim(c), dim = c->dim;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++)
            for (int j = d - channels; j < d; j++) {
                float *row = m->w.wk + ((size_t)l * kvdim + (size_t)h * d + j) * dim;
                for (int i = 0; i < dim; i++) row[i] *= scale;
            }
}

int kv_quant_study(FILE *f, const char *device, int csv, int N, int repeats, int needles,
                   int quick, int outliers, kv_model *model, const char *model_name,
                   kv_err *err)
{
    const q_sizes *n = quick ? &q_quick : &q_full;
    const int prompt = n->prompt, steps = n->steps;
    kv_config cfg = study_config();
    kv_model m, rm[2];
    memset(&m, 0, sizeof m);
    memset(rm, 0, sizeof rm);
    int st;
    if (model) { /* a user's model: its own shape (its weights borrowed, its Wk changed by
                  * --outlier-channels); formats it cannot take are refused */
        if ((st = kv_config_require_gqa(&model->config, "--model", err))) return st;
        m = *model;
        cfg = m.config;
    } else {
        st = kv_model_alloc(&m, &cfg, err);
        if (st) return st;
        kv_model_randomize(&m, 404);
    }
    const int V = cfg.vocab_size, d = kv_config_head_dim(&cfg);
    if (outliers < 0 || outliers > d) {
        if (!model) kv_model_free(&m);
        return kv_fail(err, KV_ERR_ARG, "--outlier-channels %d: the head has %d channels",
                       outliers, d);
    }
    outlier_keys(&m, outliers, 20.0f);
    if (prompt + steps > cfg.seq_len) {
        if (!model) kv_model_free(&m);
        return kv_fail(err, KV_ERR_ARG, "the model's seq_len %d is below the %d tokens the study "
                       "generates", cfg.seq_len, prompt + steps);
    }
    int *text = malloc(sizeof(int) * (prompt + steps));
    float *ref = malloc(sizeof(float) * steps * V);
    if (!text || !ref) st = kv_fail(err, KV_ERR_NOMEM, "demo: memory");
    for (int kind = 0; kind < 2 && needles && !st; kind++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT);
        st = kv_recall_build(&rm[kind], &o, err);
    }
    /* the text: a seeded prompt, then the fp32 model's own greedy continuation */
    kv_cache ref_cache;
    memset(&ref_cache, 0, sizeof ref_cache);
    kv_state s;
    kv_state_init(&s);
    kv_cache_spec s32 = kv_cache_spec_default(1, prompt + steps);
    if (!st) st = kv_cache_create(&ref_cache, &cfg, &s32, err);
    if (!st) {
        kv_rng g;
        kv_rng_seed(&g, 4);
        for (int i = 0; i < prompt; i++) text[i] = (int)(kv_rng_u32(&g) % (uint32_t)V);
        float *lg = malloc(sizeof(float) * V);
        kv_seq q = {0, 0, prompt, text};
        for (int t = 0; t < steps && !st && lg; t++) {
            st = kv_forward(&m, &ref_cache, &s, &q, 1, lg, NULL, err);
            int best = 0;
            for (int i = 1; i < V; i++) if (lg[i] > lg[best]) best = i;
            text[prompt + t] = best;
            q = (kv_seq){0, prompt + t, 1, text + prompt + t};
        }
        if (!lg) st = kv_fail(err, KV_ERR_NOMEM, "demo: logits");
        free(lg);
    }
    const int n_err = prompt + steps - 1; /* tokens in the reference cache */
    if (!st && !csv) {
        if (outliers)
            fprintf(f, "Outlier keys: Wk rows of key channels %d..%d of every KV head x20 "
                    "(--outlier-channels %d).\n", d - outliers, d - 1, outliers);
        fprintf(f, "%s: L %d, H %d, H_kv %d, d %d; %d-token prefill + %d teacher-forced "
                "steps on %s; needles: recall models, %d tokens, depths 0/50/100 (constructed: "
                "see README); attention time: one layer, N = %d, median of %d.\n\n",
                model ? model_name : "Random model", cfg.n_layers, cfg.n_heads,
                cfg.n_kv_heads, d, prompt, steps, device,
                n->needle, N, repeats);
        fprintf(f, "%-14s %8s %9s %9s %9s %10s %7s %7s %9s %7s\n", "format", "B/token", "K err",
                "V err", "attn err", "KL", "top-1", "needles", "attn ms", "GB/s");
    } else if (!st) {
        kv_csv_printf(f, "format,bytes_per_token,k_rel_err,v_rel_err,attn_rel_err,kl,top1,steps,"
                         "needles,needle_cells,attn_ms,attn_gb_per_s,N\n");
    }
    for (int i = 0; i < N_VARIANTS && !st; i++) {
        q_row r;
        memset(&r, 0, sizeof r);
        kv_cache_spec spec;
        st = kv_needle_cache_spec(variants[i], 1, prompt + steps, &spec, err);
        if (st) break;
        kv_err why;
        if (kv_cache_spec_check("cache", &cfg, &spec, &why)) { /* e.g. KIVI needs 32 | d */
            kv_table_printf(f, csv, csv ? "%s,refused,,,,,,,,,,,\n" : "%-14s refused: %s\n",
                            variants[i], why.msg);
            continue;
        }
        r.bytes_token = cfg.n_layers * 2.0 * cfg.n_kv_heads * d *
                        kv_cache_spec_bytes_per_element(&spec, cfg.n_layers, d);
        fprintf(stderr, "  [ch04] %s ...\n", variants[i]);
        st = part_errors(&m, &ref_cache, &spec, n_err, &r, err);
        if (!st) st = part_generation(&m, device, &spec, text, n, ref, i == 0, &r, err);
        if (!st && needles) st = part_needles(rm, device, variants[i], n->needle, &r, err);
        if (!st) st = part_time(&cfg, device, &spec, N, repeats, &r, err);
        if (st) break;
        char nd[16] = "-";
        if (needles) snprintf(nd, sizeof nd, "%d/%d", r.needles, r.needle_cells);
        if (csv)
            kv_csv_printf(f, "%s,%.1f,%.3e,%.3e,%.3e,%.3e,%d,%d,%d,%d,%.4f,%.3f,%d\n", variants[i],
                          r.bytes_token, r.k_err, r.v_err, r.attn_err, r.kl, r.top1, steps,
                          r.needles, r.needle_cells, r.time_ms, r.gbs, N);
        else
            fprintf(f, "%-14s %8.0f %9.2e %9.2e %9.2e %10.2e %3d/%-3d %7s %9.3f %7.2f\n",
                    variants[i], r.bytes_token, r.k_err, r.v_err, r.attn_err, r.kl, r.top1,
                    steps, nd, r.time_ms, r.gbs);
    }
    if (!st && !csv)
        fprintf(f, "\nB/token = L*2*H_kv*d*b with metadata (KIVI's fp32 window and fp8's scales are "
                "fixed costs per sequence, not per token: kvlab calc). Errors are relative RMS over "
                "every layer; KL(p_fp32 || p_format) in nats per step. GB/s = K/V bytes read "
                "(2*H_kv*N*d*b) / attention time.\n");
    kv_state_free(&s);
    kv_cache_free(&ref_cache);
    if (!model) kv_model_free(&m);
    kv_model_free(&rm[0]);
    kv_model_free(&rm[1]);
    free(text);
    free(ref);
    return st;
}

int kv_demo_ch04(const kv_demo_ctx *ctx, kv_err *err)
{
    if (!ctx->csv)
        fprintf(ctx->out, "KV-cache formats against the fp32 cache (kvlab bench quant for larger N "
                "and more repeats).\n");
    /* tour --quick: a cache of 256 tokens timed once */
    return kv_quant_study(ctx->out, ctx->device, ctx->csv, ctx->quick ? 256 : 2048,
                          ctx->quick ? 1 : 5, 1, ctx->quick, 0, NULL, NULL, err);
}
