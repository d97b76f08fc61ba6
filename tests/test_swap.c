/* Chapter 07 on the CPU: swapping a sequence to the host tier and back changes nothing.
 *
 * Predicted before measured: a swap copies a block's bytes out and back, every layer, K and
 * V, codes and metadata, so the rows a sequence reads after a swap are the rows it wrote and
 * every logit is bit for bit (memcmp) those of a run that never swapped:
 *  - greedy generation of two sequences, one swapped out and in again and again (lengths that
 *    are and are not multiples of B, coming back into another slot while the other sequence
 *    takes the freed blocks), fp32, int8 and fp16, against kv_backend_cpu without swaps;
 *  - the link model: bytes = blocks x block bytes each way, time = latency + bytes / bandwidth
 *    per batched copy, block bytes as the format's formula says;
 *  - host-tier exhaustion is KV_ERR_CAPACITY naming the numbers, and the device sequence goes
 *    on as if nothing happened; a device pool without room refuses the swap-in and keeps the
 *    sequence in the host tier;
 *  - fp8 is refused with KV_ERR_UNSUPPORTED;
 *  - no block leaks in either tier (kv_pool_check_leaks + kv_pool_validate on both).
 * (The round trip is common/test_swap_run.h, run on the CUDA backend too by test_gpu_swap.)
 * The partial swap (LRU preemption) moves the same bytes, so the same run is bit for bit the
 * resident one when A is instead detached (no byte crosses the link, A gets its own blocks
 * back), detached with 1, 2 or all of its last blocks evicted, or evicted and prefetched by
 * the I/O thread while Bq's step runs; and
 *  - a block shared with a fork is not evicted (it would free nothing) and survives; once the
 *    fork copies it on write, or finishes, it is A's alone and goes, last logical block first;
 *  - an eviction takes what the host tier has free, then KV_ERR_CAPACITY leaves A unchanged;
 *    a prefetch or swap-in into a full device pool is KV_ERR_CAPACITY and changes nothing;
 *  - dropping a partly evicted sequence, or one whose prefetch is in flight, frees both tiers;
 *  - the asynchronous hooks move the bytes the synchronous ones do, tickets in order. */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/test_swap_run.h"

#include "kv_needle.h"
#include "kv_rng.h"
#include "kv_sampler.h"
#include "kv_swap.h"

#include <math.h>
#include <string.h>

/* the CPU runs the whole plan: six swap points, A to 40 tokens */
static const swap_plan PLAN = {6, 40};

/* Two CPU int8 backends: b with a host tier of host_blocks blocks, and the reference r that
 * never swaps; both hold the same 21 tokens in slot 0 (3 blocks, the last one partial). */
typedef struct {
    kv_backend *b, *r;
    kv_swap sw;
    float *lb, *lr; /* [V] each: b's and r's logits */
    int tok[CAP];
} swap_pair;

static void pair_close(swap_pair *p)
{
    free(p->lb);
    kv_swap_free(&p->sw);
    kv_backend_destroy(p->b);
    kv_backend_destroy(p->r);
}

static int pair_open(swap_pair *p, const kv_model *m, int host_blocks, const char *what)
{
    kv_err e;
    int rc;
    memset(p, 0, sizeof *p);
    kv_cache_spec ps = paged_spec("int8", SWAP_B, &e, &rc);
    if (!rc) rc = kv_backend_cpu(&p->b, m, &ps, &e);
    if (!rc) rc = kv_backend_cpu(&p->r, m, &ps, &e);
    if (!rc) rc = kv_swap_init(&p->sw, p->b->mem, host_blocks, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s setup: %s", what, e.msg);
    if (rc) return rc;
    const int V = m->config.vocab_size;
    p->lb = calloc(2 * (size_t)V, sizeof(float));
    p->lr = p->lb + V;
    for (int t = 0; t < CAP; t++) p->tok[t] = 3 + 7 * t % 200;
    kv_seq q = {0, 0, 21, p->tok};
    rc = p->b->forward(p->b, &q, 1, p->lb, NULL, &e);
    if (!rc) rc = p->r->forward(p->r, &q, 1, p->lr, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s prefill: %s", what, e.msg);
    return rc;
}

/* Host tier too small: the swap out is refused whole and the device sequence carries on; a
 * device pool without room refuses the swap in and the sequence stays on the host. */
static void check_exhaustion(const kv_model *m)
{
    kv_err e;
    swap_pair p; /* 21 tokens: 3 blocks, the host tier has 2 */
    int rc = pair_open(&p, m, 2, "exhaustion");
    if (rc) goto done;
    kv_backend *b = p.b, *r = p.r;
    kv_swap *sw = &p.sw;
    float *lb = p.lb, *lr = p.lr;
    const int *tok = p.tok, V = m->config.vocab_size;
    kv_seq q;
    int before[3];
    memcpy(before, b->mem->paged->tables[0].blocks, sizeof before);
    kv_swapped h;
    rc = kv_swap_out(sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "3 blocks") && strstr(e.msg, "2 free of 2"),
             "host tier of 2 blocks, sequence of 3: rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(b->length(b, 0) == 21 && b->mem->paged->tables[0].n_blocks == 3 &&
                 !memcmp(before, b->mem->paged->tables[0].blocks, sizeof before),
             "the refused swap out changed the device sequence (length %d)", b->length(b, 0));
    KV_CHECK(sw->stats.copies[KV_LINK_OUT] == 0 && sw->pool.n_used == 0,
             "the refused swap out moved %lld copies, holds %d host blocks",
             (long long)sw->stats.copies[KV_LINK_OUT], sw->pool.n_used);
    q = (kv_seq){0, 21, 1, tok + 21}; /* it carries on exactly as the reference */
    rc = b->forward(b, &q, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(lb, lr, (size_t)V * sizeof(float)),
             "after the refused swap out the next step differs: %s", rc ? e.msg : "logits");

    /* a 2-block sequence fits the host tier; the device pool is then filled to the brim */
    kv_seq q1 = {1, 0, 9, tok};
    rc = b->forward(b, &q1, 1, lb, NULL, &e);
    KV_CHECK(rc == KV_OK, "second sequence: %s", e.msg);
    rc = kv_swap_out(sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_OK && h.n_blocks == 2, "swap out of 2 blocks: %s", rc ? e.msg : "");
    if (rc) goto done;
    int hog[64], n_hog = 0;
    while (n_hog < 64 && kv_pool_alloc(&b->mem->paged->pool, &hog[n_hog], &e) == KV_OK) n_hog++;
    rc = kv_swap_in(sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "2 blocks") && strstr(e.msg, "0 free"),
             "full device pool: swap in rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(h.resident && h.n_blocks == 2 && sw->pool.n_used == 2 && b->length(b, 1) == 0 &&
                 b->mem->paged->tables[1].n_blocks == 0,
             "the refused swap in lost the sequence or left blocks behind");
    for (int i = 0; i < n_hog; i++) kv_pool_unref(&b->mem->paged->pool, hog[i], NULL);
    rc = kv_swap_in(sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_OK && b->length(b, 1) == 9, "swap in after the pool drained: %s",
             rc ? e.msg : "wrong length");
    kv_seq q2 = {1, 9, 1, tok + 9}, q2r = {1, 0, 10, tok};
    rc = b->forward(b, &q2, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q2r, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(lb, lr, (size_t)V * sizeof(float)),
             "the swapped-in sequence's next step differs: %s", rc ? e.msg : "logits");
    check_tiers(b, sw, "exhaustion");
done:
    pair_close(&p);
}

/* One step of @p tok at position pos in slot of b and slot 0 of the reference r (which holds
 * the same pos tokens): the logits must be the same bits. */
static void same_step(kv_backend *b, int slot, kv_backend *r, int pos, const int *tok,
                      float *lb, float *lr, const char *what)
{
    kv_err e;
    const int V = b->config->vocab_size;
    kv_seq q = {slot, pos, 1, tok + pos}, qr = {0, pos, 1, tok + pos};
    int rc = b->forward(b, &q, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &qr, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(lb, lr, (size_t)V * sizeof(float)), "%s: the next step "
             "differs from a sequence that never left: %s", what, rc ? e.msg : "logits");
    r->reset(r, 0); /* back to pos tokens, for the next comparison */
    kv_seq p = {0, 0, pos, tok};
    if (r->forward(r, &p, 1, lr, NULL, &e)) KV_CHECK(0, "%s: reference prefill: %s", what, e.msg);
}

/* Partial swap: shared blocks (a fork) stay, host-tier exhaustion, drops, prefetch refusals. */
static void check_partial(const kv_model *m)
{
    kv_err e;
    swap_pair p;
    int rc = pair_open(&p, m, 3, "partial");
    if (rc) goto done;
    kv_backend *b = p.b, *r = p.r;
    kv_swap *sw = &p.sw;
    float *lb = p.lb, *lr = p.lr;
    const int *tok = p.tok;
    rc = kv_paged_fork(b->mem, 1, 0, &e); /* slot 1 shares all 3 blocks */
    KV_CHECK(rc == KV_OK, "partial fork: %s", e.msg);
    kv_pool *dev = &b->mem->paged->pool;

    /* shared blocks: evicting them would free nothing, so none moves */
    kv_swapped h;
    int moved = -1, shared[3];
    memcpy(shared, b->mem->paged->tables[0].blocks, sizeof shared);
    rc = kv_swap_detach(sw, b->mem, 0, &h, &e);
    if (!rc) rc = kv_swap_evict(sw, b->mem, &h, 100, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 0 && h.n_on_host == 0 && sw->stats.copies[KV_LINK_OUT] == 0,
             "evict of 3 shared blocks: rc %d, moved %d (%s)", rc, moved, rc ? e.msg : "");
    KV_CHECK(dev->refcount[shared[0]] == 2 && dev->refcount[shared[2]] == 2, "detach kept %d "
             "references on a shared block, expected 2", dev->refcount[shared[0]]);
    /* the fork appends: its partial last block is copied on write, A's is A's alone now */
    same_step(b, 1, r, 21, tok, lb, lr, "the fork beside a detached sequence");
    rc = kv_swap_evict(sw, b->mem, &h, 100, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && h.host_blocks[2] >= 0 && h.dev_blocks[0] == shared[0],
             "evict after the copy on write: moved %d, want only logical block 2 (%s)", moved,
             rc ? e.msg : "");
    b->reset(b, 1); /* the fork finishes: blocks 0 and 1 are A's alone */
    rc = kv_swap_evict(sw, b->mem, &h, 1, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && h.host_blocks[1] >= 0 && h.dev_blocks[0] >= 0 &&
                 h.n_on_host == 2,
             "evict 1 more: moved %d, want logical block 1 (%s)", moved, rc ? e.msg : "");

    /* the host tier (3 blocks, 2 used) fills up: a 2-block eviction moves what fits, then
     * KV_ERR_CAPACITY with the sequence unchanged */
    kv_swapped g;
    kv_seq q1 = {2, 0, 16, tok}; /* 16 tokens: 2 full blocks */
    rc = b->forward(b, &q1, 1, lb, NULL, &e);
    if (!rc) rc = kv_swap_detach(sw, b->mem, 2, &g, &e);
    if (!rc) rc = kv_swap_evict(sw, b->mem, &g, 2, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && g.host_blocks[1] >= 0 && g.dev_blocks[0] >= 0,
             "evict into a tier with 1 free block: moved %d (%s)", moved, rc ? e.msg : "");
    const int keep = g.dev_blocks[0];
    rc = kv_swap_evict(sw, b->mem, &g, 2, &moved, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && moved == 0 && strstr(e.msg, "host tier is full") &&
                 g.dev_blocks[0] == keep && g.n_on_host == 1 && dev->refcount[keep] == 1,
             "evict into a full tier: rc %d, moved %d, '%s'", rc, moved, rc ? e.msg : "");
    /* drop of a partly evicted sequence: both tiers get their blocks back */
    const int used_dev = dev->n_used, used_host = sw->pool.n_used;
    kv_swapped_drop(sw, b->mem, &g);
    KV_CHECK(dev->n_used == used_dev - 1 && sw->pool.n_used == used_host - 1 && !g.resident,
             "drop: device %d -> %d, host %d -> %d blocks", used_dev, dev->n_used, used_host,
             sw->pool.n_used);

    /* prefetch into a full device pool: refused, nothing changes; then it goes */
    int hog[64], n_hog = 0;
    while (n_hog < 64 && kv_pool_alloc(dev, &hog[n_hog], &e) == KV_OK) n_hog++;
    rc = kv_swap_prefetch(sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && h.ticket == 0 && h.pre_blocks[1] < 0 &&
                 h.pre_blocks[2] < 0 && h.n_on_host == 2,
             "prefetch into a full pool: rc %d, '%s'", rc, rc ? e.msg : "");
    rc = kv_swap_in(sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && h.resident && b->mem->paged->tables[0].n_blocks == 0 &&
                 b->length(b, 0) == 0 && dev->refcount[h.dev_blocks[0]] == 1,
             "swap in into a full pool: rc %d, '%s'", rc, rc ? e.msg : "");
    for (int i = 0; i < n_hog; i++) kv_pool_unref(dev, hog[i], NULL);
    rc = kv_swap_prefetch(sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_OK && h.ticket > 0 && h.pre_blocks[1] >= 0 && h.pre_blocks[2] >= 0,
             "prefetch: rc %d, ticket %lld (%s)", rc, (long long)h.ticket, rc ? e.msg : "");
    int pre = h.pre_blocks[2];
    rc = kv_swap_prefetch(sw, b->mem, &h, &e); /* again: nothing to do */
    KV_CHECK(rc == KV_OK && h.pre_blocks[2] == pre, "a second prefetch changed the first");
    rc = kv_swap_evict(sw, b->mem, &h, 100, &moved, &e); /* on its way back: left alone */
    KV_CHECK(rc == KV_OK && moved == 0, "evict of a prefetching sequence moved %d", moved);
    rc = kv_swap_in(sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_OK && b->length(b, 0) == 21 && b->mem->paged->tables[0].blocks[2] == pre,
             "swap in after a prefetch: %s", rc ? e.msg : "table");
    same_step(b, 0, r, 21, tok, lb, lr, "a shared, then partly evicted, prefetched sequence");

    /* drop while a prefetch is in flight: it waits, then both tiers are clean */
    rc = kv_swap_detach(sw, b->mem, 0, &h, &e);
    if (!rc) rc = kv_swap_evict(sw, b->mem, &h, 100, &moved, &e);
    if (!rc) rc = kv_swap_prefetch(sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_OK && moved == 3 && h.ticket > 0, "evict all then prefetch: %s",
             rc ? e.msg : "moved");
    kv_swapped_drop(sw, b->mem, &h);
    check_tiers(b, sw, "partial");
done:
    pair_close(&p);
}

static void check_refusals_and_link(const kv_model *m)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec("fp8", SWAP_B, &e, &rc);
    kv_backend *b = NULL;
    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    if (!rc) rc = kv_swap_init(&sw, b->mem, 4, NULL, &e);
    KV_CHECK(rc == KV_OK, "fp8 setup: %s", e.msg);
    if (!rc) {
        int tok[4] = {5, 6, 7, 8};
        kv_seq q = {0, 0, 4, tok};
        float *lg = calloc((size_t)m->config.vocab_size, sizeof(float));
        rc = b->forward(b, &q, 1, lg, NULL, &e);
        free(lg);
        kv_swapped h;
        rc = rc ? rc : kv_swap_out(&sw, b->mem, 0, &h, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "fp8") && b->length(b, 0) == 4,
                 "fp8 swap: rc %d, '%s'", rc, rc ? e.msg : "");
        check_tiers(b, &sw, "fp8");
    }
    kv_swap_free(&sw);
    kv_link bad = {0, 1e-6, 0};
    KV_CHECK(b && kv_swap_init(&sw, b->mem, 4, &bad, &e) == KV_ERR_ARG, "a link of 0 B/s accepted");
    kv_swap_free(&sw);
    kv_backend_destroy(b);

    /* a contiguous backend has no blocks to swap */
    kv_cache_spec cs = ps;
    cs.layout.kind = KV_LAYOUT_CONTIGUOUS;
    b = NULL;
    rc = kv_backend_cpu(&b, m, &cs, &e);
    KV_CHECK(rc == KV_OK && !b->mem && kv_swap_init(&sw, b->mem, 4, NULL, &e) == KV_ERR_ARG,
             "a host tier over a contiguous backend accepted");
    kv_swap_free(&sw);
    kv_backend_destroy(b);

    /* the default link is PCIe 4.0 x16-like: 25 GB/s and 10 us per copy */
    const kv_link L = kv_link_default();
    KV_CHECK(L.bandwidth == 25e9 && L.latency == 10e-6 && !L.throttle, "default link %g B/s %g s",
             L.bandwidth, L.latency);
    KV_CHECK(fabs(kv_link_seconds(&L, 25000000000LL) - 1.00001) < 1e-12 &&
                 kv_link_seconds(&L, 0) == 0.0,
             "25 GB over the default link: %.9g s", kv_link_seconds(&L, 25000000000LL));
}

int main(void)
{
    kv_config c;
    kv_model m;
    if (swap_model(&m, &c)) return kv_test_finish();
    const char *variants[3] = {"fp32", "int8", "fp16"};
    for (int i = 0; i < 3; i++)
        check_swap_variant(kv_test_make_cpu, "cpu", &m, variants[i], &PLAN, (1u << N_MODES) - 1);
    check_exhaustion(&m);
    check_partial(&m);
    check_swap_async(kv_test_make_cpu, &m, "int8", "cpu");
    check_refusals_and_link(&m);
    kv_model_free(&m);
    return kv_test_finish();
}
