/*
 * Chapter 11: the MLA model kind in the one forward pass (engine/kv_forward_mla.c).
 *
 *  1. config: tiny-mla's shape, the MLA fields validated with the field named, the parameter
 *     count against the weights' formula;
 *  2. weights: the attention tensors of kv_mla.h laid out where wq, wk, wv, wo would be, each
 *     for every layer in turn; seeded random init (same seed, same bytes; gains 1);
 *  3. generation: greedy tokens and logits with the cache == chapter 01's naive recompute,
 *     BIT FOR BIT, in every storage format but fp8; paged == contiguous bit for bit in every
 *     format; a batch == its sequences run solo. Why bit-identical and not
 *     within a bound: both runs evaluate the same float expressions in the same order. Every
 *     row's projections are computed alone (kv_matmul's rows, RMSNorm and RoPE per row), so a
 *     token's latent row has the same bits in a prefill chunk as in a one-token step; a
 *     per-token format encodes each row alone; and kv_mla_attention_absorbed() for the row at
 *     position p reads rows 0..p in order, each head in one fixed order on one thread. KIVI
 *     too: what len tokens quantize depends on len alone (kv_cache_kivi_qlen()), and a group
 *     holds the same 32 rows however they came. Not fp8: its scale is calibrated on a slot's
 *     first chunk, the prompt in one run and the whole prefix in the other, so only paged ==
 *     contiguous is claimed for it.
 *     The absorbed form against the naive up-projection is tests/test_mla.c's bound;
 *  4. counters: the bytes and FLOPs of kv_forward_mla.c's formulas;
 *  5. checkpoint: an MLA model written (kvlab header v2) and read back gives the same config,
 *     bytes and logits; llama2.c files refuse it; a damaged v2 header is refused, named;
 *  6. refusals, named: a window, chapter 09's retention, a tensor-parallel shard (and
 *     kv_tp_backend), the K/V-head conversions, a cache of the MHA shape, the CUDA engine;
 *  7. the CLI: kvlab generate --default tiny-mla --save-model, then --model FILE, naive and
 *     paged: the library's tokens.
 * argv: the kvlab binary and the build's CUDA mode (none, emulation, cuda).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_cli.h"
#include "kv_attention_mla.h"
#include "kv_backend.h"
#include "kv_checkpoint.h"
#include "kv_convert.h"
#include "kv_generate.h"
#include "kv_retain.h"
#include "kv_tp.h"

#define N_PROMPT 40
#define STEPS 24 /* 64 tokens: two KIVI groups of 32 spill past a window of 32 */

static const char *cuda_mode = "none";

/* tiny-mla with query compression (q_rank 24): DeepSeek-V2's path through W_DQ, W_UQ */
static kv_config config_q(void)
{
    kv_config c;
    kv_config_default(KV_DEFAULT_TINY_MLA, &c, NULL);
    c.mla.q_rank = 24;
    return c;
}

static int model_of(kv_model *m, const kv_config *c, uint64_t seed)
{
    kv_err e = {{0}};
    int rc = kv_model_alloc(m, c, &e);
    if (rc) printf("  model: %s\n", e.msg);
    else kv_model_randomize(m, seed);
    return rc;
}

/* ---- 1. config ------------------------------------------------------------------------- */

static int64_t params_by_hand(const kv_config *c)
{
    const int64_t D = c->dim, H = c->n_heads, L = c->n_layers, F = c->hidden_dim;
    const int64_t dc = c->mla.d_c, dr = c->mla.d_rope, dn = c->mla.d_nope, dv = c->mla.d_v;
    const int64_t R = c->mla.q_rank, qk = dn + dr;
    const int64_t q = R ? R * D + R + H * qk * R : H * qk * D; /* W_DQ, its norm, W_UQ or W_Q */
    const int64_t attn = q + (dc + dr) * D + dc + H * dn * dc + H * dv * dc + D * H * dv;
    return c->vocab_size * D + L * (2 * D + attn + 3 * F * D) + D;
}

static void expect_invalid(kv_config c, const char *want, const char *what)
{
    kv_err e = {{0}};
    KV_CHECK(kv_config_validate(&c, &e) == KV_ERR_ARG && strstr(e.msg, want), "%s: '%s'", what,
             e.msg);
}

static void test_config(void)
{
    kv_config c, g;
    kv_err e = {{0}};
    KV_CHECK(kv_config_default(KV_DEFAULT_TINY_MLA, &c, &e) == KV_OK &&
                 kv_config_validate(&c, &e) == KV_OK && c.attn == KV_ATTN_MLA,
             "tiny-mla: %s", e.msg);
    char buf[256];
    kv_config_describe(&c, buf, sizeof buf);
    KV_CHECK(!strcmp(buf, "dim 64, L 2, H 4, MLA d_c 48, d_R 16, d_nope 16, d_v 16, q_rank 0, "
                          "hidden 172, vocab 512, seq 512"), "describe: '%s'", buf);
    KV_CHECK(kv_mla_row(&c.mla) == 64, "a latent row of %d", kv_mla_row(&c.mla));
    g = c, g.n_kv_heads = 2;
    expect_invalid(g, "n_kv_heads (2) must be 1", "two KV heads");
    g = c, g.rotary_dim = 8;
    expect_invalid(g, "rotary_dim (8) must equal d_R (16)", "rotary != d_R");
    g = c, g.mla.d_rope = 15, g.rotary_dim = 15;
    expect_invalid(g, "d_R", "odd d_R");
    g = c, g.mla.d_c = 0;
    expect_invalid(g, "d_c (kv_lora_rank) is 0", "no latent");
    g = c, g.kind = KV_MODEL_RECALL_DIRECT;
    expect_invalid(g, "kind (1) must be 0", "a recall MLA model");
    g = c, g.attn = 5;
    expect_invalid(g, "attn (5)", "unknown attention kind");
    g = c, g.n_heads = 2000;
    expect_invalid(g, "n_heads (2000)", "too many heads");
    KV_CHECK(kv_config_param_count(&c) == params_by_hand(&c), "params %lld, by hand %lld",
             (long long)kv_config_param_count(&c), (long long)params_by_hand(&c));
    g = config_q();
    KV_CHECK(kv_config_validate(&g, &e) == KV_OK &&
                 kv_config_param_count(&g) == params_by_hand(&g), "q_rank 24: %s", e.msg);
    KV_CHECK(kv_config_require_gqa(&c, "here", &e) == KV_ERR_UNSUPPORTED &&
                 strstr(e.msg, "here") && strstr(e.msg, "MLA"), "require_gqa: %s", e.msg);
}

/* ---- 2. weights ------------------------------------------------------------------------ */

static void test_weights(void)
{
    kv_model a = {0}, b = {0}, q = {0};
    kv_err e = {{0}};
    KV_CHECK(kv_model_default(&a, KV_DEFAULT_TINY_MLA, &e) == KV_OK, "tiny-mla: %s", e.msg);
    kv_config cq = config_q();
    if (!a.data || model_of(&b, &a.config, 1004) || model_of(&q, &cq, 7)) goto done;
    const kv_config *c = &a.config;
    const int64_t D = c->dim, L = c->n_layers, H = c->n_heads, qk = 32, dv = 16;
    KV_CHECK(a.n_floats == kv_config_param_count(c) && a.mla && !a.w.wq && !a.w.wk && !a.w.wo,
             "an MLA model holds no wq/wk/wv/wo");
    /* kv_model.h's order: embedding, rms_att, then the attention tensors each for every layer */
    KV_CHECK(a.mla[0].wq == a.data + c->vocab_size * D + L * D &&
                 a.mla[1].wq == a.mla[0].wq + H * qk * D && a.mla[0].wkv_a == a.mla[0].wq + L * H * qk * D &&
                 a.w.rms_ffn == a.mla[0].wo + L * D * H * dv, "tensor-major layout");
    KV_CHECK(a.mla[1].dim == D && a.mla[1].n_heads == H && a.mla[1].m.d_c == 48 && !a.mla[0].data,
             "layer views");
    KV_CHECK(q.mla[0].wq == NULL && q.mla[1].wq_a && q.mla[1].q_norm[23] == 1.0f && q.mla[1].wq_b,
             "query compression's tensors");
    KV_CHECK(memcmp(a.data, b.data, (size_t)a.n_floats * 4) == 0, "same seed, same bytes");
    const float lim = sqrtf(3.0f / (float)D);
    int gains = 1, bounded = 1;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < 48; i++) gains &= a.mla[l].kv_norm[i] == 1.0f;
        for (int64_t i = 0; i < 64 * D; i++) bounded &= fabsf(a.mla[l].wkv_a[i]) <= lim;
    }
    KV_CHECK(gains && bounded && kv_model_check_finite(&a, &e) == KV_OK,
             "gains 1, |W_DKV| <= sqrt(3/dim), finite: %s", e.msg);
done:
    kv_model_free(&a), kv_model_free(&b), kv_model_free(&q);
}

/* ---- 3. generation ----------------------------------------------------------------------- */

typedef struct {
    int tok[STEPS];
    float logits[512];
} gen_out;

static int prompt[N_PROMPT];

static int spec_of(const char *cache, int paged, int n_slots, kv_cache_spec *s, kv_err *e)
{
    int rc = kv_needle_cache_spec(cache, n_slots, N_PROMPT + STEPS, s, e);
    if (!rc && paged) { /* blocks of 8 (32 for KIVI's groups), two spare */
        s->layout.kind = KV_LAYOUT_PAGED;
        s->layout.block_size = kvq_is_kivi(s->quant.dtype) ? 32 : 8;
        s->layout.n_blocks = n_slots * (N_PROMPT + STEPS) / s->layout.block_size + 2;
    }
    return rc;
}

static int gen(const kv_model *m, const char *cache, int paged, int mode, gen_out *o)
{
    kv_err e = {{0}};
    kv_cache_spec spec;
    kv_backend *b = NULL;
    int rc = spec_of(cache, paged, 1, &spec, &e);
    if (!rc) rc = kv_backend_cpu(&b, m, &spec, &e);
    kv_gen_opts g = {0};
    g.mode = mode;
    g.n_steps = STEPS;
    g.last_logits = o->logits;
    if (!rc) rc = kv_generate(b, prompt, N_PROMPT, &g, o->tok, NULL, &e);
    if (rc) printf("  %s %s %s: %s\n", cache, paged ? "paged" : "contiguous",
                   mode ? "cached" : "naive", e.msg);
    kv_backend_destroy(b);
    return rc;
}

static int same(const gen_out *x, const gen_out *y)
{
    return !memcmp(x->tok, y->tok, sizeof x->tok) && !memcmp(x->logits, y->logits, sizeof x->logits);
}

static void test_generate(const kv_model *m, const char *name)
{
    static const char *formats[] = {"fp32", "fp16", "bf16", "int8", "int8-g32", "int8-g64",
                                    "fp8-e4m3", "fp8-e5m2/head", "int4/w32", "int2/w32"};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        gen_out cached, naive, paged;
        if (gen(m, formats[f], 0, KV_MODE_CACHED, &cached) || gen(m, formats[f], 0, KV_MODE_NAIVE, &naive) ||
            gen(m, formats[f], 1, KV_MODE_CACHED, &paged)) {
            KV_CHECK(0, "%s %s: a run failed", name, formats[f]);
            continue;
        }
        int finite = 1;
        for (int i = 0; i < 512; i++) finite &= isfinite(cached.logits[i]) != 0;
        KV_CHECK(finite, "%s %s: finite logits", name, formats[f]);
        KV_CHECK(same(&paged, &cached), "%s %s: paged == contiguous bit for bit", name, formats[f]);
        kv_err e = {{0}};
        kv_cache_spec s;
        const int fp8 = spec_of(formats[f], 0, 1, &s, &e) || kvq_is_fp8(s.quant.dtype);
        if (!fp8)
            KV_CHECK(same(&naive, &cached), "%s %s: cached == naive recompute bit for bit", name,
                     formats[f]);
        else
            printf("  %s %s: cached %s naive recompute (not claimed)\n", name, formats[f],
                   same(&naive, &cached) ? "==" : "!=");
    }
    kv_err e = {{0}};
    kv_cache_spec s;
    kv_backend *b = NULL;
    KV_CHECK(spec_of("int8-g128", 0, 1, &s, &e) == KV_OK &&
                 kv_backend_cpu(&b, m, &s, &e) != KV_OK && strstr(e.msg, "128"),
             "%s: int8-g128 does not divide a 64-element row: %s", name, e.msg);
    kv_backend_destroy(b);
}

/* Two sequences in one step (a prompt and another's prompt, then one token each) == each alone. */
static void test_batch(const kv_model *m)
{
    kv_err e = {{0}};
    kv_cache_spec s;
    kv_cache c[3];
    kv_state st[3];
    memset(c, 0, sizeof c);
    float lb[2][512], la[2][512];
    int rc = spec_of("int8", 0, 2, &s, &e);
    kv_seq q[2] = {{0, 0, 7, prompt, NULL}, {1, 0, 3, prompt + 10, NULL}};
    for (int i = 0; i < 3; i++) kv_state_init(&st[i]);
    for (int i = 0; i < 3 && !rc; i++) rc = kv_forward_cache_create(&c[i], &m->config, &s, &e);
    if (!rc) rc = kv_forward(m, &c[0], &st[0], q, 2, lb[0], NULL, &e); /* both at once */
    for (int i = 0; i < 2 && !rc; i++) {
        kv_seq one = q[i];
        one.slot = 0;
        rc = kv_forward(m, &c[1 + i], &st[1 + i], &one, 1, la[i], NULL, &e);
    }
    int next[2] = {5, 9};
    kv_seq d[2] = {{0, 7, 1, &next[0], NULL}, {1, 3, 1, &next[1], NULL}};
    if (!rc) rc = kv_forward(m, &c[0], &st[0], d, 2, lb[0], NULL, &e);
    for (int i = 0; i < 2 && !rc; i++) {
        kv_seq one = d[i];
        one.slot = 0;
        rc = kv_forward(m, &c[1 + i], &st[1 + i], &one, 1, la[i], NULL, &e);
    }
    KV_CHECK(!rc && !memcmp(lb, la, sizeof lb), "a batch == its sequences solo: %s", e.msg);
    for (int i = 0; i < 3; i++) kv_retain_cache_free(&c[i]), kv_state_free(&st[i]);
}

/* ---- 4. counters --------------------------------------------------------------------------- */

static void test_counters(const kv_model *m)
{
    kv_err e = {{0}};
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    kv_cache c;
    kv_state st;
    kv_state_init(&st);
    kv_counters cnt = {0};
    const kv_config *p = &m->config;
    const int n = 9, L = p->n_layers, r = kv_mla_row(&p->mla);
    kv_seq q = {0, 0, n, prompt, NULL};
    int rc = kv_forward_cache_create(&c, p, &s, &e);
    if (!rc) rc = kv_forward(m, &c, &st, &q, 1, NULL, &cnt, &e);
    double attn = 0.0;
    for (int t = 0; t < n; t++) attn += L * kv_mla_attention_flops(&p->mla, p->n_heads, t + 1, 1);
    KV_CHECK(!rc && cnt.kv_bytes_written == (double)L * r * 4 * n &&
                 cnt.kv_bytes_read == (double)L * r * 4 * n * (n + 1) / 2 &&
                 fabs(cnt.flops_attn - attn) <= 1e-9 * attn && cnt.tokens == n,
             "counters: written %g, read %g, attn %g vs %g: %s", cnt.kv_bytes_written,
             cnt.kv_bytes_read, cnt.flops_attn, attn, e.msg);
    KV_CHECK(!rc && c.n_planes == 1 && c.n_kv_heads == 1 && c.head_dim == r && c.len[0] == n,
             "one plane of %d-element rows", r);
    if (!rc) kv_retain_cache_free(&c);
    kv_state_free(&st);
}

/* ---- 5. checkpoint ----------------------------------------------------------------------- */

static int logits_of(const kv_model *m, float *out)
{
    kv_err e = {{0}};
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    kv_cache c;
    kv_state st;
    kv_state_init(&st);
    kv_seq q = {0, 0, N_PROMPT, prompt, NULL};
    int rc = kv_forward_cache_create(&c, &m->config, &s, &e);
    if (!rc) {
        rc = kv_forward(m, &c, &st, &q, 1, out, NULL, &e);
        kv_retain_cache_free(&c);
    }
    if (rc) printf("  logits: %s\n", e.msg);
    kv_state_free(&st);
    return rc;
}

static void put32(unsigned char *p, int32_t v) { memcpy(p, &v, 4); }

static void test_checkpoint(const kv_model *m, const char *name)
{
    kv_err e = {{0}};
    kv_model back = {0};
    const char *path = file(name);
    static float la[512], lb[512];
    KV_CHECK(kv_checkpoint_write(path, m, KV_FILE_KVLAB, &e) == KV_OK, "%s write: %s", name, e.msg);
    KV_CHECK(kv_checkpoint_read(path, &back, &e) == KV_OK, "%s read: %s", name, e.msg);
    if (!back.data) return;
    KV_CHECK(!memcmp(&back.config, &m->config, sizeof back.config) &&
                 back.n_floats == m->n_floats &&
                 !memcmp(back.data, m->data, (size_t)m->n_floats * 4),
             "%s: config and weights back bit for bit", name);
    KV_CHECK(!logits_of(m, la) && !logits_of(&back, lb) && !memcmp(la, lb, sizeof la),
             "%s: the same logits from the file", name);
    kv_model_free(&back);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    int32_t v[2];
    memcpy(v, b + 4, 4), memcpy(v + 1, b + 56, 4);
    KV_CHECK(v[0] == 2 && v[1] == KV_ATTN_MLA, "%s: header version %d, attn %d", name, v[0], v[1]);
    struct { long off; int32_t value; const char *want; } bad[] = {
        {80, 1, "padding byte 80"}, {56, 0, "version 2"}, {64, 15, "d_R"}, {56, 9, "attn (9)"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char *c = malloc(n);
        memcpy(c, b, n);
        put32(c + bad[i].off, bad[i].value);
        write_bytes(file("bad.bin"), c, n);
        KV_CHECK(kv_checkpoint_read(file("bad.bin"), &back, &e) == KV_ERR_FORMAT &&
                     strstr(e.msg, bad[i].want) && !back.data, "%s damaged at %ld: %s", name,
                 bad[i].off, e.msg);
        free(c);
    }
    free(b);
    KV_CHECK(kv_checkpoint_write(file("l2.bin"), m, KV_FILE_LLAMA2C, &e) == KV_ERR_UNSUPPORTED &&
                 strstr(e.msg, "MLA") && !exists(file("l2.bin")), "llama2.c refuses: %s", e.msg);
}

/* ---- 6. refusals --------------------------------------------------------------------------- */

static void noop_reduce(const kv_shard *sh, float *x, int64_t n) { (void)sh, (void)x, (void)n; }

static void test_refusals(const kv_model *m)
{
    kv_err e = {{0}};
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    kv_backend *b = NULL;
    s.window.size = 16;
    KV_CHECK(kv_backend_cpu(&b, m, &s, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "window") &&
                 strstr(e.msg, "MLA") && !b, "window: %s", e.msg);
    KV_CHECK(kv_needle_cache_spec("h2o/b16", 1, 64, &s, &e) == KV_OK &&
                 kv_backend_cpu(&b, m, &s, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "h2o") &&
                 strstr(e.msg, "MLA"), "retention: %s", e.msg);
    s = kv_cache_spec_default(1, 64);
    KV_CHECK(kv_tp_backend(&b, m, 2, &s, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "kv_tp") &&
                 strstr(e.msg, "MLA") && !b, "kv_tp_backend: %s", e.msg);
    kv_model out = {0};
    KV_CHECK(kv_convert_pool_kv_heads(&out, m, 1, &e) == KV_ERR_UNSUPPORTED && !out.data &&
                 strstr(e.msg, "kv_convert"), "pooling K/V heads: %s", e.msg);
    /* a shard: refused before anything is written */
    kv_cache c;
    kv_state st;
    kv_state_init(&st);
    kv_seq q = {0, 0, 4, prompt, NULL};
    kv_shard sh = {0, 0, 2, 0, 1, 0, 86, noop_reduce, NULL};
    int rc = kv_forward_cache_create(&c, &m->config, &s, &e);
    KV_CHECK(!rc && kv_forward_shard(m, &c, &st, &sh, &q, 1, NULL, NULL, &e) == KV_ERR_UNSUPPORTED &&
                 strstr(e.msg, "tensor-parallel") && c.len[0] == 0, "shard: %s", e.msg);
    if (!rc) kv_retain_cache_free(&c);
    /* the cache of the MHA shape (K and V planes of dim / H) is not the model's */
    KV_CHECK(kv_cache_create(&c, &m->config, &s, &e) == KV_OK &&
                 kv_forward(m, &c, &st, &q, 1, NULL, NULL, &e) == KV_ERR_ARG &&
                 strstr(e.msg, "cache shape"), "an MHA-shaped cache: %s", e.msg);
    kv_cache_free(&c);
    kv_state_free(&st);
    /* the CUDA engine has no MLA block: refused at upload (or no CUDA in this build) */
    result r = run_in(dir, (const char *const[]){"generate", "--default", "tiny-mla", "--device",
                                                 "cuda", "--steps", "2", NULL});
    if (!strcmp(cuda_mode, "none"))
        KV_CHECK(r.rc == 2 && strstr(r.err, "without CUDA"), "cuda (none): %d %s", r.rc, r.err);
    else if (r.rc == 1 && strstr(r.err, "no usable CUDA device"))
        printf("  cuda: no device here, the upload refusal is not reached\n");
    else
        KV_CHECK(r.rc == 2 && strstr(r.err, "kvcu_model_upload") && strstr(r.err, "MLA") &&
                     !r.out[0], "cuda (%s): %d %s", cuda_mode, r.rc, r.err);
    free(r.out), free(r.err);
}

/* ---- 7. the CLI ---------------------------------------------------------------------------- */

static void test_cli(const kv_model *m)
{
    kv_err e = {{0}};
    int bos = 1, want[8];
    kv_backend *b = NULL;
    kv_cache_spec s = kv_cache_spec_default(1, 16);
    kv_gen_opts g = {0};
    g.mode = KV_MODE_CACHED;
    g.n_steps = 8;
    int rc = kv_backend_cpu(&b, m, &s, &e);
    if (!rc) rc = kv_generate(b, &bos, 1, &g, want, NULL, &e);
    kv_backend_destroy(b);
    char line[128] = "";
    for (int i = 0; i < 8; i++)
        snprintf(line + strlen(line), sizeof line - strlen(line), "%d%c", want[i], i < 7 ? ' ' : '\n');
    const char *mla = file("tiny-mla.bin");
    result r = run_in(dir, (const char *const[]){"generate", "--default", "tiny-mla", "--steps", "8",
                                                 "--no-stop", "--save-model", mla, NULL});
    KV_CHECK(!rc && r.rc == 0 && exists(mla), "generate --default tiny-mla --save-model: %d %s",
             r.rc, r.err);
    free(r.out), free(r.err);
    static const char *const extra[][2] = {{"--mode", "cached"}, {"--mode", "naive"},
                                           {"--layout", "paged"}};
    for (int i = 0; i < 3; i++) {
        r = run_in(dir, (const char *const[]){"generate", "--model", mla, "--steps", "8",
                                              "--no-stop", extra[i][0], extra[i][1], NULL});
        KV_CHECK(r.rc == 0 && !strcmp(r.out, line), "generate --model %s %s: '%s' vs '%s' (%s)",
                 extra[i][0], extra[i][1], r.out, line, r.err);
        free(r.out), free(r.err);
    }
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    if (argc > 2) cuda_mode = argv[2];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 3 + (i * 37) % 500;
    kv_model m = {0}, mq = {0};
    kv_err e = {{0}};
    test_config();
    test_weights();
    kv_config cq = config_q();
    if (kv_model_default(&m, KV_DEFAULT_TINY_MLA, &e) || model_of(&mq, &cq, 7)) {
        printf("models: %s\n", e.msg);
        return 1;
    }
    test_generate(&m, "tiny-mla");
    test_generate(&mq, "tiny-mla q_rank 24");
    test_batch(&m);
    test_counters(&mq);
    test_checkpoint(&m, "mla.bin");
    test_checkpoint(&mq, "mla-q.bin");
    test_refusals(&m);
    test_cli(&m);
    kv_model_free(&m), kv_model_free(&mq);
    cleanup();
    return kv_test_finish();
}
