/* GPU building blocks vs their CPU twins (chapters 01-02): every kvcu_x() against kv_x() on
 * the same inputs, over a grid of shapes whose sizes are not multiples of any tile or block
 * (1, 7, 33, 257), head_dim 64 and 128, GQA ratios 1/2/4 and MQA, T = 1 and 5.
 *
 *  - fp32 tolerances from kv_test.h (the only difference is summation order);
 *  - matmul: the T = 5 (tiled, v2) rows are bit-identical to five T = 1 (warp, v1) calls,
 *    which is what makes a sequence's result independent of its batch;
 *  - matmul on tensor cores with 16-bit weights (kvcu_matmul_w16): within the bound of the
 *    rounding of x and W, and a row's bits the same at T 1, 17 and 130; the same for the
 *    GEMV of one-token rows (kvcu_matmul_w16_gemv), within the bound of W's rounding; and
 *    from an x rounded once beforehand (kvcu_matmul_x16) on shapes the tiles and the cp.async
 *    ring meet unevenly, with the bits of kvcu_matmul_w16;
 *  - rope at positions up to 40000, where an fp32 angle would already be off.
 * Exits 77 (skipped) without a usable device. */
#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_rope.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static kv_rng rng;

static float *host_random(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = kv_rng_uniform(&rng, lo, hi);
    return p;
}

/* A device copy of n host floats (or ints): NULL (and a FAIL line) if the device refuses. */
static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    kv_err e;
    int rc = kvcu_malloc(&d, bytes, &e);
    if (!rc) rc = kvcu_upload(d, host, bytes, &e);
    KV_CHECK(rc == KV_OK, "device copy of %zu bytes: %s", bytes, e.msg);
    return rc ? NULL : d;
}

/* Download n floats from the device and compare them with the CPU's. */
static void check_close(const char *what, const float *dev, const float *ref, size_t n)
{
    float *got = malloc(n * sizeof(float));
    kv_err e;
    int rc = kvcu_download(got, dev, n * sizeof(float), &e);
    KV_CHECK(rc == KV_OK, "%s: download: %s", what, e.msg);
    if (!rc)
        KV_CHECK(kv_test_compare(what, got, ref, (long)n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
                 "%s: GPU differs from CPU", what);
    free(got);
}

static const int lengths[] = {1, 7, 33, 257};
#define N_LENGTHS 4

/* ---- rmsnorm --------------------------------------------------------------------------- */

static void test_rmsnorm(void)
{
    const int Ts[] = {1, 5};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < N_LENGTHS; b++) {
            const int T = Ts[a], n = lengths[b];
            float *x = host_random((size_t)T * n, -2, 2), *w = host_random(n, 0.5f, 1.5f);
            float *ref = malloc((size_t)T * n * sizeof(float));
            kv_rmsnorm(ref, x, w, T, n, 1e-5f);
            float *dx = dev_copy(x, (size_t)T * n * 4), *dw = dev_copy(w, (size_t)n * 4);
            float *dout = dev_copy(x, (size_t)T * n * 4);
            kv_err e;
            char what[64];
            int rc = kvcu_rmsnorm(dout, dx, dw, T, n, 1e-5f, &e);
            KV_CHECK(rc == KV_OK, "kvcu_rmsnorm: %s", e.msg);
            snprintf(what, sizeof what, "rmsnorm T %d n %d", T, n);
            check_close(what, dout, ref, (size_t)T * n);
            rc = kvcu_rmsnorm(dx, dx, dw, T, n, 1e-5f, &e); /* out aliasing x */
            KV_CHECK(rc == KV_OK, "kvcu_rmsnorm in place: %s", e.msg);
            snprintf(what, sizeof what, "rmsnorm in place T %d n %d", T, n);
            check_close(what, dx, ref, (size_t)T * n);
            kvcu_free(dx), kvcu_free(dw), kvcu_free(dout);
            free(x), free(w), free(ref);
        }
}

/* ---- matmul ---------------------------------------------------------------------------- */

static void test_matmul(void)
{
    for (int a = 0; a < N_LENGTHS; a++)
        for (int b = 0; b < N_LENGTHS; b++) {
            const int in = lengths[a], out = lengths[b], T = 5;
            float *x = host_random((size_t)T * in, -1, 1), *W = host_random((size_t)out * in, -1, 1);
            float *ref = malloc((size_t)T * out * sizeof(float));
            float *v1 = malloc((size_t)T * out * sizeof(float));
            float *v2 = malloc((size_t)T * out * sizeof(float));
            kv_matmul(ref, x, W, T, in, out);
            float *dx = dev_copy(x, (size_t)T * in * 4), *dW = dev_copy(W, (size_t)out * in * 4);
            float *dy = dev_copy(ref, (size_t)T * out * 4);
            kv_err e;
            char what[80];
            /* T = 5 at once (v2), then each row alone (v1) */
            int rc = kvcu_matmul(dy, dx, dW, T, in, out, &e);
            KV_CHECK(rc == KV_OK, "kvcu_matmul: %s", e.msg);
            snprintf(what, sizeof what, "matmul T %d in %d out %d", T, in, out);
            check_close(what, dy, ref, (size_t)T * out);
            kvcu_download(v2, dy, (size_t)T * out * 4, &e);
            for (int t = 0; t < T; t++) {
                rc = kvcu_matmul(dy + (size_t)t * out, dx + (size_t)t * in, dW, 1, in, out, &e);
                KV_CHECK(rc == KV_OK, "kvcu_matmul T 1: %s", e.msg);
            }
            snprintf(what, sizeof what, "matmul T 1 x %d in %d out %d", T, in, out);
            check_close(what, dy, ref, (size_t)T * out);
            kvcu_download(v1, dy, (size_t)T * out * 4, &e);
            KV_CHECK(memcmp(v1, v2, (size_t)T * out * 4) == 0,
                     "matmul in %d out %d: T 5 rows are not bit-identical to T 1 calls", in, out);
            kvcu_free(dx), kvcu_free(dW), kvcu_free(dy);
            free(x), free(W), free(ref), free(v1), free(v2);
        }
}

/* ---- matmul on tensor cores, 16-bit weights --------------------------------------------- */

/* The outputs of y [T][out] outside |y - ref| <= coef·Σ_j |x_j·w_j| (x [T][in], W [out][ldw]),
 * the first three printed. */
static long outside_bound(const char *what, const float *y, const float *ref, const float *x,
                          const float *W, int T, int in, int out, int ldw, double coef)
{
    long bad = 0;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++) {
            double mag = 0.0;
            for (int j = 0; j < in; j++)
                mag += fabs((double)x[(size_t)t * in + j] * W[(size_t)o * ldw + j]);
            const size_t i = (size_t)t * out + o;
            if (!(fabs((double)y[i] - ref[i]) <= coef * mag) && bad++ < 3)
                printf("  %s: y[%d][%d] = %.9g, ref %.9g, bound %.3g\n", what, t, o, y[i], ref[i],
                       coef * mag);
        }
    return bad;
}

/* kvcu_matmul_w16 against kv_matmul on the fp32 values: x and W rounded to 16 bits (unit
 * roundoff u) and the products summed in fp32 give |y - ref| <= (2u + u² + in·2^-23)·Σ|x·w|
 * per output (kvcu_ops_fast.cu). Shapes: in and out across the 32-column and 128-output tiles,
 * T 1, 17 (the 16-token tile) and 130 (the 128-token tile, and a partial one). Each T's rows
 * must be bit-identical to the same rows computed alone (T 1) and within the larger batch: no
 * split-K, the same chain of mma steps for an output whatever its tile. */
static void test_matmul_w16(void)
{
    const int ins[] = {48, 257}, outs[] = {7, 130}, Ts[] = {1, 17, 130};
    for (int bf = 0; bf <= 1; bf++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const int in = ins[a], out = outs[b], TM = 130;
                const double u = ldexp(1.0, bf ? -8 : -11);
                float *x = host_random((size_t)TM * in, -1, 1);
                float *W = host_random((size_t)out * in, -1, 1);
                float *ref = malloc((size_t)TM * out * 4), *y = malloc((size_t)TM * out * 4);
                float *all = malloc((size_t)TM * out * 4);
                kv_matmul(ref, x, W, TM, in, out);
                float *dx = dev_copy(x, (size_t)TM * in * 4);
                float *dW = dev_copy(W, (size_t)out * in * 4);
                float *dy = dev_copy(ref, (size_t)TM * out * 4);
                uint16_t *dW16 = NULL, *dx16 = NULL; /* dx16 [TM][in]: x rounded */
                kv_err e;
                int rc = kvcu_malloc((void **)&dW16, (size_t)out * in * 2, &e);
                if (!rc) rc = kvcu_to16(dW16, dW, (int64_t)out * in, bf, &e);
                if (!rc) rc = kvcu_malloc((void **)&dx16, (size_t)TM * in * 2, &e);
                KV_CHECK(rc == KV_OK, "16-bit weights: %s", e.msg);
                /* kind 0: the tensor-core GEMM; kind 1: the GEMV of one-token rows, where only
                 * W is rounded: (u + in·2^-23)·Σ|x·w| (in 48: 16-byte loads; 257: not) */
                for (int kind = 0; kind < 2 && !rc; kind++)
                    for (int ti = 2; ti >= 0 && !rc; ti--) { /* T 130 first: the rows to match */
                        const int T = Ts[ti];
                        const char *what = kind ? "gemv_w16" : "matmul_w16";
                        rc = kind ? kvcu_matmul_w16_gemv(dy, dx, dW16, bf, T, in, out, in, &e)
                                  : kvcu_matmul_w16(dy, dx, dx16, dW16, bf, T, in, out, in, &e);
                        if (!rc) rc = kvcu_download(y, dy, (size_t)T * out * 4, &e);
                        KV_CHECK(rc == KV_OK, "%s: %s", what, e.msg);
                        if (rc) break;
                        const double coef = (kind ? u : 2.0 * u + u * u) + in * ldexp(1.0, -23);
                        char where[80];
                        snprintf(where, sizeof where, "%s %s in %d out %d T %d", what,
                                 bf ? "bf16" : "fp16", in, out, T);
                        const long bad = outside_bound(where, y, ref, x, W, T, in, out, in, coef);
                        KV_CHECK(bad == 0, "%s %s in %d out %d T %d: %ld outside the bound", what,
                                 bf ? "bf16" : "fp16", in, out, T, bad);
                        if (T == TM) memcpy(all, y, (size_t)TM * out * 4);
                        else
                            KV_CHECK(!memcmp(y, all, (size_t)T * out * 4), "%s %s in %d out %d: "
                                     "rows at T %d differ from the same rows at T %d", what,
                                     bf ? "bf16" : "fp16", in, out, T, TM);
                    }
                kvcu_free(dx), kvcu_free(dW), kvcu_free(dy), kvcu_free(dW16), kvcu_free(dx16);
                free(x), free(W), free(ref), free(y), free(all);
            }
}

/* kvcu_matmul_x16 from an x rounded once (kvcu_to16, as the engine rounds each layer input), on
 * shapes the tiles and the cp.async ring meet unevenly: in 40 (two 32-column tiles, the second
 * a quarter full: fewer tiles than the 128-token ring's 3 buffers), 200 (7 tiles: the 16-token
 * ring of 4 wraps), 520 (17 tiles at T 145: the 128-token ring wraps, the second token tile 17
 * rows deep); W a column slice of a wider matrix (ldw 104: 16-byte rows, cp.async) and rows not
 * 16-byte aligned (ldw 68, base 2 bytes off: the 2-byte staging); T no multiple of 16 or 128.
 * Each within (2u + u² + in·2^-23)·Σ|x·w| of kv_matmul_strided; the bits of kvcu_matmul_w16 on
 * the fp32 x (the same rounding, the same chain of mma steps); rows 5 .. 21 computed alone (a
 * 16-token tile) the bits of the same rows inside T. Below sm_80: refused, naming sm_80. */
static void test_matmul_x16(void)
{
    static const int shapes[][5] = {/* T, in, out, ldw, W's offset in elements */
                                    {145, 40, 136, 40, 0}, {33, 200, 9, 200, 0},
                                    {145, 520, 7, 520, 0}, {3, 96, 130, 104, 8},
                                    {20, 64, 17, 68, 1}};
    const int mma = kvcu_device_sm() >= 80;
    for (int bf = 0; bf <= 1; bf++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int T = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
            const int ldw = shapes[si][3], off = shapes[si][4];
            const double u = ldexp(1.0, bf ? -8 : -11);
            float *x = host_random((size_t)T * in, -1, 1);
            float *W = host_random((size_t)out * ldw + off, -1, 1);
            float *ref = malloc((size_t)T * out * 4), *y = malloc((size_t)T * out * 4);
            float *y2 = malloc((size_t)T * out * 4);
            kv_matmul_strided(ref, x, W + off, T, in, out, ldw);
            float *dx = dev_copy(x, (size_t)T * in * 4), *dy = dev_copy(ref, (size_t)T * out * 4);
            float *dW = dev_copy(W, ((size_t)out * ldw + off) * 4);
            uint16_t *dW16 = NULL, *dx16 = NULL, *dxs = NULL; /* dxs [T][in]: w16's scratch */
            kv_err e;
            int rc = kvcu_malloc((void **)&dW16, ((size_t)out * ldw + off) * 2, &e);
            if (!rc) rc = kvcu_to16(dW16, dW, (int64_t)out * ldw + off, bf, &e);
            if (!rc) rc = kvcu_malloc((void **)&dx16, (size_t)T * in * 2, &e);
            if (!rc) rc = kvcu_to16(dx16, dx, (int64_t)T * in, bf, &e);
            if (!rc) rc = kvcu_malloc((void **)&dxs, (size_t)T * in * 2, &e);
            KV_CHECK(rc == KV_OK, "16-bit copies: %s", e.msg);
            char what[80];
            snprintf(what, sizeof what, "matmul_x16 %s T %d in %d out %d ldw %d",
                     bf ? "bf16" : "fp16", T, in, out, ldw);
            if (!rc) rc = kvcu_matmul_x16(dy, dx16, dW16 + off, bf, T, in, out, ldw, &e);
            if (!mma) {
                KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "sm_80"),
                         "%s below sm_80: %d, %s", what, rc, rc ? e.msg : "");
                rc = -1; /* nothing more to check */
            } else {
                if (!rc) rc = kvcu_download(y, dy, (size_t)T * out * 4, &e);
                KV_CHECK(rc == KV_OK, "%s: %s", what, e.msg);
            }
            if (!rc) {
                const double coef = 2.0 * u + u * u + in * ldexp(1.0, -23);
                const long bad = outside_bound(what, y, ref, x, W + off, T, in, out, ldw, coef);
                KV_CHECK(bad == 0, "%s: %ld outside the bound", what, bad);
                rc = kvcu_matmul_w16(dy, dx, dxs, dW16 + off, bf, T, in, out, ldw, &e);
                if (!rc) rc = kvcu_download(y2, dy, (size_t)T * out * 4, &e);
                KV_CHECK(!rc && !memcmp(y, y2, (size_t)T * out * 4),
                         "%s: not the bits of kvcu_matmul_w16 on the fp32 x (%s)", what,
                         rc ? e.msg : "they differ");
                const int r0 = T > 5 ? 5 : 0, n = T - r0 < 17 ? T - r0 : 17;
                if (!rc) rc = kvcu_matmul_x16(dy, dx16 + (size_t)r0 * in, dW16 + off, bf, n, in,
                                              out, ldw, &e);
                if (!rc) rc = kvcu_download(y2, dy, (size_t)n * out * 4, &e);
                KV_CHECK(!rc && !memcmp(y + (size_t)r0 * out, y2, (size_t)n * out * 4),
                         "%s: rows %d .. %d alone differ from the same rows at T %d (%s)", what,
                         r0, r0 + n - 1, T, rc ? e.msg : "their bits");
            }
            kvcu_free(dx), kvcu_free(dy), kvcu_free(dW), kvcu_free(dW16), kvcu_free(dx16);
            kvcu_free(dxs);
            free(x), free(W), free(ref), free(y), free(y2);
        }
}

/* ---- rope ------------------------------------------------------------------------------ */

static void test_rope(void)
{
    const int dims[] = {64, 128};
    for (int a = 0; a < 2; a++) {
        const int d = dims[a];
        const int rotary[] = {d, d / 2, 0}; /* full, partial, none */
        for (int r = 0; r < 3; r++)
            for (int T = 1; T <= 5; T += 4) {
                const int H = 3;
                int pos[5];
                for (int t = 0; t < T; t++)
                    pos[t] = t == 0 ? 40000 - 1 : (int)(kv_rng_u32(&rng) % 300);
                float *x = host_random((size_t)T * H * d, -1, 1);
                float *ref = malloc((size_t)T * H * d * sizeof(float));
                memcpy(ref, x, (size_t)T * H * d * sizeof(float));
                double freq[KV_ROPE_MAX_PAIRS];
                kv_test_rope_freqs(10000.0f, rotary[r], freq);
                kv_rope(ref, pos, T, H, d, rotary[r], freq);
                float *dx = dev_copy(x, (size_t)T * H * d * 4);
                int *dpos = dev_copy(pos, (size_t)T * sizeof(int));
                kv_err e;
                int rc = kvcu_rope(dx, dpos, T, H, d, rotary[r], freq, &e);
                KV_CHECK(rc == KV_OK, "kvcu_rope: %s", e.msg);
                char what[80];
                snprintf(what, sizeof what, "rope T %d d %d rotary %d", T, d, rotary[r]);
                check_close(what, dx, ref, (size_t)T * H * d);
                kvcu_free(dx), kvcu_free(dpos);
                free(x), free(ref);
            }
    }
    kv_err e;
    double freq[KV_ROPE_MAX_PAIRS] = {0};
    KV_CHECK(kvcu_rope(NULL, NULL, 1, 1, 8, 7, freq, &e) == KV_ERR_ARG,
             "odd rotary_dim is refused");
}

/* ---- swiglu, add, embed --------------------------------------------------------------- */

static void test_elementwise(void)
{
    for (int a = 0; a < N_LENGTHS; a++) {
        const int n = lengths[a] * 5; /* T = 5 rows of each length */
        float *g = host_random(n, -6, 6), *u = host_random(n, -2, 2);
        float *ref = malloc((size_t)n * sizeof(float));
        float *dg = dev_copy(g, (size_t)n * 4), *du = dev_copy(u, (size_t)n * 4);
        kv_err e;
        char what[64];
        memcpy(ref, g, (size_t)n * 4);
        kv_swiglu(ref, u, n);
        KV_CHECK(kvcu_swiglu(dg, du, n, &e) == KV_OK, "kvcu_swiglu: %s", e.msg);
        snprintf(what, sizeof what, "swiglu n %d", n);
        check_close(what, dg, ref, n);

        kvcu_upload(dg, g, (size_t)n * 4, &e);
        memcpy(ref, g, (size_t)n * 4);
        kv_add(ref, u, n);
        KV_CHECK(kvcu_add(dg, du, n, &e) == KV_OK, "kvcu_add: %s", e.msg);
        snprintf(what, sizeof what, "add n %d", n);
        check_close(what, dg, ref, n);
        kvcu_free(dg), kvcu_free(du);
        free(g), free(u), free(ref);
    }

    const int vocab = 33, dim = 64;
    float *table = host_random((size_t)vocab * dim, -1, 1);
    float *dtable = dev_copy(table, (size_t)vocab * dim * 4);
    for (int T = 1; T <= 5; T += 4) {
        int tokens[5] = {vocab - 1, 0, 7, 7, 19};
        float *ref = malloc((size_t)T * dim * sizeof(float));
        kv_embed(ref, table, tokens, T, dim);
        int *dtok = dev_copy(tokens, sizeof tokens);
        float *dout = NULL;
        kv_err e;
        kvcu_malloc((void **)&dout, (size_t)T * dim * 4, &e);
        KV_CHECK(kvcu_embed(dout, dtable, dtok, T, dim, &e) == KV_OK, "kvcu_embed: %s", e.msg);
        check_close(T == 1 ? "embed T 1" : "embed T 5", dout, ref, (size_t)T * dim);
        kvcu_free(dtok), kvcu_free(dout);
        free(ref);
    }
    kvcu_free(dtable);
    free(table);
}

/* ---- decode attention ---------------------------------------------------------------- */

static void test_attn_decode(void)
{
    const int dims[] = {64, 128};
    const int H = 8, kv_heads[] = {8, 4, 2, 1}; /* G = 1 (MHA), 2, 4, 8 (MQA) */
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < N_LENGTHS; c++) {
                const int d = dims[a], Hkv = kv_heads[b], len = lengths[c];
                const int max_seq = len + 3; /* rows past len hold garbage nobody may read */
                float *q = host_random((size_t)H * d, -1, 1);
                /* keys scaled so the softmax is peaked, not uniform */
                float *k = host_random((size_t)Hkv * max_seq * d, -1.5f, 1.5f);
                float *v = host_random((size_t)Hkv * max_seq * d, -1, 1);
                float *ref = malloc((size_t)H * d * sizeof(float));
                int rc = kv_attn_decode(q, k, v, ref, H, Hkv, d, max_seq, len);
                KV_CHECK(rc == KV_OK, "kv_attn_decode: %d", rc);
                float *dq = dev_copy(q, (size_t)H * d * 4);
                float *dk = dev_copy(k, (size_t)Hkv * max_seq * d * 4);
                float *dv = dev_copy(v, (size_t)Hkv * max_seq * d * 4);
                float *dout = dev_copy(q, (size_t)H * d * 4);
                kv_err e;
                rc = kvcu_attn_decode(dq, dk, dv, dout, H, Hkv, d, max_seq, len, &e);
                KV_CHECK(rc == KV_OK, "kvcu_attn_decode: %s", e.msg);
                char what[96];
                snprintf(what, sizeof what, "attn_decode d %d H %d H_kv %d len %d", d, H, Hkv,
                         len);
                check_close(what, dout, ref, (size_t)H * d);
                kvcu_free(dq), kvcu_free(dk), kvcu_free(dv), kvcu_free(dout);
                free(q), free(k), free(v), free(ref);
            }
    kv_err e;
    KV_CHECK(kvcu_attn_decode(NULL, NULL, NULL, NULL, 8, 3, 64, 16, 4, &e) == KV_ERR_ARG,
             "H_kv that does not divide H is refused");
    KV_CHECK(kvcu_attn_decode(NULL, NULL, NULL, NULL, 8, 8, 64, 16, 17, &e) == KV_ERR_ARG,
             "len > max_seq is refused");
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_err e;
    char desc[128];
    if (kvcu_device_describe(desc, sizeof desc, &e) == KV_OK) printf("device: %s\n", desc);
    kv_rng_seed(&rng, 2024);
    test_rmsnorm();
    test_matmul();
    test_matmul_w16();
    test_matmul_x16();
    test_rope();
    test_elementwise();
    test_attn_decode();

    /* below sm_80 (a Turing GPU, or the emulator as one: KVEMU_SM=75) kvcu_matmul_w16 above ran
     * on CUDA cores; what has no such path is refused with a sentence naming the GPU */
    const int sm = kvcu_device_sm();
    KV_CHECK(sm >= 75, "kvcu_device_available() passed a device of sm_%d", sm);
    if (sm >= 80) /* kvcu_matmul_w16 rounds x into the caller's scratch: none is refused */
        KV_CHECK(kvcu_matmul_w16(NULL, NULL, NULL, NULL, 0, 1, 8, 8, 8, &e) == KV_ERR_ARG &&
                     strstr(e.msg, "scratch"),
                 "kvcu_matmul_w16 without a scratch: not refused");
    if (sm < 80) {
        double flops = 0.0;
        const int rc = kvcu_mma_throughput(0, 4, 1, &flops, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "sm_80") && strstr(e.msg, "(sm_"),
                 "kvcu_mma_throughput below sm_80: %d, %s", rc, rc ? e.msg : "");
    }

    void *huge = NULL;
    KV_CHECK(kvcu_malloc(&huge, (size_t)1 << 50, &e) == KV_ERR_NOMEM,
             "a 1 PiB allocation is KV_ERR_NOMEM");
    return kv_test_finish();
}
