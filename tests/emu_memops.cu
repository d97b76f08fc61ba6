/*
 * emu_memops.cu: the 16-byte loads, conversions and cp.async pipeline of cuda/core/kvcu_vec.cuh.
 *
 *  - kvcu_unpack<F>() of random 16-byte rows gives, element for element, the bits of the
 *    reference's software decode (kv_quant_math.h) in every per-token format;
 *  - a cp.async double buffer: batch A then batch B committed, __pipeline_wait_prior(1) lands
 *    A, (0) lands B; shared by every thread of the block after a __syncthreads(); zfill;
 *  - the emulation build's checks (kvemu_memops.h): a destination read before its wait sees the
 *    0xff poison, so a missing wait fails; a misaligned 16-byte load aborts the process with a
 *    message naming the address (run here as a child process: non-zero exit, the message). On a
 *    GPU the same child ends with cudaErrorMisalignedAddress.
 */
#include "kvcu_vec.cuh"
#include "kv_quant_math.h"
#include "common/kv_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_ROWS 64 /* 16-byte rows of each format */

template <int K>
__global__ void unpack_kernel(const uint8_t *in, float *out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x[16];
    kvcu_unpack<K>(kvcu_ld16(in + 16 * (size_t)i), x);
    for (int k = 0; k < kvcu_vec_elems(K); k++) out[(size_t)i * kvcu_vec_elems(K) + k] = x[k];
}

static int same_bits(float a, float b) { return (isnan(a) && isnan(b)) || kvq_f32_bits(a) == kvq_f32_bits(b); }

/* Kind K against format F's decode in kv_quant_math.h */
template <int K, int F>
static void check_unpack(const char *name, const uint8_t *h_in, uint8_t *d_in, float *d_out)
{
    const int vec = kvcu_vec_elems(K), n = N_ROWS * vec;
    KV_LAUNCH(unpack_kernel<K>, 1, N_ROWS, 0, 0, d_in, d_out, N_ROWS);
    float *got = (float *)malloc(sizeof(float) * n);
    KV_CHECK(cudaMemcpy(got, d_out, sizeof(float) * n, cudaMemcpyDeviceToHost) == cudaSuccess,
             "%s: copy back", name);
    const float one = 1.0f; /* int8: a scale of 1 leaves the code */
    long bad = 0;
    for (int i = 0; i < n; i++) {
        float want = F == KV_QF_INT8 ? kvq_decode_element(F, KV_QROLE_VALUE, h_in, &one, 0, i, n, 1.0f)
                                     : kvq_decode_element(F, KV_QROLE_VALUE, h_in, NULL, 0, i, n, 1.0f);
        if (!same_bits(got[i], want) && bad++ < 3)
            printf("  %s: element %d: got %a, want %a\n", name, i, got[i], want);
    }
    KV_CHECK(bad == 0, "%s: %ld of %d elements differ from kvq_decode_element()", name, bad, n);
    free(got);
}

/* Thread t copies word t of src (16 bytes each) into shared slot t in two batches: the first
 * half of the words in batch A, the second in B. seen [5][n] records slot (t + 1) % n at each
 * stage: before any wait, after wait_prior(1) (A landed), then after wait_prior(0) and a
 * barrier (both, read across threads). zfill: a last copy of 16 bytes, 12 of them zeros. */
__global__ void pipeline_kernel(const uint4 *src, uint4 *seen, int n)
{
    KV_DYNAMIC_SMEM(uint4, slot);
    const int t = threadIdx.x, half = n / 2;
    uint4 *zf = slot + n;
    if (t < half) kvcu_cp16(&slot[t], &src[t]);
    kvcu_cp_commit(); /* batch A */
    if (t >= half) kvcu_cp16(&slot[t], &src[t]);
    kvcu_cp_commit(); /* batch B */
    if (t == 0) __pipeline_memcpy_async(zf, &src[0], 16, 12);
    kvcu_cp_commit(); /* batch C: the zfill */
    seen[0 * n + t] = slot[t];  /* before any wait: poison in emulation */
    kvcu_cp_wait<2>();          /* A landed */
    seen[1 * n + t] = slot[t];
    kvcu_cp_wait<0>();          /* everything */
    __syncthreads();
    seen[2 * n + t] = slot[(t + 1) % n];
    if (t == 0) seen[3 * n] = *zf;
}

static int run_misaligned_child(void)
{
    uint8_t *d;
    if (cudaMalloc((void **)&d, 64) != cudaSuccess) return 2;
    KV_LAUNCH(unpack_kernel<KVCU_V_F32>, 1, 1, 0, 0, d + 4, (float *)(void *)(d + 32), 1);
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "misaligned load: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return 0; /* a load that should have faulted did not */
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "misaligned-child")) return run_misaligned_child();
    int nd = 0;
    if (cudaGetDeviceCount(&nd) != cudaSuccess || nd == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    /* ---- conversions ---- */
    uint8_t h_in[16 * N_ROWS];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof h_in; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h_in[i] = (uint8_t)(s >> 56);
    }
    uint8_t *d_in;
    float *d_out;
    KV_CHECK(cudaMalloc((void **)&d_in, sizeof h_in) == cudaSuccess &&
             cudaMalloc((void **)&d_out, sizeof(float) * 16 * N_ROWS) == cudaSuccess, "alloc");
    KV_CHECK(cudaMemcpy(d_in, h_in, sizeof h_in, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    check_unpack<KVCU_V_F32, KV_QF_F32>("fp32", h_in, d_in, d_out);
    check_unpack<KVCU_V_F16, KV_QF_F16>("fp16", h_in, d_in, d_out);
    check_unpack<KVCU_V_BF16, KV_QF_BF16>("bf16", h_in, d_in, d_out);
    check_unpack<KVCU_V_E4M3, KV_QF_FP8_E4M3>("fp8 e4m3", h_in, d_in, d_out);
    check_unpack<KVCU_V_E5M2, KV_QF_FP8_E5M2>("fp8 e5m2", h_in, d_in, d_out);
    check_unpack<KVCU_V_I8, KV_QF_INT8>("int8", h_in, d_in, d_out);

    /* ---- cp.async ---- */
    enum { N = 64 };
    uint4 h_src[N], seen[4 * N];
    for (int i = 0; i < N; i++) h_src[i] = make_uint4(4u * i, 4u * i + 1, 4u * i + 2, 4u * i + 3);
    uint4 *d_src, *d_seen;
    KV_CHECK(cudaMalloc((void **)&d_src, sizeof h_src) == cudaSuccess &&
             cudaMalloc((void **)&d_seen, sizeof seen) == cudaSuccess, "alloc");
    cudaMemcpy(d_src, h_src, sizeof h_src, cudaMemcpyHostToDevice);
    cudaMemset(d_seen, 0, sizeof seen);
    KV_LAUNCH(pipeline_kernel, 1, N, (N + 1) * sizeof(uint4), 0, d_src, d_seen, N);
    KV_CHECK(cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
             "pipeline kernel ran");
    cudaMemcpy(seen, d_seen, sizeof seen, cudaMemcpyDeviceToHost);
    int after_a = 0, shared_ok = 0;
    for (int t = 0; t < N; t++) {
        after_a += t < N / 2 ? !memcmp(&seen[N + t], &h_src[t], 16) : 1;
        shared_ok += !memcmp(&seen[2 * N + t], &h_src[(t + 1) % N], 16);
    }
    KV_CHECK(after_a == N, "after __pipeline_wait_prior(2) batch A has landed (%d of %d)", after_a, N);
    KV_CHECK(shared_ok == N, "after wait_prior(0) and a barrier every thread reads every copy "
             "(%d of %d)", shared_ok, N);
    KV_CHECK(seen[3 * N].x == h_src[0].x && seen[3 * N].y == 0 && seen[3 * N].z == 0 &&
             seen[3 * N].w == 0, "zfill: 4 bytes copied, 12 zeros (got %08x %08x %08x %08x)",
             seen[3 * N].x, seen[3 * N].y, seen[3 * N].z, seen[3 * N].w);
#ifdef KV_CUDA_EMULATION
    int poison0 = 0, poison_b = 0;
    for (int t = 0; t < N; t++) {
        poison0 += seen[t].x == 0xffffffffu && seen[t].w == 0xffffffffu;
        poison_b += t >= N / 2 && seen[N + t].x == 0xffffffffu;
    }
    KV_CHECK(poison0 == N, "emulation: a destination read before its wait sees 0xff (%d of %d)",
             poison0, N);
    KV_CHECK(poison_b == N / 2, "emulation: batch B is still in flight after wait_prior(2) of "
             "three batches (%d of %d poisoned)", poison_b, N / 2);
#endif

    /* ---- a misaligned 16-byte load ends the program (the context, on a GPU) ---- */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' misaligned-child 2>&1", argv[0]);
    FILE *p = popen(cmd, "r");
    char out[4096] = {0};
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    out[got] = 0;
    KV_CHECK(st != 0, "the misaligned child exits non-zero (status %d)", st);
    KV_CHECK(strstr(out, "misaligned") != NULL, "its message names the fault: \"%s\"", out);
#ifdef KV_CUDA_EMULATION
    KV_CHECK(strstr(out, "at address 0x") != NULL && strstr(out, "unpack_kernel") != NULL,
             "emulation: the message names the address and the kernel: \"%s\"", out);
#endif
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_src);
    cudaFree(d_seen);
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
