/*
 * Chapter 03 demo: fewer KV heads than query heads.
 *
 *  1. the bill: per-token cache bytes of every preset as MHA, GQA (H/8) and MQA;
 *  2. GQA is MHA with shared rows: tiny-gqa and its duplicated-MHA twin, logits compared;
 *  3. decode attention time and bytes per G on the chosen device (GPU: kernels v1 and v2);
 *  4. MHA → GQA by mean-pooling, for G = 1, 2, 4, 8: each row's outcome predicted before it
 *     is measured (KL, top-1 agreement, needles found), on a random model and on the recall
 *     models (constructed: the predictions there are properties of the construction).
 * Part 4 runs on the CPU whatever the device: kv_convert_compare() is a CPU measurement.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kv_config.h"
#include "kv_convert.h"
#include "kv_heads.h"
#include "kv_needle.h"
#include "kv_rng.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#define CH03_COMPARE 128 /* teacher-forced tokens per KL / top-1 measurement */
#define CH03_NEEDLE_LEN 384
/* tour --quick: the same rows over shorter texts (the recall rows' predictions are properties
 * of the construction, which hold at any context length) */
#define CH03_COMPARE_QUICK 16
#define CH03_NEEDLE_LEN_QUICK 48
#define CH03_WIDE_HEADS 8

static void seeded_tokens(int *t, int n, int vocab, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = (int)(kv_rng_u32(&r) % (uint32_t)vocab);
}

/* 2: tiny-gqa against the MHA model that holds a copy of each KV head per query head */
static int part_equivalence(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    kv_model gqa = {0}, dup = {0};
    int tok[CH03_COMPARE];
    const int n = ctx->quick ? CH03_COMPARE_QUICK : CH03_COMPARE;
    kv_convert_diff df = {0};
    int st = kv_cli_default_model(&gqa, "tiny-gqa", err);
    if (!st) st = kv_convert_expand_kv_heads(&dup, &gqa, gqa.config.n_heads, err);
    if (!st) seeded_tokens(tok, n, gqa.config.vocab_size, 1);
    if (!st) st = kv_convert_compare(&gqa, &dup, tok, n, &df, err);
    if (!st && !ctx->csv) {
        char a[32], b[32];
        const kv_config *c = &gqa.config;
        const int d = kv_config_head_dim(c);
        fprintf(f, "\n2. GQA = MHA with each K/V head copied across its group (tiny-gqa, H %d, "
                "H_kv %d, G %d)\n", c->n_heads, c->n_kv_heads,
                kv_heads_group(c->n_heads, c->n_kv_heads));
        fprintf(f, "   predicted: identical logits (each query head reads the same numbers)\n");
        fprintf(f, "   measured over %d tokens: %s (max |diff| %g); cache per token %s (GQA) vs "
                "%s (its MHA twin)\n", df.positions, df.identical ? "bit-identical" : "DIFFERENT",
                df.max_abs, kv_fmt_bytes((double)c->n_layers * 2 * c->n_kv_heads * d * 4, a, sizeof a),
                kv_fmt_bytes((double)c->n_layers * 2 * c->n_heads * d * 4, b, sizeof b));
    }
    if (!st && !df.identical)
        st = kv_fail(err, -1, "tiny-gqa and its duplicated-MHA twin gave different logits");
    kv_model_free(&gqa);
    kv_model_free(&dup);
    return st;
}

/* A study model: its name, the MHA model, and for recall models the needle kind (0: none). */
typedef struct {
    const char *name;
    kv_model mha;
    int kind;
} study;

/* The recall model made MHA (K/V duplicated) and widened to 8 heads (kv_convert_widen). */
static int wide_recall(kv_model *out, int kind, kv_err *err)
{
    kv_recall_opts o;
    kv_recall_opts_default(&o, kind);
    kv_model r = {0}, mha = {0};
    int st = kv_recall_build(&r, &o, err);
    if (!st) st = kv_convert_expand_kv_heads(&mha, &r, r.config.n_heads, err);
    if (!st) st = kv_convert_widen(out, &mha, CH03_WIDE_HEADS, 77, err);
    kv_model_free(&r);
    kv_model_free(&mha);
    return st;
}

/* Needles found out of 3 (depths 0/50/100 %) in one context of @p len tokens (CPU). */
static int needles_found(const kv_model *m, int kind, int len, int *found, kv_err *err)
{
    const int depths[] = {0, 50, 100};
    int tok[CH03_NEEDLE_LEN]; /* len <= CH03_NEEDLE_LEN */
    kv_needle_item it[3];
    kv_needle_result res[3];
    kv_backend *b = NULL;
    kv_cache_spec spec = kv_cache_spec_default(1, len + 8);
    int st = kv_needle_build(kind, len, depths, 3, 5, tok, it, err);
    if (!st) st = kv_backend_cpu(&b, m, &spec, err);
    if (!st) st = kv_needle_run(b, 0, kind, tok, len, it, 3, 0, res, NULL, NULL, 0, 0, err);
    *found = 0;
    for (int i = 0; i < 3 && !st; i++) *found += res[i].pass;
    if (b) kv_backend_destroy(b);
    return st;
}

/* 4: pool each study model to G = 1, 2, 4, 8 and measure; predictions printed beside */
static int part_conversion(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    const int n_cmp = ctx->quick ? CH03_COMPARE_QUICK : CH03_COMPARE;
    const int n_needle = ctx->quick ? CH03_NEEDLE_LEN_QUICK : CH03_NEEDLE_LEN;
    study s[3];
    memset(s, 0, sizeof s);
    s[0].name = "random";
    s[1].name = "recall direct";
    s[1].kind = KV_MODEL_RECALL_DIRECT;
    s[2].name = "recall induction";
    s[2].kind = KV_MODEL_RECALL_INDUCTION;
    kv_config c;
    int st = kv_config_default(KV_DEFAULT_TINY, &c, err);
    /* tiny's shape with 8 heads of d 16, so G reaches 8 */
    c.dim = 128; c.n_heads = c.n_kv_heads = 8; c.hidden_dim = 344; c.rotary_dim = 16;
    if (!st) st = kv_model_alloc(&s[0].mha, &c, err);
    if (!st) kv_model_randomize(&s[0].mha, 33);
    for (int i = 1; i < 3 && !st; i++) st = wide_recall(&s[i].mha, s[i].kind, err);
    if (st) goto done;

    if (ctx->csv)
        kv_csv_printf(f,
                      "model,G,H_kv,kl_mean,kl_max,top1_agree,identical,needles_found,predicted\n");
    else {
        fprintf(f, "\n4. MHA -> GQA by mean-pooling K/V heads (Ainslie et al. 2023), no uptraining.\n"
                   "   KL(original || pooled) mean over %d teacher-forced tokens, top-1 agreement,\n"
                   "   and needles found (3 per context, depths 0/50/100%%, %d tokens; recall only).\n"
                   "   'predicted' was derived before measuring (README, 'What the demo measured');\n"
                   "   recall rows are properties of the constructed model, labelled [constructed].\n\n",
                n_cmp, n_needle);
        fprintf(f, "%-17s %2s %4s %10s %10s %7s %8s  %s\n", "model", "G", "H_kv", "KL mean",
                "KL max", "top-1", "needles", "predicted");
    }
    int held = 1;
    for (int i = 0; i < 3 && !st; i++) {
        int tok[CH03_COMPARE];
        seeded_tokens(tok, n_cmp, s[i].mha.config.vocab_size, 2);
        for (int G = 1; G <= 8 && !st; G *= 2) {
            kv_model p = {0};
            kv_convert_diff df = {0};
            int found = -1;
            st = kv_convert_pool_kv_heads(&p, &s[i].mha, CH03_WIDE_HEADS / G, err);
            if (!st) st = kv_convert_compare(&s[i].mha, &p, tok, n_cmp, &df, err);
            if (!st && s[i].kind) st = needles_found(&p, s[i].kind, n_needle, &found, err);
            kv_model_free(&p);
            if (st) break;
            const char *pred;
            int ok;
            if (G == 1) {
                pred = s[i].kind ? "identical, 3/3" : "identical";
                ok = df.identical && (!s[i].kind || found == 3);
            } else if (!s[i].kind) {
                pred = "changed, more with G";
                ok = df.kl_mean > 0.0;
            } else if (G == 2) {
                pred = "identical, 3/3 [constructed]";
                ok = df.identical && found == 3;
            } else {
                pred = "0/3: value halved < tau [constructed]";
                ok = found == 0;
            }
            held &= ok;
            if (ctx->csv)
                kv_csv_printf(f, "%s,%d,%d,%.6g,%.6g,%.4f,%d,%d,%s\n", s[i].name, G,
                              CH03_WIDE_HEADS / G, df.kl_mean, df.kl_max, df.top1_agree,
                              df.identical, found, pred);
            else {
                char nd[16] = "-";
                if (found >= 0) snprintf(nd, sizeof nd, "%d/3", found);
                fprintf(f, "%-17s %2d %4d %10.3g %10.3g %6.1f%% %8s  %s%s\n", s[i].name, G,
                        CH03_WIDE_HEADS / G, df.kl_mean, df.kl_max, 100.0 * df.top1_agree, nd,
                        pred, ok ? "" : "  <- NOT as predicted");
            }
        }
    }
    if (!st && !held) st = kv_fail(err, -1, "a conversion row did not match its prediction");
done:
    for (int i = 0; i < 3; i++) kv_model_free(&s[i].mha);
    return st;
}

int kv_demo_ch03(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    if (!ctx->csv) {
        fprintf(f, "1. the cache bill: only H_kv enters it (fp16, N = 32768, one sequence)\n\n");
        kv_calc_heads_table(f, "fp16", 32768, 1);
    }
    int st = part_equivalence(ctx, err);
    if (st) return st;

    /* 3: the emulated GPU proves the kernels, not speed: a short context there, as in
     * tour --quick */
    int emulated = 0;
#ifdef KV_HAVE_CUDA
    emulated = strcmp(ctx->device, "cpu") != 0 && kvcu_is_emulation();
#endif
    const int small = emulated || ctx->quick;
    const int N = small ? 256 : 4096;
    if (!ctx->csv)
        fprintf(f, "\n3. decode attention per G: H 32, d 128 (Llama-2-7B's layer), N %d; fp32\n"
                   "   predicted: the FLOPs (4*H*N*d) do not change with G, the bytes (2*H_kv*N*d*4,\n"
                   "   G/2 FLOPs per byte) do. Bandwidth-bound (a GPU: hundreds of FLOPs per byte\n"
                   "   before compute limits) -> time ~1/G; compute-bound (a CPU of few cores, whose\n"
                   "   FLOP/s per GB/s is near G/2 already) -> flat. GPU v1 reads 2*H*N*d*4 at any G\n\n",
                N);
    st = kv_attn_gqa_table(f, ctx->device, 32, 128, N, small ? 1 : 5, ctx->csv, err);
    if (st) return st;
    if (emulated && !ctx->csv)
        fprintf(f, "(emulation build: times of CPU fibers running the kernels, not of a GPU; the\n"
                   " bytes are what a GPU would read)\n");
    return part_conversion(ctx, err);
}
