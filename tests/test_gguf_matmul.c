/* Quantized-weight matrix products (reference_cpu/model/kv_gguf_matmul.h, kv_gguf_matmul_fast.h).
 *
 * The reference, kv_gguf_matmul(), is a dequantized row (kv_ggml_dequant_row(), held bit for
 * bit to the gguf Python package by test_gguf_quant) times the activations by kv_dot16(): it
 * must give exactly kv_matmul() on the dequantized matrix. The fast path rounds the activations
 * to int8 and is held to the reference by the bound derived here:
 *
 * Let x_j be an activation, b its block of 32, amax_b = max_{j in b} |x_j|, r = fl(amax_b/127),
 * c_j = rint(fl(x_j * fl(127 / amax_b))) (ggml's rounding), dx = h(r) with h() the rounding
 * to binary16, and x^_j = dx c_j (what the fast path multiplies).
 *   Activation rounding. fl(x * fl(127/amax)) is x 127/amax within 2u + u^2 of relative
 *   error, at most 127 (1 + 3u), so |x 127/amax - c| <= 1/2 + 384 u and, with r's own
 *   rounding, |x - r c| <= amax/254 (1 + 2^-13). The clamp to +-127 never moves a code.
 *   dx rounds r: |x - x^| <= E_b := amax_b / 254 (1 + 2^-13) + 127 |dx - r|. A block whose
 *   step would be below FLT_MIN is rounded to zero: there E_b := amax_b.
 *   Q4_1's minimum m multiplies ds = h(fl(r sum c)) where the reference has sum_j x_j:
 *   |sum x - ds| <= 32 amax/254 (1 + 2^-13) + D_b, D_b = |ds - fl(r sum c)| + u |r sum c|.
 *   With w~_j = a_j + o_j the weight computed exactly (a_j its scale part, o_j its offset
 *   part; the fast path never rounds it: its integer sums are exact), the scale parts err
 *   by |a_j| E_b <= (|w~_j| + |o_j|) E_b and the offsets by |o_j| E_b (Q4_1: |m| D_b more):
 *   A = sum_b (E_b sum_{j in b} (|w~_j| + 2 |o_j|) + |m_b| D_b), and
 *   |w~_j| <= |w_j| (1 + u), w_j = fl(w~_j) the reference's weight.
 *   Float steps of the fast path. A block's term is fl(fl(s dx) * fl(I)) for an integer sum I
 *   and a weight scale s (three roundings: 3u of its magnitude), or, with an offset or minimum
 *   (Q4_1, Q4_K, Q5_K), the sum or difference of two such, P and Q (4u of |P| + |Q|). With a_j the
 *   scale part of weight j and o_j its offset part (w~_j = a_j + o_j), |P| + |Q| <=
 *   sum_{j in b} (|a_j| + |o_j|) |x^_j| <= sum (|w_j| + 2 |o_j|)(|x_j| + E_b) (1 + u). The
 *   terms are added in order into one float over nb = in / 32 blocks (gamma_nb). With the
 *   reference's rounding of w~ into w (u |w_j| |x^_j|):
 *   F = (nb + 5) u sum_j (|w_j| + 2 |o_j|)(|x_j| + E_b).
 *   The reference's own dot: sixteen lanes of in / 16 products each, folded in 4 steps:
 *   R = (in / 16 + 5) u sum_j |w_j x_j|.
 * So |fast - reference| <= (A + F + R)(1 + 2^-10), the last factor covering the terms in u^2
 * (each below 2^-20 of its first-order term at these sizes). o_j is read from the library
 * itself: the row dequantized with its codes set to zero (Q4_1: m; Q4_K, Q5_K: -dmin m_j).
 * With activations that are integers with a +-127 in every block, dx = 1 and c = x exactly:
 * E_b = 0 (D_b = 0 while |sum c| <= 2048), and the fast path must be within F + R of the
 * reference, float rounding alone.
 *
 * The AVX2 and portable loops compute the same integer sums and the same float steps: their
 * outputs must be equal bit for bit, as must 1 and 2 threads and a batch against its tokens
 * (a batch of 8 tokens or more runs in tiles of 8 under AVX2, the rest of its tokens in the
 * row loops: token counts 1 to 33 below).
 */
#include "common/kv_test.h"
#include "kv_gguf_matmul.h"
#include "kv_gguf_matmul_fast.h"
#include "kv_gguf_quant.h"
#include "kv_ops.h"
#include "kv_ops_fast.h"

#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float uniform(void) { return (float)(next_u32() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

/* the fp16 fields of a block, and (types with an offset) the bytes of its codes */
typedef struct { int type; int f16[2], n_f16; int code0, code1; } layout;
static const layout LAYOUTS[] = {
    {KV_GGML_Q4_0, {0}, 1, 0, 0},        {KV_GGML_Q4_1, {0, 2}, 2, 4, 20},
    {KV_GGML_Q5_0, {0}, 1, 0, 0},        {KV_GGML_Q5_1, {0, 2}, 2, 0, 0},
    {KV_GGML_Q8_0, {0}, 1, 0, 0},        {KV_GGML_Q2_K, {80, 82}, 2, 0, 0},
    {KV_GGML_Q3_K, {108}, 1, 0, 0},      {KV_GGML_Q4_K, {0, 2}, 2, 16, 144},
    {KV_GGML_Q5_K, {0, 2}, 2, 16, 176},     {KV_GGML_Q6_K, {208}, 1, 0, 0},
    {KV_GGML_F16, {0}, 0, 0, 0},         {KV_GGML_BF16, {0}, 0, 0, 0},
    {KV_GGML_F32, {0}, 0, 0, 0},
};

/* A random matrix [out] rows of @p in weights: random codes, fp16 scales of a trained
 * matrix's size (2^-10 .. 2^-5; the Q4_1 offset of either sign). Float types: small values. */
static uint8_t *make_matrix(const layout *L, int in, int out, uint64_t *row_bytes)
{
    const kv_ggml_type_info *t = kv_ggml_type(L->type);
    kv_ggml_row_bytes(L->type, in, row_bytes, NULL);
    uint8_t *W = malloc(*row_bytes * out);
    for (uint64_t i = 0; i < *row_bytes * out; i++) W[i] = (uint8_t)next_u32();
    const int64_t nb = (int64_t)in / t->block * out;
    for (int64_t k = 0; k < nb; k++) {
        uint8_t *blk = W + k * t->block_bytes;
        if (L->type == KV_GGML_F32) {
            const float v = uniform() * 0.05f;
            memcpy(blk, &v, 4);
        } else if (t->block == 1) {            /* F16, BF16: exponents of 2^-10 .. 2^-5 */
            const uint16_t h = L->type == KV_GGML_F16 ? (uint16_t)((5 + next_u32() % 6) << 10 | (next_u32() & 0x83ff))
                                                      : (uint16_t)((117 + next_u32() % 6) << 7 | (next_u32() & 0x807f));
            blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
        }
        for (int f = 0; f < L->n_f16; f++) {
            const int sign = L->type == KV_GGML_Q4_1 && f == 1 && (next_u32() & 1);
            const uint16_t h = (uint16_t)(sign << 15 | (5 + next_u32() % 6) << 10 | (next_u32() & 0x3ff));
            blk[L->f16[f]] = (uint8_t)h, blk[L->f16[f] + 1] = (uint8_t)(h >> 8);
        }
    }
    return W;
}

/* activations: uniform in [-s_b, s_b] with a scale per block of 32 (one block zero, one
 * below the flush threshold); exact = 1: integers with a +-127 in every block */
static void make_acts(float *x, int n, int exact)
{
    for (int b = 0; b < n / 32; b++) {
        const float s = b % 7 == 3 ? 0.0f : b % 11 == 5 ? 1e-38f : 0.01f + (float)(b % 5);
        for (int j = 0; j < 32; j++)
            x[32 * b + j] = exact ? (float)((int)(next_u32() % 255) - 127) : s * uniform();
        if (exact) x[32 * b + (int)(next_u32() % 32)] = next_u32() & 1 ? 127.0f : -127.0f;
    }
}

/* binary16 rounding (the compiler's IEEE conversion, to nearest even) */
static double h16(float v) { return (double)(float)(_Float16)v; }

/* the bound of the header comment for output row i of token x; q4_1: its minimum's D_b */
static double bound(const float *w, const float *o, const float *x, int in, int exact, int q4_1)
{
    const double u = 0x1p-24;
    double A = 0.0, F = 0.0, R = 0.0;
    for (int b = 0; b < in / 32; b++) {
        float amax = 0.0f;
        for (int j = 32 * b; j < 32 * b + 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float r = amax / 127.0f, id = 127.0f / amax;
        const int flush = r < FLT_MIN;
        float csum = 0.0f; /* sum of ggml's codes */
        for (int j = 32 * b; j < 32 * b + 32 && !flush; j++)
            csum += fminf(fmaxf(rintf(x[j] * id), -127.0f), 127.0f);
        const double E = exact ? 0.0 /* c = x, dx = 1 */
                         : flush ? amax : amax / 254.0 * (1 + 0x1p-13) + 127.0 * fabs(h16(r) - r);
        const float rs = r * csum;
        const double D = flush || !q4_1 ? 0.0 : fabs(h16(rs) - rs) + u * fabs(rs);
        A += fabs(o[32 * b]) * D;
        for (int j = 32 * b; j < 32 * b + 32; j++) {
            A += E * (fabs(w[j]) * (1 + u) + 2.0 * fabs(o[j]));
            F += (fabs(w[j]) + 2.0 * fabs(o[j])) * (fabs(x[j]) + E);
            R += fabs((double)w[j] * x[j]);
        }
    }
    return (A + (in / 32 + 5) * u * F + (in / 16 + 5) * u * R) * (1 + 0x1p-10);
}

static void check_type(const layout *L, int in, int out, int T, int exact)
{
    const char *name = kv_ggml_type_name(L->type);
    uint64_t rb = 0;
    uint8_t *W = make_matrix(L, in, out, &rb);
    float *x = malloc(sizeof(float) * T * in), *wf = malloc(sizeof(float) * in * out);
    float *o = malloc(sizeof(float) * in * out);
    float *ref = malloc(sizeof(float) * T * out), *mat = malloc(sizeof(float) * T * out);
    float *fast = malloc(sizeof(float) * T * out), *port = malloc(sizeof(float) * T * out);
    float *one = malloc(sizeof(float) * out), *thr1 = malloc(sizeof(float) * T * out);
    for (int t = 0; t < T; t++) make_acts(x + (size_t)t * in, in, exact);

    /* the dequantized matrix, and its offset parts (codes zeroed) */
    uint8_t *Z = malloc(rb * out);
    memcpy(Z, W, rb * out);
    const kv_ggml_type_info *ti = kv_ggml_type(L->type);
    for (int64_t k = 0; L->code1 && k < (int64_t)rb * out / ti->block_bytes; k++)
        memset(Z + k * ti->block_bytes + L->code0, 0, (size_t)(L->code1 - L->code0));
    for (int i = 0; i < out; i++) {
        kv_ggml_dequant_row(L->type, W + i * rb, wf + (size_t)i * in, in);
        kv_ggml_dequant_row(L->type, Z + i * rb, o + (size_t)i * in, in);
        if (!L->code1) memset(o + (size_t)i * in, 0, sizeof(float) * in); /* no offset term */
    }

    kv_err err = {{0}};
    KV_CHECK(kv_gguf_matmul(ref, x, W, L->type, T, in, out, &err) == KV_OK, "%s: %s", name, err.msg);
    kv_matmul(mat, x, wf, T, in, out);
    KV_CHECK(memcmp(ref, mat, sizeof(float) * T * out) == 0,
             "%s: the reference is not kv_matmul() of the dequantized matrix", name);

    kv_matmul_fast_use_avx2(1);
    KV_CHECK(kv_gguf_matmul_fast(fast, x, W, L->type, T, in, out, &err) == KV_OK, "%s: %s", name, err.msg);
    kv_matmul_fast_use_avx2(0);
    KV_CHECK(kv_gguf_matmul_fast(port, x, W, L->type, T, in, out, &err) == KV_OK, "%s: %s", name, err.msg);
    kv_matmul_fast_use_avx2(1);
    KV_CHECK(memcmp(fast, port, sizeof(float) * T * out) == 0,
             "%s: the %s and portable loops differ", name, kv_matmul_fast_isa());

    /* one thread, and each token alone, give the same bits */
    omp_set_num_threads(1);
    kv_gguf_matmul_fast(thr1, x, W, L->type, T, in, out, &err);
    omp_set_num_threads(2);
    KV_CHECK(memcmp(fast, thr1, sizeof(float) * T * out) == 0, "%s: 1 and 2 threads differ", name);
    int batch_same = 1;
    for (int t = 0; t < T; t++) {
        kv_gguf_matmul_fast(one, x + (size_t)t * in, W, L->type, 1, in, out, &err);
        batch_same &= memcmp(one, fast + (size_t)t * out, sizeof(float) * out) == 0;
    }
    KV_CHECK(batch_same, "%s: a batch differs from its tokens one at a time", name);

    if (!kv_gguf_matmul_fast_has(L->type)) {
        KV_CHECK(memcmp(fast, ref, sizeof(float) * T * out) == 0,
                 "%s: no integer path, so the reference's bits", name);
    } else {
        long bad = 0;
        double worst = 0.0, tight = 0.0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < out; i++) {
                const float *xt = x + (size_t)t * in;
                const double lim = bound(wf + (size_t)i * in, o + (size_t)i * in, xt, in, exact,
                                         L->type == KV_GGML_Q4_1);
                const double e = fabs((double)fast[t * out + i] - ref[t * out + i]);
                double mag = 0.0;
                for (int j = 0; j < in; j++) mag += fabs((double)wf[(size_t)i * in + j] * xt[j]);
                if (!(e <= lim) && bad++ < 3)
                    printf("  %s: token %d row %d: fast %.9g, reference %.9g, |err| %.3g > %.3g\n",
                           name, t, i, fast[t * out + i], ref[t * out + i], e, lim);
                worst = fmax(worst, e / lim);
                tight = fmax(tight, lim / mag);
            }
        KV_CHECK(bad == 0, "%s: %ld outputs beyond the bound", name, bad);
        /* a bound that large would pass a wrong product: it stays a small part of the sum */
        KV_CHECK(tight < (exact ? 1e-4 : 0.05), "%s: bound up to %.3g of sum |w x|", name, tight);
        printf("%-5s in %d out %d T %d %s: max |err| / bound %.3f, bound <= %.2g sum |w x|\n",
               name, in, out, T, exact ? "integer acts" : "random acts", worst, tight);
    }
    free(W), free(Z), free(x), free(wf), free(o), free(ref), free(mat), free(fast), free(port);
    free(one), free(thr1);
}

static void check_special(void)
{
    /* a NaN or an infinity among a token's activations: NaN in every output of that token
     * (9 tokens: token 1 in a tile of 8, token 8 in the row loops), the others finite */
    for (int k = 1; k < 10; k += 6) {
        const layout *L = &LAYOUTS[k]; /* Q4_1, Q4_K */
        uint64_t rb = 0;
        const int in = 256, out = 5;
        uint8_t *W = make_matrix(L, in, out, &rb);
        float x[9 * 256], y[9 * 5];
        make_acts(x, 9 * in, 0);
        x[in + 17] = NAN;
        x[8 * in + 200] = INFINITY;
        KV_CHECK(kv_gguf_matmul_fast(y, x, W, L->type, 9, in, out, NULL) == KV_OK, "nan");
        int nan_ok = 1;
        for (int i = 0; i < 9 * out; i++)
            nan_ok &= (isnan(y[i]) != 0) == (i / out == 1 || i / out == 8);
        KV_CHECK(nan_ok, "%s: a non-finite activation gives NaN outputs, in its token only",
                 kv_ggml_type_name(L->type));
        free(W);
    }

    /* refusals, named */
    kv_err err = {{0}};
    float dummy[64] = {0};
    uint8_t blocks[64] = {0};
    KV_CHECK(kv_gguf_matmul(dummy, dummy, blocks, 16, 1, 256, 1, &err) == KV_ERR_UNSUPPORTED &&
             strstr(err.msg, "IQ2_XXS"), "IQ2_XXS: '%s'", err.msg);
    KV_CHECK(kv_gguf_matmul_fast(dummy, dummy, blocks, 16, 1, 256, 1, &err) == KV_ERR_UNSUPPORTED,
             "fast IQ2_XXS: '%s'", err.msg);
    KV_CHECK(kv_gguf_matmul(dummy, dummy, blocks, KV_GGML_Q4_0, 1, 48, 1, &err) == KV_ERR_ARG &&
             strstr(err.msg, "Q4_0"), "Q4_0 in 48: '%s'", err.msg);
    KV_CHECK(kv_gguf_matmul_fast(dummy, dummy, blocks, KV_GGML_Q4_K, 1, 32, 1, &err) == KV_ERR_ARG,
             "fast Q4_K in 32: '%s'", err.msg);
    KV_CHECK(kv_gguf_matmul_fast(dummy, dummy, blocks, KV_GGML_Q8_0, -1, 32, 1, &err) == KV_ERR_ARG,
             "fast T -1: '%s'", err.msg);
}

int main(void)
{
    kv_parallel_ignore_load(1); /* thread counts are compared: the team must run */
    omp_set_num_threads(2);
    printf("fast path: %s\n", kv_matmul_fast_isa());
    for (size_t k = 0; k < sizeof LAYOUTS / sizeof LAYOUTS[0]; k++) {
        check_type(&LAYOUTS[k], 768, 37, 3, 0);
        check_type(&LAYOUTS[k], 512, 19, 1, 1);
        /* 19 blocks of 32: the AVX2 rows take eight blocks at a time, then one at a time
         * (SmolLM2's width 576 is 18 blocks), so both parts meet the portable bits */
        const kv_ggml_type_info *ti = kv_ggml_type(LAYOUTS[k].type);
        if (ti && ti->block == 32) check_type(&LAYOUTS[k], 608, 11, 2, 0);
    }
    /* a prefill: whole tiles of 8 tokens (kv_gguf_matmul_tiles()),
     * the rest of the tokens the row loops; the same bound, and each token's outputs the bits
     * of that token alone (check_type()), across tile boundaries and odd row counts */
    static const int TOKENS[] = {1, 3, 7, 8, 9, 33};
    for (size_t k = 0; k < sizeof LAYOUTS / sizeof LAYOUTS[0]; k++) {
        const kv_ggml_type_info *ti = kv_ggml_type(LAYOUTS[k].type);
        if (!kv_gguf_matmul_fast_has(LAYOUTS[k].type)) continue;
        for (size_t n = 0; n < sizeof TOKENS / sizeof TOKENS[0]; n++)
            check_type(&LAYOUTS[k], ti->block == 32 ? 608 : 512, 17 + 2 * (int)n, TOKENS[n],
                       (int)n % 2);
    }
    check_special();
    return kv_test_finish();
}
