/* The forward pass's building blocks (kv_ops.h) and kv_attn_decode (kv_attention.h), each
 * against a straightforward double-precision evaluation of its formula. */
#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_rope.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *x, size_t n, kv_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(r, lo, hi);
}

static float *fbuf(size_t n) { return calloc(n, sizeof(float)); }

static void test_rmsnorm(kv_rng *r)
{
    const int T = 5, n = 67; /* not a multiple of the 8 dot-product lanes */
    float *x = fbuf(T * n), *w = fbuf(n), *out = fbuf(T * n), *ref = fbuf(T * n);
    fill(x, T * n, r, -3, 3);
    fill(w, n, r, 0.5f, 1.5f);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[t * n + i] * x[t * n + i];
        double inv = 1.0 / sqrt(ss / n + 1e-5);
        for (int i = 0; i < n; i++) ref[t * n + i] = (float)(x[t * n + i] * inv * w[i]);
    }
    kv_rmsnorm(out, x, w, T, n, 1e-5f);
    KV_CHECK(kv_test_compare("rmsnorm", out, ref, T * n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "rmsnorm vs double");
    kv_rmsnorm(x, x, w, T, n, 1e-5f); /* in place: out aliases x */
    KV_CHECK(memcmp(x, out, sizeof(float) * T * n) == 0, "rmsnorm in place equals out of place");
    free(x), free(w), free(out), free(ref);
}

static void test_matmul(kv_rng *r)
{
    const int shapes[3][3] = {{1, 64, 64}, {7, 67, 33}, {300, 128, 96}}; /* T, in, out */
    for (int s = 0; s < 3; s++) {
        const int T = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        float *x = fbuf((size_t)T * in), *W = fbuf((size_t)out * in);
        float *y = fbuf((size_t)T * out), *ref = fbuf((size_t)T * out);
        fill(x, (size_t)T * in, r, -1, 1);
        fill(W, (size_t)out * in, r, -1, 1);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < out; i++) {
                double acc = 0;
                for (int j = 0; j < in; j++) acc += (double)W[i * in + j] * x[t * in + j];
                ref[t * out + i] = (float)acc;
            }
        kv_matmul(y, x, W, T, in, out);
        KV_CHECK(kv_test_compare("matmul", y, ref, (long)T * out, KV_TOL_F32_ATOL,
                                 KV_TOL_F32_RTOL) == 0, "matmul T %d in %d out %d", T, in, out);
        /* row independence: row t alone gives the same bits as row t inside the batch */
        float *y1 = fbuf(out);
        kv_matmul(y1, x + (size_t)(T - 1) * in, W, 1, in, out);
        KV_CHECK(memcmp(y1, y + (size_t)(T - 1) * out, sizeof(float) * out) == 0,
                 "matmul: a row alone equals the row in a batch (T %d)", T);
        /* thread independence: the team splits rows, never a sum (load ignored, so the
         * team really runs even on a busy machine) */
        float *y2 = fbuf((size_t)T * out);
        const int threads = omp_get_max_threads();
        kv_parallel_ignore_load(1);
        omp_set_num_threads(2);
        kv_matmul(y2, x, W, T, in, out);
        omp_set_num_threads(1);
        kv_matmul(y, x, W, T, in, out);
        kv_parallel_ignore_load(0);
        omp_set_num_threads(threads);
        KV_CHECK(memcmp(y, y2, sizeof(float) * T * out) == 0,
                 "matmul T %d in %d out %d: 1 and 2 threads give the same bits", T, in, out);
        free(y2);
        free(x), free(W), free(y), free(ref), free(y1);
    }
}

/* double reference of kv_rope for one head vector */
static void rope_ref(double *out, const float *x, int pos, int head_dim, int rotary_dim,
                     double theta)
{
    for (int i = 0; i < head_dim; i++) out[i] = x[i];
    for (int i = 0; i < rotary_dim; i += 2) {
        double a = pos * pow(theta, -(double)i / rotary_dim);
        out[i] = x[i] * cos(a) - x[i + 1] * sin(a);
        out[i + 1] = x[i] * sin(a) + x[i + 1] * cos(a);
    }
}

static void test_rope(kv_rng *r)
{
    const int H = 3, d = 16;
    const int rot_dims[2] = {16, 8}; /* full and partial rotary */
    const int pos[4] = {0, 1, 37, 4095};
    for (int rd = 0; rd < 2; rd++) {
        const int rot = rot_dims[rd];
        float *x = fbuf(4 * H * d), *x0 = fbuf(4 * H * d), *ref = fbuf(4 * H * d);
        fill(x, 4 * H * d, r, -1, 1);
        memcpy(x0, x, sizeof(float) * 4 * H * d);
        double tmp[16];
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < H; h++) {
                rope_ref(tmp, x0 + (t * H + h) * d, pos[t], d, rot, 10000.0);
                for (int i = 0; i < d; i++) ref[(t * H + h) * d + i] = (float)tmp[i];
            }
        double freq[KV_ROPE_MAX_PAIRS];
        kv_test_rope_freqs(10000.0f, rot, freq);
        kv_rope(x, pos, 4, H, d, rot, freq);
        KV_CHECK(kv_test_compare("rope", x, ref, 4 * H * d, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
                 "rope vs double, rotary_dim %d", rot);
        /* position 0 is the identity; dims past rotary_dim are never touched */
        KV_CHECK(memcmp(x, x0, sizeof(float) * H * d) == 0, "rope at pos 0 is the identity");
        int untouched = 1;
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < H; h++)
                for (int i = rot; i < d; i++)
                    untouched &= x[(t * H + h) * d + i] == x0[(t * H + h) * d + i];
        KV_CHECK(untouched, "rope leaves dims >= rotary_dim %d alone", rot);
        /* a rotation preserves each head's norm */
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < H; h++) {
                double n0 = 0, n1 = 0;
                for (int i = 0; i < d; i++) {
                    n0 += (double)x0[(t * H + h) * d + i] * x0[(t * H + h) * d + i];
                    n1 += (double)x[(t * H + h) * d + i] * x[(t * H + h) * d + i];
                }
                KV_CHECK(fabs(sqrt(n1) - sqrt(n0)) <= 1e-5 * sqrt(n0),
                         "rope preserves the norm (pos %d head %d: %g vs %g)", pos[t], h,
                         sqrt(n1), sqrt(n0));
            }
        free(x), free(x0), free(ref);
    }

    /* q·k after RoPE depends only on the distance m - n:
     * (m, n) = (7, 3), (107, 103), (1007, 1003) */
    for (int rd = 0; rd < 2; rd++) {
        const int rot = rot_dims[rd];
        float q[16], k[16];
        fill(q, d, r, -1, 1);
        fill(k, d, r, -1, 1);
        double dots[3];
        for (int c = 0; c < 3; c++) {
            int base[3] = {0, 100, 1000};
            float qq[16], kk[16];
            memcpy(qq, q, sizeof q);
            memcpy(kk, k, sizeof k);
            int pq = base[c] + 7, pk = base[c] + 3;
            double freq[KV_ROPE_MAX_PAIRS];
            kv_test_rope_freqs(10000.0f, rot, freq);
            kv_rope(qq, &pq, 1, 1, d, rot, freq);
            kv_rope(kk, &pk, 1, 1, d, rot, freq);
            dots[c] = 0;
            for (int i = 0; i < d; i++) dots[c] += (double)qq[i] * kk[i];
        }
        double scale = 0;
        for (int i = 0; i < d; i++) scale += fabs((double)q[i] * k[i]);
        KV_CHECK(fabs(dots[1] - dots[0]) <= 1e-5 * scale && fabs(dots[2] - dots[0]) <= 1e-5 * scale,
                 "rope: q.k depends only on m - n (rotary %d): %.9g %.9g %.9g", rot, dots[0],
                 dots[1], dots[2]);
    }
}

static void test_swiglu_add_softmax_embed(kv_rng *r)
{
    const int n = 1000;
    float *g = fbuf(n), *u = fbuf(n), *ref = fbuf(n);
    fill(g, n, r, -8, 8);
    fill(u, n, r, -2, 2);
    for (int i = 0; i < n; i++) ref[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    kv_swiglu(g, u, n);
    KV_CHECK(kv_test_compare("swiglu", g, ref, n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "swiglu vs double");

    for (int i = 0; i < n; i++) ref[i] = g[i] + u[i];
    kv_add(g, u, n);
    KV_CHECK(memcmp(g, ref, sizeof(float) * n) == 0, "add");

    /* softmax with logits near 1e4 (exp would overflow without the max shift) */
    const int m = 50;
    float x[50], sref[50];
    for (int i = 0; i < m; i++) x[i] = 10000.0f + kv_rng_uniform(r, -20, 20);
    x[13] = -1e30f;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < m; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < m; i++) sum += exp(x[i] - mx);
    for (int i = 0; i < m; i++) sref[i] = (float)(exp(x[i] - mx) / sum);
    kv_softmax(x, m);
    KV_CHECK(kv_test_compare("softmax", x, sref, m, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "softmax of large values vs double");
    double total = 0;
    for (int i = 0; i < m; i++) total += x[i];
    KV_CHECK(fabs(total - 1.0) < 1e-5 && x[13] == 0.0f, "softmax sums to 1 (%g)", total);

    const int vocab = 10, dim = 6, T = 4;
    float table[60], out[24];
    fill(table, 60, r, -1, 1);
    const int toks[4] = {9, 0, 3, 9};
    kv_embed(out, table, toks, T, dim);
    int same = 1;
    for (int t = 0; t < T; t++)
        same &= memcmp(out + t * dim, table + toks[t] * dim, sizeof(float) * dim) == 0;
    KV_CHECK(same && vocab == 10, "embed copies the token rows");
    free(g), free(u), free(ref);
}

/* naive double attention: out[h] = softmax(q_h·K_{h/G}/sqrt d) V_{h/G} */
static void attn_ref(const float *q, const float *k, const float *v, float *out, int H, int Hkv,
                     int d, int max_seq, int len)
{
    double *s = malloc(sizeof(double) * len);
    for (int h = 0; h < H; h++) {
        const int kvh = h / (H / Hkv);
        double mx = -INFINITY, sum = 0;
        for (int p = 0; p < len; p++) {
            double acc = 0;
            for (int i = 0; i < d; i++)
                acc += (double)q[h * d + i] * k[((size_t)kvh * max_seq + p) * d + i];
            s[p] = acc / sqrt((double)d);
            mx = fmax(mx, s[p]);
        }
        for (int p = 0; p < len; p++) sum += (s[p] = exp(s[p] - mx));
        for (int i = 0; i < d; i++) {
            double acc = 0;
            for (int p = 0; p < len; p++) acc += s[p] * v[((size_t)kvh * max_seq + p) * d + i];
            out[h * d + i] = (float)(acc / sum);
        }
    }
    free(s);
}

static void test_attn_decode(kv_rng *r)
{
    const int H = 8, d = 64, max_seq = 40;
    const int kv_heads[4] = {8, 4, 2, 1}; /* MHA, GQA G=2, GQA G=4, MQA */
    const int lens[3] = {1, 7, 33};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++) {
            const int Hkv = kv_heads[a], len = lens[b];
            float *q = fbuf(H * d), *out = fbuf(H * d), *ref = fbuf(H * d);
            float *k = fbuf((size_t)Hkv * max_seq * d), *v = fbuf((size_t)Hkv * max_seq * d);
            fill(q, H * d, r, -2, 2); /* scores of spread ~ several units: peaked softmax */
            fill(k, (size_t)Hkv * max_seq * d, r, -1, 1);
            fill(v, (size_t)Hkv * max_seq * d, r, -1, 1);
            /* positions >= len hold garbage attention must not read */
            for (int h = 0; h < Hkv; h++)
                for (int p = len; p < max_seq; p++)
                    for (int i = 0; i < d; i++) k[((size_t)h * max_seq + p) * d + i] = NAN;
            attn_ref(q, k, v, ref, H, Hkv, d, max_seq, len);
            int rc = kv_attn_decode(q, k, v, out, H, Hkv, d, max_seq, len);
            KV_CHECK(rc == 0 && kv_test_compare("attn_decode", out, ref, H * d, KV_TOL_F32_ATOL,
                                                KV_TOL_F32_RTOL) == 0,
                     "kv_attn_decode H %d H_kv %d len %d", H, Hkv, len);
            free(q), free(out), free(ref), free(k), free(v);
        }
    float x[4] = {0};
    KV_CHECK(kv_attn_decode(x, x, x, x, 4, 3, 1, 1, 1) == KV_ERR_ARG, "H_kv 3 does not divide H 4");
    KV_CHECK(kv_attn_decode(x, x, x, x, 1, 1, 4, 1, 2) == KV_ERR_ARG, "len 2 > max_seq 1");
    KV_CHECK(kv_attn_decode(x, x, x, x, 1, 1, 4, 1, 0) == KV_ERR_ARG, "len 0");
}

int main(void)
{
    kv_rng r;
    kv_rng_seed(&r, 1234);
    test_rmsnorm(&r);
    test_matmul(&r);
    test_rope(&r);
    test_swiglu_add_softmax_embed(&r);
    test_attn_decode(&r);
    return kv_test_finish();
}
