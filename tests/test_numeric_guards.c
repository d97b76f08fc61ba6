/*
 * Numerical guards (issue 15): the edges where a reference loop quietly produces NaN, reads one
 * element too many or writes past its buffer.
 *
 *   kv_softmax       an empty row (n = 0, even with no buffer), a fully masked row (every
 *                    entry -inf: all weights 0, not NaN), a row with some -inf entries, one entry
 *   kv_attn_decode   len 0 and len > max_seq refused, out untouched; len 1 returns v[0] exactly;
 *                    len = max_seq reads every row and matches a double reference, and rows
 *                    past len are never read (they hold NaN here); bad head counts refused
 *   kv_forward       a cache filled to exactly its capacity (one prefill and token by token,
 *                    the same logits bit for bit), then one token past it refused with
 *                    KV_ERR_CAPACITY and the cache left as it was; a prefill larger than the
 *                    capacity refused with nothing written; empty sequences and batches refused
 *   kv_generate      prompt + steps exactly at the capacity runs; one more is refused
 */
#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_forward.h"
#include "kv_generate.h"
#include "kv_model.h"
#include "kv_ops.h"
#include "kv_rng.h"
#include "common/kv_test.h"

#include <math.h>
#include <string.h>

/* ---- kv_softmax ------------------------------------------------------------------------- */

static void test_softmax(void)
{
    /* an empty row: nothing to read, not even x[0] (a NULL row must be fine) */
    kv_softmax(NULL, 0);
    float guard[1] = {NAN};
    kv_softmax(guard, 0);
    KV_CHECK(isnan(guard[0]), "softmax of n = 0 wrote into the buffer");

    /* fully masked: nothing may be attended to, so every weight is 0 (not NaN) */
    float masked[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    kv_softmax(masked, 5);
    int zeros = 1;
    for (int i = 0; i < 5; i++) zeros &= masked[i] == 0.0f;
    KV_CHECK(zeros, "fully masked row: got %g %g %g %g %g, expected all 0", masked[0], masked[1],
             masked[2], masked[3], masked[4]);

    /* partly masked: the masked entries get exactly 0, the rest sum to 1 */
    float part[4] = {-INFINITY, 0.0f, -INFINITY, logf(3.0f)};
    kv_softmax(part, 4);
    KV_CHECK(part[0] == 0.0f && part[2] == 0.0f, "masked entries not 0: %g %g", part[0], part[2]);
    KV_CHECK(fabsf(part[1] - 0.25f) <= 1e-6f && fabsf(part[3] - 0.75f) <= 1e-6f,
             "partly masked row: %g %g, expected 0.25 0.75", part[1], part[3]);

    /* one entry, whatever its value (even huge): weight 1 exactly */
    float one[1] = {1e30f};
    kv_softmax(one, 1);
    KV_CHECK(one[0] == 1.0f, "softmax of one entry is %g, expected 1", one[0]);
    float lone[3] = {-INFINITY, -1e30f, -INFINITY};
    kv_softmax(lone, 3);
    KV_CHECK(lone[0] == 0.0f && lone[1] == 1.0f && lone[2] == 0.0f,
             "one finite entry among -inf: %g %g %g", lone[0], lone[1], lone[2]);
}

/* ---- kv_attn_decode --------------------------------------------------------------------- */

static void fill(float *x, size_t n, kv_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_float(r) * 2.0f - 1.0f;
}

/* double reference of one head: softmax(q·k/sqrt d) v over positions 0..len-1 */
static void ref_head(const float *q, const float *k, const float *v, double *out, int d, int len)
{
    double s[64], mx = -INFINITY, sum = 0.0;
    for (int p = 0; p < len; p++) {
        double dot = 0.0;
        for (int i = 0; i < d; i++) dot += (double)q[i] * k[(size_t)p * d + i];
        s[p] = dot / sqrt((double)d);
        if (s[p] > mx) mx = s[p];
    }
    for (int p = 0; p < len; p++) sum += (s[p] = exp(s[p] - mx));
    for (int i = 0; i < d; i++) {
        double o = 0.0;
        for (int p = 0; p < len; p++) o += s[p] * v[(size_t)p * d + i];
        out[i] = o / sum;
    }
}

static void test_attn_decode(void)
{
    enum { H = 4, HKV = 2, D = 8, MAXS = 16 };
    static float q[H * D], k[HKV * MAXS * D], v[HKV * MAXS * D], out[H * D]; /* [H][d], [H_kv][max_seq][d] */
    kv_rng r;
    kv_rng_seed(&r, 15);
    fill(q, H * D, &r);
    fill(k, HKV * MAXS * D, &r);
    fill(v, HKV * MAXS * D, &r);

    /* refused without touching out: len 0, len past max_seq, bad head counts */
    const struct { int h, hkv, d, len; const char *what; } bad[] = {
        {H, HKV, D, 0, "len 0"},          {H, HKV, D, -1, "len -1"},
        {H, HKV, D, MAXS + 1, "len max_seq + 1"}, {H, 0, D, 4, "n_kv_heads 0"},
        {H, 3, D, 4, "n_kv_heads 3 of 4 heads"},  {0, HKV, D, 4, "n_heads 0"},
        {H, HKV, 0, 4, "head_dim 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int j = 0; j < H * D; j++) out[j] = 42.0f;
        int rc = kv_attn_decode(q, k, v, out, bad[i].h, bad[i].hkv, bad[i].d, MAXS, bad[i].len);
        int untouched = 1;
        for (int j = 0; j < H * D; j++) untouched &= out[j] == 42.0f;
        KV_CHECK(rc == KV_ERR_ARG && untouched, "kv_attn_decode %s: status %d (expected %d), out %s",
                 bad[i].what, rc, KV_ERR_ARG, untouched ? "untouched" : "written");
    }

    /* len 1: the only weight is exp(0)/exp(0) = 1, so out is v[0] of the head's KV head exactly */
    int rc = kv_attn_decode(q, k, v, out, H, HKV, D, MAXS, 1);
    int exact = rc == KV_OK;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < D; i++) exact &= out[h * D + i] == v[(size_t)(h / 2) * MAXS * D + i];
    KV_CHECK(exact, "len 1: out is not v[0] exactly (status %d)", rc);

    /* len = max_seq: every row, vs the double reference */
    rc = kv_attn_decode(q, k, v, out, H, HKV, D, MAXS, MAXS);
    KV_CHECK(rc == KV_OK, "len = max_seq: status %d", rc);
    for (int h = 0; h < H; h++) {
        double ref[D];
        float reff[D];
        ref_head(q + h * D, k + (size_t)(h / 2) * MAXS * D, v + (size_t)(h / 2) * MAXS * D, ref, D, MAXS);
        for (int i = 0; i < D; i++) reff[i] = (float)ref[i];
        KV_CHECK(kv_test_compare("attn len = max_seq", out + h * D, reff, D, KV_TOL_F32_ATOL,
                                 KV_TOL_F32_RTOL) == 0, "head %d differs from the reference", h);
    }

    /* len = max_seq - 1 with NaN in the last row of every KV head: the row must not be read */
    for (int g = 0; g < HKV; g++)
        for (int i = 0; i < D; i++) {
            k[((size_t)g * MAXS + MAXS - 1) * D + i] = NAN;
            v[((size_t)g * MAXS + MAXS - 1) * D + i] = NAN;
        }
    rc = kv_attn_decode(q, k, v, out, H, HKV, D, MAXS, MAXS - 1);
    int finite = rc == KV_OK;
    for (int j = 0; j < H * D; j++) finite &= isfinite(out[j]);
    KV_CHECK(finite, "len = max_seq - 1 read the row past len (status %d)", rc);
}

/* ---- kv_forward at the capacity --------------------------------------------------------- */

enum { CAP = 12 };

static int step(const kv_model *m, kv_cache *c, kv_state *s, int pos, int n, const int *tok,
                float *logits, kv_err *err)
{
    kv_seq q = {0, pos, n, tok};
    return kv_forward(m, c, s, &q, 1, logits, NULL, err);
}

static void test_forward_capacity(const kv_model *m)
{
    const int V = m->config.vocab_size;
    int tok[CAP + 1];
    for (int i = 0; i <= CAP; i++) tok[i] = (i * 37 + 5) % V;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_cache a, b;
    kv_state s;
    kv_state_init(&s);
    kv_err err = {{0}};
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V); /* [vocab] */
    if (kv_cache_create(&a, &m->config, &spec, &err) || kv_cache_create(&b, &m->config, &spec, &err)) {
        KV_CHECK(0, "cache: %s", err.msg);
        return;
    }
    const size_t bytes = kv_cache_bytes(&a) / 2; /* of K (and of V) */

    /* a prefill one token larger than the cache: refused, nothing written */
    int rc = step(m, &a, &s, 0, CAP + 1, tok, la, &err);
    KV_CHECK(rc == KV_ERR_CAPACITY && a.len[0] == 0, "prefill of capacity + 1: status %d, len %d",
             rc, a.len[0]);
    KV_CHECK(strstr(err.msg, "capacity") != NULL, "message does not name the capacity: %s", err.msg);
    int clean = 1;
    for (size_t i = 0; i < bytes / sizeof(float); i++) clean &= a.k[i] == 0.0f && a.v[i] == 0.0f;
    KV_CHECK(clean, "refused prefill wrote into the cache");

    /* exactly the capacity: one prefill of CAP tokens, and CAP single-token steps */
    rc = step(m, &a, &s, 0, CAP, tok, la, &err);
    KV_CHECK(rc == KV_OK && a.len[0] == CAP, "prefill of exactly the capacity: %d %s", rc, err.msg);
    for (int p = 0; p < CAP && rc == KV_OK; p++) rc = step(m, &b, &s, p, 1, tok + p, lb, &err);
    KV_CHECK(rc == KV_OK && b.len[0] == CAP, "decode up to the capacity: %d %s", rc, err.msg);
    KV_CHECK(memcmp(la, lb, sizeof(float) * V) == 0,
             "logits at the last position differ between prefill and token-by-token decode");
    int finite = 1;
    for (int i = 0; i < V; i++) finite &= isfinite(la[i]);
    KV_CHECK(finite, "logits at the last cache position are not finite");

    /* one past: refused with CAPACITY, cache contents and length untouched */
    float *kcopy = malloc(bytes), *vcopy = malloc(bytes);
    memcpy(kcopy, a.k, bytes);
    memcpy(vcopy, a.v, bytes);
    for (int i = 0; i < V; i++) lb[i] = -7.0f;
    rc = step(m, &a, &s, CAP, 1, tok + CAP, lb, &err);
    KV_CHECK(rc == KV_ERR_CAPACITY && a.len[0] == CAP, "one token past the capacity: status %d, len %d",
             rc, a.len[0]);
    KV_CHECK(memcmp(kcopy, a.k, bytes) == 0 && memcmp(vcopy, a.v, bytes) == 0,
             "refused step changed the cache");
    KV_CHECK(lb[0] == -7.0f && lb[V - 1] == -7.0f, "refused step wrote logits");

    /* empty sequences and batches are refused by name, not run */
    rc = step(m, &a, &s, CAP, 0, tok, la, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "n_tokens") != NULL, "n_tokens 0: status %d (%s)",
             rc, err.msg);
    kv_seq q = {0, 0, 1, tok};
    rc = kv_forward(m, &b, &s, &q, 0, la, NULL, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "empty batch") != NULL, "n_seqs 0: status %d (%s)",
             rc, err.msg);

    free(kcopy);
    free(vcopy);
    free(la);
    free(lb);
    kv_state_free(&s);
    kv_cache_free(&a);
    kv_cache_free(&b);
}

/* ---- kv_generate at the capacity -------------------------------------------------------- */

static void test_generate_capacity(const kv_model *m)
{
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *b = NULL;
    kv_err err = {{0}};
    if (kv_backend_cpu(&b, m, &spec, &err)) {
        KV_CHECK(0, "backend: %s", err.msg);
        return;
    }
    const int prompt[3] = {1, 7, 9};
    int out[CAP];
    for (int mode = KV_MODE_NAIVE; mode <= KV_MODE_CACHED; mode++) {
        kv_gen_opts o = {0};
        o.mode = mode;
        o.n_steps = CAP - 3; /* prompt + steps = capacity exactly */
        int rc = kv_generate(b, prompt, 3, &o, out, NULL, &err);
        KV_CHECK(rc == KV_OK, "mode %d: prompt + steps = capacity: %d %s", mode, rc, err.msg);
        int in_vocab = 1;
        for (int i = 0; i < o.n_steps; i++) in_vocab &= out[i] >= 0 && out[i] < m->config.vocab_size;
        KV_CHECK(in_vocab, "mode %d: token outside the vocabulary", mode);
        o.n_steps = CAP - 2; /* one more */
        rc = kv_generate(b, prompt, 3, &o, out, NULL, &err);
        KV_CHECK(rc == KV_ERR_CAPACITY && strstr(err.msg, "capacity") != NULL,
                 "mode %d: one step past the capacity: %d %s", mode, rc, err.msg);
    }
    /* an empty prompt: refused, there is no position to generate from */
    kv_gen_opts o = {0};
    o.n_steps = 1;
    int rc = kv_generate(b, prompt, 0, &o, out, NULL, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "n_prompt") != NULL, "empty prompt: %d %s", rc, err.msg);
    kv_backend_destroy(b);
}

int main(void)
{
    test_softmax();
    test_attn_decode();
    kv_model m;
    kv_err err = {{0}};
    if (kv_model_default(&m, KV_DEFAULT_TINY_GQA, &err)) {
        printf("cannot build the tiny model: %s\n", err.msg);
        return 1;
    }
    test_forward_capacity(&m);
    test_generate_capacity(&m);
    kv_model_free(&m);
    return kv_test_finish();
}
