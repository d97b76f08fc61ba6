/*
 * check_async_io(): the backend's asynchronous block I/O hooks against its synchronous ones
 * (chapter 07), shared by test_swap (CPU backend) and test_gpu_swap (CUDA backend), which
 * run it on their own backends.
 */
#ifndef TEST_SWAP_IO_H
#define TEST_SWAP_IO_H

#include <stdlib.h>
#include <string.h>

#include "kv_backend.h"
#include "kv_model.h"
#include "kv_test.h"

/* The asynchronous hooks move the bytes the synchronous ones do: a slot's 3 blocks read
 * through read_blocks_async equal read_blocks' bytes; two write_blocks_async jobs into 6 free
 * blocks, waited for by the later ticket alone (tickets increase, a wait covers every earlier
 * job), read back as written; an unissued ticket is KV_ERR_ARG. */
static void check_async_io(const kv_model *m, kv_backend *b, const char *what)
{
    kv_err e;
    const size_t bb = b->mem->block_bytes(b->mem);
    int tok[24];
    for (int t = 0; t < 24; t++) tok[t] = 5 + 11 * t % 250;
    float *lg = calloc((size_t)m->config.vocab_size, sizeof(float));
    kv_seq q = {0, 0, 2 * b->mem->paged->pool.block_size + 3, tok}; /* 3 blocks */
    int rc = b->forward(b, &q, 1, lg, NULL, &e);
    KV_CHECK(rc == KV_OK && b->mem && b->mem->read_blocks_async &&
                 b->mem->write_blocks_async && b->mem->io_wait,
             "%s async: prefill or hooks missing: %s", what, rc ? e.msg : "");
    uint8_t *h = calloc(12 * bb, 1); /* [12][bb]: sync 0-2, async 3-5, read back 6-11 */
    kv_block_copy rd[6], wr[6];
    int fresh[6], n_fresh = 0;
    int64_t t1 = 0, t2 = 0, t3 = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        rd[i] = (kv_block_copy){b->mem->paged->tables[0].blocks[i], i};
        rd[3 + i] = (kv_block_copy){b->mem->paged->tables[0].blocks[i], 3 + i};
    }
    if (!rc) rc = b->mem->read_blocks(b->mem, rd, 3, h, bb, &e);
    if (!rc) rc = b->mem->read_blocks_async(b->mem, rd + 3, 3, h, bb, &t1, &e);
    if (!rc) rc = b->mem->io_wait(b->mem, t1, &e);
    KV_CHECK(rc == KV_OK && t1 > 0 && !memcmp(h, h + 3 * bb, 3 * bb), "%s async read: ticket "
             "%lld, bytes %s (%s)", what, (long long)t1, rc ? "-" : "differ", rc ? e.msg : "");
    while (!rc && n_fresh < 6 && kv_pool_alloc(&b->mem->paged->pool, &fresh[n_fresh], &e) == KV_OK)
        n_fresh++;
    KV_CHECK(n_fresh == 6, "%s async: 6 free blocks, got %d", what, n_fresh);
    if (rc || n_fresh < 6) goto out;
    for (int i = 0; i < 3; i++) {
        wr[i] = (kv_block_copy){i, fresh[i]};
        wr[3 + i] = (kv_block_copy){2 - i, fresh[3 + i]}; /* reversed */
        rd[i] = (kv_block_copy){fresh[i], 6 + i};
        rd[3 + i] = (kv_block_copy){fresh[3 + i], 9 + i};
    }
    rc = b->mem->write_blocks_async(b->mem, wr, 3, h, bb, &t2, &e);
    if (!rc) rc = b->mem->write_blocks_async(b->mem, wr + 3, 3, h, bb, &t3, &e);
    if (!rc) rc = b->mem->io_wait(b->mem, t3, &e); /* covers t2 too */
    if (!rc) rc = b->mem->read_blocks(b->mem, rd, 6, h, bb, &e);
    int same = !rc && !memcmp(h + 6 * bb, h, 3 * bb);
    for (int i = 0; i < 3 && same; i++) same = !memcmp(h + (9 + i) * bb, h + (2 - i) * bb, bb);
    KV_CHECK(rc == KV_OK && t3 > t2 && t2 > t1 && same, "%s async writes: tickets %lld %lld, "
             "bytes %s (%s)", what, (long long)t2, (long long)t3, same ? "ok" : "differ",
             rc ? e.msg : "");
    KV_CHECK(b->mem->io_wait(b->mem, t3 + 1, &e) == KV_ERR_ARG, "%s: io_wait of an unissued ticket",
             what);
    rc = b->mem->io_wait(b->mem, t2, &e); /* long done: returns at once */
    KV_CHECK(rc == KV_OK, "%s: io_wait of a finished ticket: %s", what, e.msg);
out:
    for (int i = 0; i < n_fresh; i++) kv_pool_unref(&b->mem->paged->pool, fresh[i], NULL);
    b->reset(b, 0);
    free(h);
    free(lg);
}

#endif
