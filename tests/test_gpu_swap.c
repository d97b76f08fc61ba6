/* Chapter 07 on the GPU: the host tier through the CUDA backend's block I/O.
 *
 * Predicted before measured: both devices lay a host block out in one order
 * ([L][K, V][H_kv](codes, meta), kv_cache_block_bytes()) and move bytes without touching them,
 * so
 *  - the same rows written into a CPU and a GPU paged cache (kv_cache_write_slots and its twin,
 *    which store the same bytes) read back into host blocks byte for byte equal, fp32, int8
 *    and fp16, B 8 and 16, through a shuffled, partly consecutive list of host blocks; host
 *    blocks written into other pool blocks of each device read back unchanged, and the same
 *    on both devices;
 *  - a sequence swapped out of the CUDA backend and back in (into other blocks and another
 *    slot, the freed blocks poisoned with 0xFF in between) generates logits bit for bit those
 *    of a CUDA run that never swapped: test_swap's round trip, one body for both backends
 *    (common/test_swap_run.h), with its checks of blocks, link bytes and modelled seconds;
 *  - a host tier filled through the CPU backend swapped into the CUDA backend gives the next
 *    logits of a CPU run that never swapped, and one filled by CUDA swapped into the CPU those
 *    of a CUDA run that never swapped, within kv_test.h's fp32 tolerance: the stored values
 *    are those the writer stored, only the reader's summation order differs (the bound every
 *    GPU-vs-CPU fp32 test uses, not loosened);
 *  - the partial swap on the CUDA backend too: A detached (no copy), or with 1, 2 or all of
 *    its last blocks evicted and copied back by kv_swap_in, or prefetched on the copy stream
 *    while Bq's step runs on the default stream, generates logits bit for bit those of the
 *    CUDA run that never swapped; the asynchronous hooks move the synchronous ones' bytes;
 *  - no block leaks in either tier (kv_pool_check_leaks + kv_pool_validate).
 * Exits 77 (skipped) without a usable device. */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_gpu.h"
#include "common/test_swap_run.h"

#include "kv_needle.h"
#include "kv_rng.h"
#include "kv_sampler.h"
#include "kv_swap.h"
#include "kvcu.h"

#include <string.h>

static const char *const variants[3] = {"fp32", "int8", "fp16"};

/* ---- 1. host bytes: CPU == GPU ----------------------------------------------------------- */

static void check_bytes(const kv_config *cfg, const char *variant, int B)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec(variant, B, &e, &rc);
    kv_cache cc;
    kvcu_cache *gc = NULL;
    memset(&cc, 0, sizeof cc);
    if (!rc) rc = kv_cache_create(&cc, cfg, &ps, &e);
    if (!rc) rc = kvcu_cache_create(&gc, cfg, &ps, &e);
    KV_CHECK(rc == KV_OK, "%s B%d: caches: %s", variant, B, e.msg);
    if (rc) {
        kv_cache_free(&cc);
        kvcu_cache_free(gc);
        return;
    }
    const int N = ps.layout.n_blocks, Hkv = cfg->n_kv_heads, d = cfg->dim / cfg->n_heads;
    const size_t bb = kv_cache_block_bytes(&cc);
    KV_CHECK(bb > 0 && kvcu_cache_block_bytes(gc) == bb, "%s B%d: block bytes CPU %zu, GPU %zu",
             variant, B, bb, kvcu_cache_block_bytes(gc));
    /* every row of every pool block, every layer: random keys and values */
    const int n = N * B;
    int64_t *slots = malloc((size_t)n * sizeof *slots);            /* [n] */
    float *kv = malloc((size_t)2 * n * Hkv * d * sizeof(float));   /* [2][n][H_kv][d] */
    float *dkv = NULL;
    kv_rng r;
    kv_rng_seed(&r, 77 + (uint64_t)B);
    for (int i = 0; i < n; i++) slots[i] = i;
    rc = kvcu_malloc((void **)&dkv, (size_t)2 * n * Hkv * d * sizeof(float), &e);
    for (int l = 0; l < cfg->n_layers && !rc; l++) {
        for (size_t i = 0; i < (size_t)2 * n * Hkv * d; i++) kv[i] = kv_rng_normal(&r);
        const float *k = kv, *v = kv + (size_t)n * Hkv * d;
        rc = kv_cache_write_slots(&cc, l, slots, n, k, v, &e);
        if (!rc) rc = kvcu_upload(dkv, kv, (size_t)2 * n * Hkv * d * sizeof(float), &e);
        if (!rc)
            rc = kvcu_cache_write_slots(gc, l, slots, n, dkv, dkv + (size_t)n * Hkv * d, &e);
    }
    KV_CHECK(rc == KV_OK, "%s B%d: writes: %s", variant, B, e.msg);
    /* pool blocks in a shuffled order to host blocks 0..N-1 in order, except two swapped:
     * runs of consecutive host blocks and a break between them */
    kv_block_copy *pairs = malloc((size_t)N * sizeof *pairs); /* [N] */
    for (int i = 0; i < N; i++) pairs[i] = (kv_block_copy){i, i};
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(kv_rng_u32(&r) % (uint32_t)(i + 1)), t = pairs[i].src;
        pairs[i].src = pairs[j].src;
        pairs[j].src = t;
    }
    pairs[1].dst = 2;
    pairs[2].dst = 1;
    uint8_t *hc = malloc((size_t)N * bb), *hg = malloc((size_t)N * bb); /* [N][bb] each */
    memset(hc, 0xAA, (size_t)N * bb);
    memset(hg, 0x55, (size_t)N * bb);
    if (!rc) rc = kv_cache_read_blocks(&cc, pairs, N, hc, bb, &e);
    if (!rc) rc = kvcu_cache_read_blocks(gc, pairs, N, hg, bb, &e);
    KV_CHECK(rc == KV_OK, "%s B%d: read blocks: %s", variant, B, e.msg);
    int bad = 0;
    for (int i = 0; i < N && !rc; i++) bad += memcmp(hc + (size_t)i * bb, hg + (size_t)i * bb, bb) != 0;
    KV_CHECK(!rc && bad == 0, "%s B%d: %d of %d host blocks read from the GPU differ from the "
             "CPU's", variant, B, bad, N);

    /* write the host blocks back into the pool reversed, on both, and read them again */
    kv_block_copy *back = malloc((size_t)N * sizeof *back); /* [N] */
    for (int i = 0; i < N; i++) back[i] = (kv_block_copy){i, N - 1 - i};
    if (!rc) rc = kv_cache_write_blocks(&cc, back, N, hc, bb, &e);
    if (!rc) rc = kvcu_cache_write_blocks(gc, back, N, hc, bb, &e);
    KV_CHECK(rc == KV_OK, "%s B%d: write blocks: %s", variant, B, e.msg);
    for (int i = 0; i < N; i++) back[i] = (kv_block_copy){N - 1 - i, i};
    uint8_t *h2 = malloc((size_t)N * bb);
    memset(hg, 0x55, (size_t)N * bb);
    if (!rc) rc = kv_cache_read_blocks(&cc, back, N, h2, bb, &e);
    if (!rc) rc = kvcu_cache_read_blocks(gc, back, N, hg, bb, &e);
    KV_CHECK(rc == KV_OK && !memcmp(h2, hc, (size_t)N * bb) && !memcmp(hg, hc, (size_t)N * bb),
             "%s B%d: blocks written then read back changed (CPU %d, GPU %d)", variant, B,
             memcmp(h2, hc, (size_t)N * bb) != 0, memcmp(hg, hc, (size_t)N * bb) != 0);

    /* refusals: the CPU's words */
    back[0] = (kv_block_copy){0, N};
    KV_CHECK(kvcu_cache_write_blocks(gc, back, 1, hc, bb, &e) == KV_ERR_ARG &&
                 kv_cache_write_blocks(&cc, back, 1, hc, bb, &e) == KV_ERR_ARG,
             "%s B%d: pool block %d (outside the pool) accepted", variant, B, N);
    KV_CHECK(kvcu_cache_read_blocks(gc, pairs, 1, hg, bb + 4, &e) == KV_ERR_ARG &&
                 strstr(e.msg, "bytes"), "%s B%d: wrong block bytes accepted", variant, B);
    back[0] = (kv_block_copy){0, 3};
    back[1] = (kv_block_copy){1, 3};
    KV_CHECK(kvcu_cache_write_blocks(gc, back, 2, hc, bb, &e) == KV_ERR_ARG,
             "%s B%d: a pool block written twice in one list accepted", variant, B);
    back[0] = (kv_block_copy){0, 3}; /* the refused list left no mark behind */
    KV_CHECK(kvcu_cache_write_blocks(gc, back, 1, hc, bb, &e) == KV_OK, "%s B%d: a list after "
             "a refused one: %s", variant, B, e.msg);
    free(h2);
    free(back);
    free(hc);
    free(hg);
    free(pairs);
    free(slots);
    free(kv);
    kvcu_free(dkv);
    kvcu_cache_free(gc);
    kv_cache_free(&cc);
}

/* ---- 2. swapping on the CUDA backend changes nothing (test_swap_run.h) ------------------- */

/* five swap points, A to 34 tokens (emulation time); the host-side bookkeeping of detach and
 * evict is the CPU's too, so fp32 runs every mode, the other formats the whole swap and the
 * copy stream */
static const swap_plan PLAN = {5, 34};

static void check_roundtrip(const kv_model *m, const char *variant)
{
    const unsigned modes = !strcmp(variant, "fp32") ? (1u << N_MODES) - 1
                                                     : 1u << WHOLE | 1u << PREFETCH;
    check_swap_variant(kv_test_make_cuda, "cuda", m, variant, &PLAN, modes);
}

/* ---- 3. a tier filled on one device, swapped into the other ------------------------------ */

static void check_cross(const kv_model *m, const char *variant, int gpu_to_cpu)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec(variant, 16, &e, &rc);
    kv_backend *cpu = NULL, *gpu = NULL, *ref = NULL;
    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    if (!rc) rc = kv_backend_cpu(&cpu, m, &ps, &e);
    if (!rc) rc = kvcu_backend_create(&gpu, m, &ps, &e);
    /* the reference never swaps and runs on the device that wrote the rows: the stored values
     * are then the same on both sides (a GPU's fp32 K and V may round to another fp16 than the
     * CPU's), and only the reader's summation order differs */
    if (!rc) rc = gpu_to_cpu ? kvcu_backend_create(&ref, m, &ps, &e)
                             : kv_backend_cpu(&ref, m, &ps, &e);
    kv_backend *from = gpu_to_cpu ? gpu : cpu, *to = gpu_to_cpu ? cpu : gpu;
    if (!rc) rc = kv_swap_init(&sw, from->mem, 4, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s cross: setup: %s", variant, e.msg);
    const int V = m->config.vocab_size;
    float *lg = calloc(2 * (size_t)V, sizeof(float)), *lr = lg + V;
    int tok[CAP];
    for (int t = 0; t < CAP; t++) tok[t] = 3 + 7 * t % 200;
    kv_swapped h;
    memset(&h, 0, sizeof h);
    kv_seq q = {0, 0, 21, tok}; /* 21 tokens: 2 blocks of 16, the last one partial */
    if (!rc) rc = from->forward(from, &q, 1, lg, NULL, &e);
    if (!rc) rc = ref->forward(ref, &q, 1, lr, NULL, &e);
    if (!rc) rc = kv_swap_out(&sw, from->mem, 0, &h, &e);
    if (!rc) rc = kv_swap_in(&sw, to->mem, 1, &h, &e); /* another device, another slot */
    KV_CHECK(rc == KV_OK && to->length(to, 1) == 21 && from->length(from, 0) == 0,
             "%s cross (%s -> %s): %s", variant, from->name, to->name, rc ? e.msg : "lengths");
    kv_seq q1 = {1, 21, 1, tok + 21}, q0 = {0, 21, 1, tok + 21};
    if (!rc) rc = to->forward(to, &q1, 1, lg, NULL, &e);
    if (!rc) rc = ref->forward(ref, &q0, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s cross: next step: %s", variant, e.msg);
    if (!rc) {
        char what[96];
        snprintf(what, sizeof what, "%s %s -> %s next logits", variant, from->name, to->name);
        KV_CHECK(kv_test_compare(what, lg, lr, V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
                 "%s: differ from a %s run that never swapped", what, ref->name);
    }
    if (cpu && gpu) {
        check_tiers(to, &sw, variant);
        for (int s = 0; s < N_SLOTS; s++) from->reset(from, s);
        KV_CHECK(kv_pool_check_leaks(&from->mem->paged->pool, NULL, 0) == 0,
                 "%s cross: blocks left in the source backend", variant);
    }
    kv_swapped_drop(&sw, to->mem, &h);
    free(lg);
    kv_swap_free(&sw);
    kv_backend_destroy(cpu);
    kv_backend_destroy(gpu);
    kv_backend_destroy(ref);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_config c;
    kv_model m;
    if (swap_model(&m, &c)) return kv_test_finish();
    for (int i = 0; i < 3; i++) {
        check_bytes(&c, variants[i], 8);
        check_bytes(&c, variants[i], 16);
    }
    for (int i = 0; i < 3; i++) check_roundtrip(&m, variants[i]);
    for (int i = 0; i < 3; i++) check_swap_async(kv_test_make_cuda, &m, variants[i], variants[i]);
    for (int i = 0; i < 3; i++) {
        check_cross(&m, variants[i], 0);
        check_cross(&m, variants[i], 1);
    }
    kv_model_free(&m);
    return kv_test_finish();
}
