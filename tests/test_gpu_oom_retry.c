/*
 * A device that runs out of memory, at every allocation in turn (emulation only: it needs
 * kvemu_fail_alloc(), the emulator's fault injection).
 *
 * A failed cudaMalloc is also the runtime's last error. Left there, the next launch check
 * (cudaGetLastError() after a launch) reports it for a launch that went well, so the call
 * after an out-of-memory, or its retry once memory is free again, fails for no reason. For
 * each case below, the operation is first run clean (its result is the reference); then, for
 * n = 1, 2, ... until no n-th allocation is left, the n-th allocation of the operation fails:
 *  - the operation returns KV_ERR_NOMEM (or, where a smaller fallback exists, KV_OK with the
 *    reference's result), never another status, and nothing crashes or leaks;
 *  - the same operation again, on the same objects where they survived, with the memory
 *    back, succeeds with the reference's result, bit for bit.
 * Cases: the CUDA backend's creation and a greedy generation over a contiguous fp32, a paged
 * int8, a KIVI int4, a windowed (sinks + ring, KV_POS_CACHE) fp16 and an H2O-retention cache;
 * the paged cache's block copies, block reads and writes (chapter 07's host tier) and the
 * slot-mapping write.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "kv_generate.h"
#include "kv_quant.h"
#include "kv_window.h"
#include "kvcu.h"
#include "kvemu.h"

#define NG 3 /* generated tokens */
#define CAP 48

static int PROMPT[40]; /* tokens 1, 2, ...; the first 6 for most cases, all 40 for KIVI */
static int NP = 6;

/* ---- the backend: create, then generate ------------------------------------------------- */

/* Generate into out with a fresh backend; on a failure inside the generation, generate again
 * on the same backend with the memory back (kv_generate() resets the slot). *status gets
 * the injected run's status, *fired whether the armed allocation failed. */
static int backend_run(const kv_model *m, const kv_cache_spec *spec, long fail_at, int *out,
                       int *status, int *fired, kv_err *e)
{
    kv_backend *b = NULL;
    kv_gen_opts o = {KV_MODE_CACHED, 0, NG, NULL, NULL, NULL, NULL};
    kvemu_fail_alloc(fail_at);
    int rc = kvcu_backend_create(&b, m, spec, e);
    if (!rc) rc = kv_generate(b, PROMPT, NP, &o, out, NULL, e);
    *fired = kvemu_alloc_failed();
    kvemu_fail_alloc(0);
    *status = rc;
    if (rc && !b) rc = kvcu_backend_create(&b, m, spec, e); /* creation failed: make it again */
    else rc = KV_OK;
    if (!rc && *status) rc = kv_generate(b, PROMPT, NP, &o, out, NULL, e); /* the retry */
    kv_backend_destroy(b);
    return rc;
}

static void backend_case(const kv_model *m, const kv_cache_spec *spec, const char *what)
{
    kv_err e;
    int ref[NG], got[NG], status = 0, fired = 0;
    const size_t in_use = kvemu_mem_in_use();
    int rc = backend_run(m, spec, 0, ref, &status, &fired, &e);
    KV_CHECK(rc == KV_OK, "%s: the clean run: %s", what, e.msg);
    if (rc) return;
    long n = 1;
    for (; n < 10000; n++) {
        memset(got, 0xff, sizeof got);
        rc = backend_run(m, spec, n, got, &status, &fired, &e);
        if (!fired) {
            KV_CHECK(status == KV_OK && !memcmp(got, ref, sizeof ref), "%s: after the last "
                     "allocation (%ld): status %d", what, n - 1, status);
            break;
        }
        KV_CHECK(status == KV_ERR_NOMEM || status == KV_OK, "%s: allocation %ld failed: status "
                 "%d, not KV_ERR_NOMEM", what, n, status);
        KV_CHECK(rc == KV_OK, "%s: allocation %ld failed, then the retry failed too: %s", what,
                 n, e.msg);
        KV_CHECK(rc || !memcmp(got, ref, sizeof ref), "%s: allocation %ld failed: the retry's "
                 "tokens differ from the clean run's", what, n);
        if (rc) break;
    }
    KV_CHECK(kvemu_mem_in_use() == in_use, "%s: %zu bytes of device memory left behind", what,
             kvemu_mem_in_use() - in_use);
    printf("  %-34s %3ld allocations, each failed once\n", what, n - 1);
}

/* ---- the paged cache's block operations --------------------------------------------------- */

#define PB 16 /* block size */
#define PN 8  /* blocks */

/* A paged cache of the model's shape, slot 0 holding blocks 0, 1 (32 tokens written). */
static int paged_cache(kvcu_cache **out, const kv_config *cfg, int dtype, kv_err *e)
{
    kv_cache_spec s = kv_cache_spec_default(2, PB * PN);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = PB;
    s.layout.n_blocks = PN;
    s.quant.dtype = dtype;
    const int blocks[2] = {0, 1}, n = 2 * PB, kvdim = cfg->n_kv_heads * kv_config_head_dim(cfg);
    int rc = kvcu_cache_create(out, cfg, &s, e);
    float *k = NULL, *v = NULL;
    if (!rc) rc = kvcu_malloc((void **)&k, (size_t)n * kvdim * 4, e);
    if (!rc) rc = kvcu_malloc((void **)&v, (size_t)n * kvdim * 4, e);
    float *h = malloc((size_t)n * kvdim * 4);
    for (int i = 0; h && i < n * kvdim; i++) h[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    if (!rc) rc = kvcu_upload(k, h, (size_t)n * kvdim * 4, e);
    if (!rc) rc = kvcu_upload(v, h, (size_t)n * kvdim * 4, e);
    for (int l = 0; !rc && l < cfg->n_layers; l++) {
        if (l == 0) rc = kvcu_cache_set_blocks(*out, 0, blocks, 2, e);
        if (!rc) rc = kvcu_cache_write_seq(*out, l, 0, 0, n, k, v, e);
    }
    kvcu_free(k);
    kvcu_free(v);
    free(h);
    return rc;
}

/* One block operation on cache c: 0 copy blocks 0, 1 -> 4, 5; 1 read blocks 0, 1 to the
 * host; 2 write host blocks into 6, 7; 3 slot-mapping write of 5 tokens into rows of block 3. */
static int block_op(kvcu_cache *c, int op, const kv_config *cfg, uint8_t *host, kv_err *e)
{
    const size_t bb = kvcu_cache_block_bytes(c);
    if (op == 0) {
        const kv_block_copy p[2] = {{0, 4}, {1, 5}};
        return kvcu_cache_copy_blocks(c, p, 2, e);
    }
    if (op == 1) {
        const kv_block_copy p[2] = {{0, 0}, {1, 1}};
        return kvcu_cache_read_blocks(c, p, 2, host, bb, e);
    }
    if (op == 2) {
        const kv_block_copy p[2] = {{0, 6}, {1, 7}};
        return kvcu_cache_write_blocks(c, p, 2, host, bb, e);
    }
    const int kvdim = cfg->n_kv_heads * kv_config_head_dim(cfg);
    const int64_t slots[5] = {3 * PB, 3 * PB + 2, -1, 3 * PB + 5, 3 * PB + 15};
    float *k = NULL, *h = malloc((size_t)5 * kvdim * 4); /* [5][H_kv][d] */
    if (!h) return kv_fail(e, KV_ERR_NOMEM, "host memory");
    for (int i = 0; i < 5 * kvdim; i++) h[i] = (float)(i % 17) * 0.125f - 1.0f;
    int rc = kvcu_malloc((void **)&k, (size_t)5 * kvdim * 4, e);
    if (!rc) rc = kvcu_upload(k, h, (size_t)5 * kvdim * 4, e);
    if (!rc) rc = kvcu_cache_write_slots(c, 0, slots, 5, k, k, e);
    kvcu_free(k);
    free(h);
    return rc;
}

/* A fresh paged cache, op on it, its bytes in @p mem_out (when not NULL). */
static int fresh_op(const kv_config *cfg, int op, long fail_at, uint8_t *host, uint8_t *mem_out,
                    int *status, int *fired, kv_err *e)
{
    kvcu_cache *c = NULL;
    int rc = paged_cache(&c, cfg, kv_quant_parse("int8"), e);
    if (!rc) {
        kvemu_fail_alloc(fail_at);
        *status = block_op(c, op, cfg, host, e);
        *fired = kvemu_alloc_failed();
        kvemu_fail_alloc(0);
        /* the retry, on the same cache */
        rc = *status ? block_op(c, op, cfg, host, e) : KV_OK;
    }
    if (!rc) rc = kvcu_cache_download(c, mem_out, kvcu_cache_mem_bytes(c), e);
    kvcu_cache_free(c);
    return rc;
}

static void block_case(const kv_config *cfg, int op, const char *what)
{
    kv_err e;
    kvcu_cache *c = NULL;
    int rc = paged_cache(&c, cfg, kv_quant_parse("int8"), &e), status = 0, fired = 0;
    const size_t bb = c ? kvcu_cache_block_bytes(c) : 0, mem = c ? kvcu_cache_mem_bytes(c) : 0;
    kvcu_cache_free(c);
    KV_CHECK(rc == KV_OK, "%s: cache: %s", what, e.msg);
    if (rc) return;
    uint8_t *host = calloc(2, bb), *want = malloc(mem), *got = malloc(mem);
    for (size_t i = 0; i < 2 * bb; i++) host[i] = (uint8_t)(i * 7); /* not a block of zeros */
    rc = fresh_op(cfg, op, 0, host, want, &status, &fired, &e);
    KV_CHECK(rc == KV_OK && status == KV_OK, "%s: the clean run: %s", what, e.msg);
    long n = 1;
    for (; !rc && n < 1000; n++) {
        rc = fresh_op(cfg, op, n, host, got, &status, &fired, &e);
        if (!fired) {
            KV_CHECK(status == KV_OK && rc == KV_OK, "%s: after the last allocation: %s", what,
                     e.msg);
            break;
        }
        KV_CHECK(status == KV_ERR_NOMEM, "%s: allocation %ld failed: status %d", what, n,
                 status);
        KV_CHECK(rc == KV_OK, "%s: allocation %ld failed, then the retry failed too: %s", what,
                 n, e.msg);
        KV_CHECK(rc || !memcmp(got, want, mem), "%s: allocation %ld failed: the retry's cache "
                 "differs from the clean run's", what, n);
    }
    printf("  %-34s %3ld allocations, each failed once\n", what, n - 1);
    free(host);
    free(want);
    free(got);
}

int main(void)
{
    kv_err e;
    if (kvcu_device_available(&e) != KV_OK || !kvcu_is_emulation()) {
        printf("skipped: needs the emulation build's fault injection\n");
        return KV_TEST_SKIP;
    }
    kv_config cfg = {0}; /* small: every case runs once per allocation it makes */
    cfg.dim = 64;
    cfg.hidden_dim = 96;
    cfg.n_layers = 2;
    cfg.n_heads = 2;
    cfg.n_kv_heads = 1; /* GQA, G = 2; d = 32, a KIVI group */
    cfg.vocab_size = 32;
    cfg.seq_len = CAP;
    kv_config_set_defaults(&cfg);
    kv_model m = {0};
    if (kv_model_alloc(&m, &cfg, &e)) {
        printf("model: %s\n", e.msg);
        return 1;
    }
    kv_model_randomize(&m, 31);
    for (int i = 0; i < 40; i++) PROMPT[i] = 1 + (i * 7) % (cfg.vocab_size - 1);
    kv_cache_spec s = kv_cache_spec_default(1, CAP);
    backend_case(&m, &s, "contiguous fp32");
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = 16;
    s.layout.n_blocks = 8;
    s.quant.dtype = kv_quant_parse("int8");
    backend_case(&m, &s, "paged int8");
    s = kv_cache_spec_default(1, CAP);
    s.quant.dtype = kv_quant_parse("int4");
    s.quant.kivi_window = 32; /* a 40-token prompt spills one group of 32 */
    NP = 40;
    backend_case(&m, &s, "KIVI int4, 40-token prompt");
    NP = 6;
    s = kv_cache_spec_default(1, CAP);
    s.quant.dtype = kv_quant_parse("fp16");
    s.window.size = 8;
    s.window.n_sinks = 2;
    s.window.pos_scheme = KV_POS_CACHE;
    backend_case(&m, &s, "window 2 + 8, fp16");
    s = kv_cache_spec_default(1, CAP);
    s.retain.select = KV_SELECT_H2O;
    s.retain.budget = 8;
    s.retain.window = 4;
    backend_case(&m, &s, "H2O retention, budget 8");

    static const char *const ops[] = {"paged: copy blocks", "paged: read blocks to the host",
                                      "paged: write blocks from the host",
                                      "paged: slot-mapping write"};
    for (int op = 0; op < 4; op++) block_case(&m.config, op, ops[op]);
    kv_model_free(&m);
    return kv_test_finish();
}
