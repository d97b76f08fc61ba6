/* Chapter 03 on the CPU: grouped-query attention and MHA → GQA conversion.
 *
 * Predicted before measured (chapters/03-mqa-gqa/README.md derives each):
 *  - GQA attention equals MHA attention whose K/V heads are duplicated across each group, bit
 *    for bit (the same per-head routine sees the same numbers), for G = 1, 2, 4, 8, H.
 *  - query head h reads KV head h / G, nothing else;
 *  - pooling with G = 1 is the identity; pooling a model whose K/V heads are duplicated gives
 *    back the GQA model exactly, and the same logits;
 *  - random model (independent heads): every G > 1 changes the output, more for larger G;
 *  - widened recall model (constructed: heads 0 and 1 share the retrieval K/V, heads 2.. are
 *    random readers with no output): G = 2 leaves the logits bit-identical and every needle
 *    found; G = 4 pools the retrieval K/V with two random heads, halving the retrieved value
 *    below the "ok" threshold, so every needle is lost; G = 8 likewise. */
#include "common/kv_test.h"

#include "kv_attention.h"
#include "kv_checkpoint.h"
#include "kv_convert.h"
#include "kv_needle.h"
#include "kv_rng.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- attention: GQA ≡ duplicated MHA --------------------------------------------------- */

static void fill(float *x, size_t n, kv_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(r, -1.0f, 1.0f);
}

static void test_gqa_equals_duplicated_mha(void)
{
    const int H = 16, Gs[] = {1, 2, 4, 8, 16}, ds[] = {64, 128}, lens[] = {1, 37, 300};
    const int max_seq = 301;
    kv_rng r;
    kv_rng_seed(&r, 3);
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 5; gi++) {
            const int d = ds[di], G = Gs[gi], Hkv = H / G;
            float *q = kv_calloc((size_t)H * d * 4);                  /* [H][d] */
            float *k = kv_calloc((size_t)Hkv * max_seq * d * 4);      /* [H_kv][max_seq][d] */
            float *v = kv_calloc((size_t)Hkv * max_seq * d * 4);
            float *k2 = kv_calloc((size_t)H * max_seq * d * 4);       /* [H][max_seq][d] */
            float *v2 = kv_calloc((size_t)H * max_seq * d * 4);
            float *o1 = kv_calloc((size_t)H * d * 4), *o2 = kv_calloc((size_t)H * d * 4);
            fill(q, (size_t)H * d, &r);
            fill(k, (size_t)Hkv * max_seq * d, &r);
            fill(v, (size_t)Hkv * max_seq * d, &r);
            for (int h = 0; h < H; h++) { /* MHA copy: head h gets KV head h / G */
                const size_t n = (size_t)max_seq * d;
                memcpy(k2 + h * n, k + (size_t)(h / G) * n, n * 4);
                memcpy(v2 + h * n, v + (size_t)(h / G) * n, n * 4);
            }
            for (int li = 0; li < 3; li++) {
                const int len = lens[li];
                int a = kv_attn_decode(q, k, v, o1, H, Hkv, d, max_seq, len);
                int b = kv_attn_decode(q, k2, v2, o2, H, H, d, max_seq, len);
                KV_CHECK(a == KV_OK && b == KV_OK && !memcmp(o1, o2, (size_t)H * d * 4),
                         "G %d d %d len %d: GQA output bit-identical to duplicated MHA", G, d, len);
            }
            kv_free(q); kv_free(k); kv_free(v); kv_free(k2); kv_free(v2); kv_free(o1); kv_free(o2);
        }
}

/* With all keys equal the softmax is uniform, so head h outputs the mean of its KV head's
 * values: give KV head j the constant value j + 1 and read off which head each h used. */
static void test_head_mapping(void)
{
    const int H = 8, d = 64, n = 5;
    const int Hkvs[] = {8, 4, 2, 1};
    for (int i = 0; i < 4; i++) {
        const int Hkv = Hkvs[i], G = H / Hkv;
        float q[8 * 64], out[8 * 64];
        float *k = kv_calloc((size_t)Hkv * n * d * 4), *v = kv_calloc((size_t)Hkv * n * d * 4);
        for (int j = 0; j < Hkv; j++)
            for (int x = 0; x < n * d; x++) v[(size_t)j * n * d + x] = (float)(j + 1);
        for (int x = 0; x < H * d; x++) q[x] = 0.5f;
        KV_CHECK(kv_attn_decode(q, k, v, out, H, Hkv, d, n, n) == KV_OK, "decode");
        int ok = 1;
        for (int h = 0; h < H; h++) {
            ok &= kv_attn_kv_head(h, H, Hkv) == h / G;
            ok &= out[h * d] == (float)(h / G + 1) && out[h * d + d - 1] == (float)(h / G + 1);
        }
        KV_CHECK(ok, "H_kv %d: query head h read KV head h / %d", Hkv, G);
        kv_free(k);
        kv_free(v);
    }
    float q[4], o[4], kv[4] = {0};
    KV_CHECK(kv_attn_decode(q, kv, kv, o, 4, 3, 1, 1, 1) == KV_ERR_ARG, "H_kv 3 of H 4 refused");
}

/* ---- conversion -------------------------------------------------------------------------- */

static int weights_equal(const kv_model *a, const kv_model *b)
{
    return a->n_floats == b->n_floats &&
           !memcmp(a->data, b->data, (size_t)a->n_floats * sizeof(float)) &&
           !memcmp(&a->config, &b->config, sizeof a->config);
}

static void tokens_of(int *t, int n, int vocab, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = (int)(kv_rng_u32(&r) % (uint32_t)vocab);
}

static void test_conversion_exact_cases(void)
{
    kv_err e;
    kv_model mha = {0}, gqa = {0}, dup = {0}, back = {0}, same = {0}, bad = {0};
    KV_CHECK(kv_model_default(&mha, KV_DEFAULT_TINY, &e) == KV_OK, "tiny: %s", e.msg);
    KV_CHECK(kv_model_default(&gqa, KV_DEFAULT_TINY_GQA, &e) == KV_OK, "tiny-gqa: %s", e.msg);

    /* G = 1: pooling groups of one head is a copy */
    KV_CHECK(kv_convert_pool_kv_heads(&same, &mha, mha.config.n_kv_heads, &e) == KV_OK &&
                 weights_equal(&same, &mha), "G = 1 conversion is the identity");

    /* MHA built by duplicating each KV head of tiny-gqa across its group */
    KV_CHECK(kv_convert_expand_kv_heads(&dup, &gqa, gqa.config.n_heads, &e) == KV_OK &&
                 dup.config.n_kv_heads == 4, "expand: %s", e.msg);
    int tok[96];
    tokens_of(tok, 96, gqa.config.vocab_size, 7);
    kv_convert_diff df;
    KV_CHECK(kv_convert_compare(&gqa, &dup, tok, 96, &df, &e) == KV_OK && df.identical &&
                 df.positions == 96, "GQA model and its duplicated-MHA twin: identical logits "
                 "(max |diff| %g)", df.max_abs);
    /* ... and converting that MHA model back to G = 2 recovers the GQA model exactly */
    KV_CHECK(kv_convert_pool_kv_heads(&back, &dup, 2, &e) == KV_OK && weights_equal(&back, &gqa),
             "pooling duplicated heads gives back the GQA weights bit for bit");
    KV_CHECK(kv_convert_compare(&dup, &back, tok, 96, &df, &e) == KV_OK && df.identical &&
                 df.kl_max == 0.0 && df.top1_agree == 1.0, "MHA-with-duplicates -> GQA: identical logits");

    /* refusals */
    KV_CHECK(kv_convert_pool_kv_heads(&bad, &mha, 3, &e) == KV_ERR_ARG && strstr(e.msg, "3"),
             "H_kv 3 of 4 refused: %s", e.msg);
    KV_CHECK(kv_convert_pool_kv_heads(&bad, &mha, 8, &e) == KV_ERR_ARG, "more heads refused");
    KV_CHECK(kv_convert_expand_kv_heads(&bad, &mha, 3, &e) == KV_ERR_ARG, "expand to 3 refused");
    KV_CHECK(kv_convert_widen(&bad, &gqa, 8, 1, &e) == KV_ERR_ARG, "widen needs MHA");

    /* the file path: write, convert on disk, read back == converted in memory */
    char in[64], out[64];
    snprintf(in, sizeof in, "/tmp/kvlab_gqa_in_%d.bin", (int)getpid());
    snprintf(out, sizeof out, "/tmp/kvlab_gqa_out_%d.bin", (int)getpid());
    kv_model pooled = {0}, read = {0};
    KV_CHECK(kv_checkpoint_write(in, &mha, KV_FILE_KVLAB, &e) == KV_OK, "write: %s", e.msg);
    KV_CHECK(kv_convert_file(in, out, 1, KV_FILE_KVLAB, &e) == KV_OK, "convert file: %s", e.msg);
    KV_CHECK(kv_checkpoint_read(out, &read, &e) == KV_OK, "read back: %s", e.msg);
    KV_CHECK(kv_convert_pool_kv_heads(&pooled, &mha, 1, &e) == KV_OK && weights_equal(&read, &pooled)
                 && read.config.n_kv_heads == 1, "converted file == converted in memory (MQA)");
    KV_CHECK(kv_convert_file(in, out, 3, KV_FILE_KVLAB, &e) == KV_ERR_ARG, "file: bad H_kv refused");
    remove(in);
    remove(out);
    kv_model_free(&pooled); kv_model_free(&read);
    kv_model_free(&mha); kv_model_free(&gqa); kv_model_free(&dup); kv_model_free(&back);
    kv_model_free(&same);
}

/* Random model with H = 8 (tiny's shape, dim 128): independent heads, nothing to share. */
static void test_random_model_change(void)
{
    kv_err e;
    kv_config c;
    kv_config_default(KV_DEFAULT_TINY, &c, &e);
    c.dim = 128; c.n_heads = c.n_kv_heads = 8; c.hidden_dim = 344; c.rotary_dim = 16;
    kv_model m = {0};
    KV_CHECK(kv_model_alloc(&m, &c, &e) == KV_OK, "alloc: %s", e.msg);
    kv_model_randomize(&m, 33);
    int tok[128];
    tokens_of(tok, 128, c.vocab_size, 8);
    double prev = 0.0;
    const int Gs[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        kv_model p = {0};
        kv_convert_diff df = {0};
        int rc = kv_convert_pool_kv_heads(&p, &m, 8 / Gs[i], &e);
        if (!rc) rc = kv_convert_compare(&m, &p, tok, 128, &df, &e);
        KV_CHECK(rc == KV_OK, "G %d: %s", Gs[i], e.msg);
        printf("  random H=8, G %d: KL mean %.4f max %.4f nats, top-1 agreement %.1f%%\n", Gs[i],
               df.kl_mean, df.kl_max, 100.0 * df.top1_agree);
        if (Gs[i] == 1) KV_CHECK(df.identical, "G 1: identical");
        else KV_CHECK(df.kl_mean > prev, "G %d: KL %.4g grows with G (previous %.4g)", Gs[i],
                      df.kl_mean, prev);
        prev = df.kl_mean;
        kv_model_free(&p);
    }
    kv_model_free(&m);
}

/* ---- recall models: needle suite per G --------------------------------------------------- */

/* The recall model made MHA (duplicated K/V) and widened to 8 heads. */
static int wide_recall(kv_model *out, int kind, kv_err *e)
{
    kv_recall_opts o;
    kv_recall_opts_default(&o, kind);
    kv_model r = {0}, mha = {0};
    int rc = kv_recall_build(&r, &o, e);
    if (!rc) rc = kv_convert_expand_kv_heads(&mha, &r, r.config.n_heads, e);
    if (!rc) rc = kv_convert_widen(out, &mha, 8, 77, e);
    kv_model_free(&r);
    kv_model_free(&mha);
    return rc;
}

static void test_recall_per_group(void)
{
    kv_err e;
    const int length = 384, depths[] = {0, 50, 100};
    for (int kind = KV_MODEL_RECALL_DIRECT; kind <= KV_MODEL_RECALL_INDUCTION; kind++) {
        kv_model wide = {0};
        KV_CHECK(wide_recall(&wide, kind, &e) == KV_OK, "wide recall: %s", e.msg);
        int tok[384];
        kv_needle_item it[3];
        KV_CHECK(kv_needle_build(kind, length, depths, 3, 5, tok, it, &e) == KV_OK, "build: %s",
                 e.msg);
        const int Gs[] = {1, 2, 4, 8};
        for (int gi = 0; gi < 4; gi++) {
            const int G = Gs[gi];
            kv_model p = {0};
            kv_backend *b = NULL;
            kv_needle_result res[3];
            kv_convert_diff df = {0};
            kv_cache_spec spec = kv_cache_spec_default(1, length + 8);
            int rc = kv_convert_pool_kv_heads(&p, &wide, 8 / G, &e);
            if (!rc) rc = kv_convert_compare(&wide, &p, tok, 96, &df, &e);
            if (!rc) rc = kv_backend_cpu(&b, &p, &spec, &e);
            if (!rc) rc = kv_needle_run(b, 0, kind, tok, length, it, 3, 0, res, NULL, NULL, 0, 0, &e);
            KV_CHECK(rc == KV_OK, "%s G %d: %s", kv_recall_kind_name(kind), G, e.msg);
            int found = 0;
            for (int i = 0; i < 3 && !rc; i++) found += res[i].pass;
            printf("  recall %-9s wide H=8, G %d: KL mean %.3g, top-1 %.1f%%, needles %d/3\n",
                   kv_recall_kind_name(kind), G, df.kl_mean, 100.0 * df.top1_agree, found);
            if (G <= 2) {
                KV_CHECK(df.identical, "%s G %d: logits bit-identical to the wide MHA model",
                         kv_recall_kind_name(kind), G);
                KV_CHECK(found == 3, "%s G %d: every needle found (%d/3)", kv_recall_kind_name(kind),
                         G, found);
            } else {
                KV_CHECK(found == 0, "%s G %d: retrieval K/V pooled with random heads: every "
                         "needle lost (%d/3 found)", kv_recall_kind_name(kind), G, found);
            }
            if (b) kv_backend_destroy(b);
            kv_model_free(&p);
        }
        kv_model_free(&wide);
    }
}

/* The widened model computes the recall model's function (not bit for bit: RMSNorm divides by
 * a different count): same greedy tokens, tiny KL. */
static void test_widen_keeps_function(void)
{
    kv_err e;
    kv_recall_opts o;
    kv_recall_opts_default(&o, KV_MODEL_RECALL_DIRECT);
    kv_model r = {0}, wide = {0};
    KV_CHECK(kv_recall_build(&r, &o, &e) == KV_OK && wide_recall(&wide, KV_MODEL_RECALL_DIRECT, &e)
                 == KV_OK, "build: %s", e.msg);
    int tok[64];
    tokens_of(tok, 64, r.config.vocab_size, 4);
    kv_convert_diff df = {0};
    KV_CHECK(kv_convert_compare(&r, &wide, tok, 64, &df, &e) == KV_OK, "compare: %s", e.msg);
    KV_CHECK(df.top1_agree == 1.0 && df.max_abs < 1e-3, "widened recall model: same argmax "
             "(%.3f), max |logit diff| %.3g < 1e-3", df.top1_agree, df.max_abs);
    kv_model_free(&r);
    kv_model_free(&wide);
}

int main(void)
{
    test_gqa_equals_duplicated_mha();
    test_head_mapping();
    test_conversion_exact_cases();
    test_random_model_change();
    test_widen_keeps_function();
    test_recall_per_group();
    return kv_test_finish();
}
