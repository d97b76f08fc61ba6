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
#include "common/test_swap_io.h"

#include "kv_needle.h"
#include "kv_rng.h"
#include "kv_sampler.h"
#include "kv_swap.h"

#include <math.h>
#include <string.h>

#define B 8
#define CAP 48
#define PROMPT 13
#define END 40    /* sequence A's final length */
#define N_SLOTS 3
#define MAX_STEPS 64

/* A's lengths at which it is swapped out (then B steps alone, then A comes back) */
static const int SWAP_AT[] = {13, 16, 17, 24, 30, 32};
#define N_SWAP ((int)(sizeof SWAP_AT / sizeof SWAP_AT[0]))

static int is_swap_point(int len)
{
    for (int i = 0; i < N_SWAP; i++)
        if (SWAP_AT[i] == len) return 1;
    return 0;
}

static kv_cache_spec paged_spec(const char *variant, int extra, kv_err *e, int *rc)
{
    kv_cache_spec s;
    *rc = kv_needle_cache_spec(variant, N_SLOTS, CAP, &s, e);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = B;
    s.layout.n_blocks = 2 * ((CAP + B - 1) / B) + extra;
    return s;
}

static int relocated;

/* How A leaves its slot at a swap point and comes back:
 *  WHOLE     kv_swap_out, then kv_swap_in (every block through the host);
 *  DETACH    kv_swap_detach, then kv_swap_in: no byte moves, A gets its own blocks back;
 *  EVICT     detach, kv_swap_evict of evict_k(i) blocks, then kv_swap_in copies them back;
 *  PREFETCH  detach, evict, kv_swap_prefetch (the CPU's I/O thread copies while Bq's lone
 *            step runs on other blocks), then kv_swap_in waits for it. */
enum { WHOLE = 0, DETACH, EVICT, PREFETCH, N_MODES };
static const char *MODE_NAME[N_MODES] = {"whole", "detach", "evict", "prefetch"};

/* Blocks evicted at the i-th swap point: 1, 2, or all of them. */
static int evict_k(int i) { return i % 3 == 2 ? 1000 : i % 3 + 1; }

static int relocated, evicted, in_flight; /* what run() saw, for the checks after it */

/* A leaves slot sa at swap point i: *h holds it. */
static int take_out(kv_swap *sw, kv_backend *b, int mode, int sa, int i, kv_swapped *h,
                    kv_err *e)
{
    if (mode == WHOLE) return kv_swap_out(sw, b->mem, sa, h, e);
    const int n = b->mem->paged->tables[sa].n_blocks;
    int rc = kv_swap_detach(sw, b->mem, sa, h, e), moved = 0;
    if (rc || mode == DETACH) return rc;
    rc = kv_swap_evict(sw, b->mem, h, evict_k(i), &moved, e);
    const int want = evict_k(i) < n ? evict_k(i) : n;
    KV_CHECK(rc == KV_OK && moved == want && h->n_on_host == want, "evict %d of %d blocks: "
             "moved %d (%s)", evict_k(i), n, moved, rc ? e->msg : "");
    for (int j = 0; j < n && !rc; j++) /* the last logical blocks went, the first stayed */
        KV_CHECK((h->host_blocks[j] >= 0) == (j >= n - want) &&
                     (h->dev_blocks[j] >= 0) == (j < n - want),
                 "evict: logical block %d of %d is on the %s", j, n,
                 h->host_blocks[j] >= 0 ? "host" : "device");
    evicted += moved;
    return rc;
}

/* One run: sequences A and Bq generate greedily from their prompts. A step is both (A first)
 * or, after each swap point, Bq alone. With sw != NULL, A leaves its slot at each swap point
 * as @p mode says and comes back (into the other free slot) after Bq's lone step.
 * logits [MAX_STEPS][2][V] (absent rows 0). Returns the steps run, or -1. */
static int run(kv_backend *b, kv_swap *sw, int mode, float *logits, kv_err *e)
{
    const int V = b->config->vocab_size;
    int ta[CAP], tb[CAP], la = PROMPT, lb = PROMPT - 4, sa = 0, st = 0, i_swap = 0;
    kv_rng r;
    kv_rng_seed(&r, 707);
    for (int t = 0; t < CAP; t++) {
        ta[t] = 1 + (int)(kv_rng_u32(&r) % 300);
        tb[t] = 1 + (int)(kv_rng_u32(&r) % 300);
    }
    int pa = 0, pb = 0; /* tokens already in the cache */
    while (la < END && st < MAX_STEPS) {
        float *lg = logits + (size_t)st * 2 * V;
        kv_seq q[2] = {{sa, pa, la - pa, ta + pa}, {1, pb, lb - pb, tb + pb}};
        if (b->forward(b, q, 2, lg, NULL, e)) return -1;
        pa = la;
        pb = lb;
        ta[la++] = kv_argmax(lg, V);
        tb[lb++] = kv_argmax(lg + V, V);
        st++;
        if (!is_swap_point(pa)) continue;
        kv_swapped h;
        int old[CAP / B + 1], n_old = 0;
        if (sw) {
            n_old = b->mem->paged->tables[sa].n_blocks;
            memcpy(old, b->mem->paged->tables[sa].blocks, (size_t)n_old * sizeof(int));
            int rc = take_out(sw, b, mode, sa, i_swap++, &h, e);
            KV_CHECK(rc == KV_OK, "%s: out at length %d: %s", MODE_NAME[mode], pa, e->msg);
            if (rc) return -1;
            KV_CHECK(b->length(b, sa) == 0 && b->mem->paged->tables[sa].n_blocks == 0,
                     "slot %d still holds %d tokens after the swap out", sa, b->length(b, sa));
            kv_test_pool_poison(b->mem, 900 + (uint64_t)pa);
            if (mode == PREFETCH) {
                rc = kv_swap_prefetch(sw, b->mem, &h, e);
                KV_CHECK(rc == KV_OK, "prefetch at length %d: %s", pa, e->msg);
                if (rc) return -1;
                in_flight += h.ticket > 0;
            }
        }
        lg = logits + (size_t)st * 2 * V; /* Bq alone: takes blocks A just freed */
        kv_seq qb = {1, pb, lb - pb, tb + pb};
        if (b->forward(b, &qb, 1, lg + V, NULL, e)) return -1;
        pb = lb;
        tb[lb++] = kv_argmax(lg + V, V);
        st++;
        if (sw) {
            sa = sa == 0 ? 2 : 0;
            int rc = kv_swap_in(sw, b->mem, sa, &h, e);
            KV_CHECK(rc == KV_OK, "%s: in at length %d: %s", MODE_NAME[mode], pa, e->msg);
            if (rc) return -1;
            KV_CHECK(b->length(b, sa) == pa && !h.resident, "swap in: slot %d holds %d of %d",
                     sa, b->length(b, sa), pa);
            relocated +=
                memcmp(old, b->mem->paged->tables[sa].blocks, (size_t)n_old * sizeof(int)) != 0;
        }
    }
    return st;
}

static void check_tiers(kv_backend *b, kv_swap *sw, const char *what)
{
    for (int s = 0; s < N_SLOTS; s++) b->reset(b, s);
    kv_err e;
    int n = kv_pool_check_leaks(&b->mem->paged->pool, NULL, 0);
    KV_CHECK(n == 0, "%s: %d device blocks leaked", what, n);
    KV_CHECK(kv_pool_validate(&b->mem->paged->pool, &e) == KV_OK, "%s: device pool: %s", what,
             e.msg);
    n = kv_pool_check_leaks(&sw->pool, NULL, 0);
    KV_CHECK(n == 0, "%s: %d host blocks leaked", what, n);
    KV_CHECK(kv_pool_validate(&sw->pool, &e) == KV_OK, "%s: host pool: %s", what, e.msg);
}

/* Block bytes from the format's own formula: L x 2 x H_kv x B x (row + metadata bytes). */
static size_t expected_block_bytes(const kv_config *c, const char *variant)
{
    const size_t d = (size_t)(c->dim / c->n_heads);
    const size_t row = !strcmp(variant, "fp32") ? 4 * d : !strcmp(variant, "fp16") ? 2 * d
                                                                                   : d + 4;
    return (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * B * row;
}

/* A run with swaps against the reference: bit for bit, and the link carried what the mode
 * moves: whole swaps every block both ways, detach nothing, evict and prefetch the evicted
 * blocks both ways; one batched copy per swap point and direction. */
static void check_run(const char *variant, int mode, const kv_swap *sw, size_t bb,
                      const float *ref, const float *got, int n_ref, int n_got, int V)
{
    const char *mn = MODE_NAME[mode];
    KV_CHECK(mode == WHOLE ? relocated == N_SWAP : mode == DETACH ? relocated == 0 : 1,
             "%s %s: %d of %d swaps came back to other blocks", variant, mn, relocated, N_SWAP);
    KV_CHECK(mode != PREFETCH || in_flight == N_SWAP, "%s: only %d of %d prefetches were "
             "asynchronous", variant, in_flight, N_SWAP);
    KV_CHECK(n_got == n_ref, "%s %s: %d steps with swaps, %d without", variant, mn, n_got, n_ref);
    int bad = 0, first = -1;
    for (int st = 0; st < n_ref && n_got == n_ref; st++)
        if (memcmp(got + (size_t)st * 2 * V, ref + (size_t)st * 2 * V,
                   2 * (size_t)V * sizeof(float))) {
            bad++;
            if (first < 0) first = st;
        }
    KV_CHECK(n_got == n_ref && bad == 0, "%s %s: swapped logits differ from the resident run "
             "in %d of %d steps (first: step %d)", variant, mn, bad, n_ref, first);
    int64_t blocks = 0;
    double secs = 0;
    const kv_link L = kv_link_default();
    for (int i = 0; i < N_SWAP; i++) {
        const int held = (SWAP_AT[i] + B - 1) / B;
        const int nb = mode == WHOLE ? held : mode == DETACH ? 0
                       : evict_k(i) < held ? evict_k(i) : held;
        blocks += nb;
        secs += nb ? L.latency + (double)nb * (double)bb / L.bandwidth : 0.0;
    }
    KV_CHECK(mode == WHOLE || mode == DETACH || evicted == blocks, "%s %s: %d blocks evicted, "
             "expected %lld", variant, mn, evicted, (long long)blocks);
    const int copies = mode == DETACH ? 0 : N_SWAP;
    for (int dir = 0; dir < 2; dir++) {
        KV_CHECK(sw->stats.copies[dir] == copies && sw->stats.blocks[dir] == blocks &&
                     sw->stats.bytes[dir] == blocks * (int64_t)bb,
                 "%s %s: link %s: %lld copies, %lld blocks, %lld bytes; expected %d, %lld, "
                 "%lld", variant, mn, dir ? "in" : "out", (long long)sw->stats.copies[dir],
                 (long long)sw->stats.blocks[dir], (long long)sw->stats.bytes[dir], copies,
                 (long long)blocks, (long long)(blocks * (int64_t)bb));
        KV_CHECK(fabs(sw->stats.seconds[dir] - secs) <= 1e-12 * secs, "%s %s: link %s: %.9g s "
                 "modelled, expected %.9g", variant, mn, dir ? "in" : "out",
                 sw->stats.seconds[dir], secs);
    }
}

static void check_variant(const kv_model *m, const char *variant)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec(variant, 0, &e, &rc);
    KV_CHECK(rc == KV_OK, "%s: %s", variant, e.msg);
    if (rc) return;
    const int V = m->config.vocab_size;
    const size_t n_logits = (size_t)MAX_STEPS * 2 * V;
    float *ref = calloc(n_logits, sizeof(float)), *got = calloc(n_logits, sizeof(float));
    kv_backend *b = NULL;
    rc = kv_backend_cpu(&b, m, &ps, &e);
    int n_ref = rc ? -1 : run(b, NULL, WHOLE, ref, &e);
    KV_CHECK(n_ref > 0, "%s: reference run: %s", variant, e.msg);
    kv_backend_destroy(b);
    b = NULL;

    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    rc = kv_backend_cpu(&b, m, &ps, &e);
    KV_CHECK(rc == KV_OK, "%s: swap backend: %s", variant, e.msg);
    if (!rc) rc = kv_swap_init(&sw, b->mem, 8, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s: host tier: %s", variant, e.msg);
    if (rc || n_ref <= 0) goto done;
    const size_t bb = b->mem->block_bytes(b->mem);
    KV_CHECK(bb == expected_block_bytes(&m->config, variant) && sw.pool.block_bytes == bb &&
                 sw.pool.block_size == B,
             "%s: block bytes %zu (host tier %zu), the formula says %zu", variant, bb,
             sw.pool.block_bytes, expected_block_bytes(&m->config, variant));

    for (int mode = 0; mode < N_MODES; mode++) {
        relocated = evicted = in_flight = 0;
        memset(&sw.stats, 0, sizeof sw.stats);
        memset(got, 0, n_logits * sizeof(float));
        int n_got = run(b, &sw, mode, got, &e);
        check_run(variant, mode, &sw, bb, ref, got, n_ref, n_got, V);
        check_tiers(b, &sw, variant);
    }
done:
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    free(ref);
    free(got);
}

/* Host tier too small: the swap out is refused whole and the device sequence carries on; a
 * device pool without room refuses the swap in and the sequence stays on the host. */
static void check_exhaustion(const kv_model *m)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec("int8", 0, &e, &rc);
    kv_backend *b = NULL, *r = NULL;
    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    if (!rc) rc = kv_backend_cpu(&r, m, &ps, &e);
    if (!rc) rc = kv_swap_init(&sw, b->mem, 2, NULL, &e);
    KV_CHECK(rc == KV_OK, "exhaustion setup: %s", e.msg);
    if (rc) goto done;
    const int V = m->config.vocab_size;
    float *lb = calloc(2 * (size_t)V, sizeof(float)), *lr = lb + V;
    int tok[CAP];
    for (int t = 0; t < CAP; t++) tok[t] = 3 + 7 * t % 200;
    kv_seq q = {0, 0, 21, tok}; /* 21 tokens: 3 blocks, the host tier has 2 */
    rc = b->forward(b, &q, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK, "exhaustion prefill: %s", e.msg);
    int before[3];
    memcpy(before, b->mem->paged->tables[0].blocks, sizeof before);
    kv_swapped h;
    rc = kv_swap_out(&sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "3 blocks") && strstr(e.msg, "2 free of 2"),
             "host tier of 2 blocks, sequence of 3: rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(b->length(b, 0) == 21 && b->mem->paged->tables[0].n_blocks == 3 &&
                 !memcmp(before, b->mem->paged->tables[0].blocks, sizeof before),
             "the refused swap out changed the device sequence (length %d)", b->length(b, 0));
    KV_CHECK(sw.stats.copies[KV_LINK_OUT] == 0 && sw.pool.n_used == 0,
             "the refused swap out moved %lld copies, holds %d host blocks",
             (long long)sw.stats.copies[KV_LINK_OUT], sw.pool.n_used);
    q = (kv_seq){0, 21, 1, tok + 21}; /* it carries on exactly as the reference */
    rc = b->forward(b, &q, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(lb, lr, (size_t)V * sizeof(float)),
             "after the refused swap out the next step differs: %s", rc ? e.msg : "logits");

    /* a 2-block sequence fits the host tier; the device pool is then filled to the brim */
    kv_seq q1 = {1, 0, 9, tok};
    rc = b->forward(b, &q1, 1, lb, NULL, &e);
    KV_CHECK(rc == KV_OK, "second sequence: %s", e.msg);
    rc = kv_swap_out(&sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_OK && h.n_blocks == 2, "swap out of 2 blocks: %s", rc ? e.msg : "");
    if (rc) {
        free(lb);
        goto done;
    }
    int hog[64], n_hog = 0;
    while (n_hog < 64 && kv_pool_alloc(&b->mem->paged->pool, &hog[n_hog], &e) == KV_OK) n_hog++;
    rc = kv_swap_in(&sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "2 blocks") && strstr(e.msg, "0 free"),
             "full device pool: swap in rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(h.resident && h.n_blocks == 2 && sw.pool.n_used == 2 && b->length(b, 1) == 0 &&
                 b->mem->paged->tables[1].n_blocks == 0,
             "the refused swap in lost the sequence or left blocks behind");
    for (int i = 0; i < n_hog; i++) kv_pool_unref(&b->mem->paged->pool, hog[i], NULL);
    rc = kv_swap_in(&sw, b->mem, 1, &h, &e);
    KV_CHECK(rc == KV_OK && b->length(b, 1) == 9, "swap in after the pool drained: %s",
             rc ? e.msg : "wrong length");
    kv_seq q2 = {1, 9, 1, tok + 9}, q2r = {1, 0, 10, tok};
    rc = b->forward(b, &q2, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q2r, 1, lr, NULL, &e);
    KV_CHECK(rc == KV_OK && !memcmp(lb, lr, (size_t)V * sizeof(float)),
             "the swapped-in sequence's next step differs: %s", rc ? e.msg : "logits");
    check_tiers(b, &sw, "exhaustion");
    free(lb);
done:
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    kv_backend_destroy(r);
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
    int rc;
    kv_cache_spec ps = paged_spec("int8", 0, &e, &rc);
    kv_backend *b = NULL, *r = NULL;
    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    if (!rc) rc = kv_backend_cpu(&r, m, &ps, &e);
    if (!rc) rc = kv_swap_init(&sw, b->mem, 3, NULL, &e);
    KV_CHECK(rc == KV_OK, "partial setup: %s", e.msg);
    if (rc) goto done;
    const int V = m->config.vocab_size;
    float *lb = calloc(2 * (size_t)V, sizeof(float)), *lr = lb + V;
    int tok[CAP];
    for (int t = 0; t < CAP; t++) tok[t] = 3 + 7 * t % 200;
    kv_seq q = {0, 0, 21, tok}; /* 21 tokens: 3 blocks, the last one partial */
    rc = b->forward(b, &q, 1, lb, NULL, &e);
    if (!rc) rc = r->forward(r, &q, 1, lr, NULL, &e);
    if (!rc) rc = kv_paged_fork(b->mem, 1, 0, &e); /* slot 1 shares all 3 blocks */
    KV_CHECK(rc == KV_OK, "partial prefill and fork: %s", e.msg);
    kv_pool *dev = &b->mem->paged->pool;

    /* shared blocks: evicting them would free nothing, so none moves */
    kv_swapped h;
    int moved = -1, shared[3];
    memcpy(shared, b->mem->paged->tables[0].blocks, sizeof shared);
    rc = kv_swap_detach(&sw, b->mem, 0, &h, &e);
    if (!rc) rc = kv_swap_evict(&sw, b->mem, &h, 100, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 0 && h.n_on_host == 0 && sw.stats.copies[KV_LINK_OUT] == 0,
             "evict of 3 shared blocks: rc %d, moved %d (%s)", rc, moved, rc ? e.msg : "");
    KV_CHECK(dev->refcount[shared[0]] == 2 && dev->refcount[shared[2]] == 2, "detach kept %d "
             "references on a shared block, expected 2", dev->refcount[shared[0]]);
    /* the fork appends: its partial last block is copied on write, A's is A's alone now */
    same_step(b, 1, r, 21, tok, lb, lr, "the fork beside a detached sequence");
    rc = kv_swap_evict(&sw, b->mem, &h, 100, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && h.host_blocks[2] >= 0 && h.dev_blocks[0] == shared[0],
             "evict after the copy on write: moved %d, want only logical block 2 (%s)", moved,
             rc ? e.msg : "");
    b->reset(b, 1); /* the fork finishes: blocks 0 and 1 are A's alone */
    rc = kv_swap_evict(&sw, b->mem, &h, 1, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && h.host_blocks[1] >= 0 && h.dev_blocks[0] >= 0 &&
                 h.n_on_host == 2,
             "evict 1 more: moved %d, want logical block 1 (%s)", moved, rc ? e.msg : "");

    /* the host tier (3 blocks, 2 used) fills up: a 2-block eviction moves what fits, then
     * KV_ERR_CAPACITY with the sequence unchanged */
    kv_swapped g;
    kv_seq q1 = {2, 0, 16, tok}; /* 16 tokens: 2 full blocks */
    rc = b->forward(b, &q1, 1, lb, NULL, &e);
    if (!rc) rc = kv_swap_detach(&sw, b->mem, 2, &g, &e);
    if (!rc) rc = kv_swap_evict(&sw, b->mem, &g, 2, &moved, &e);
    KV_CHECK(rc == KV_OK && moved == 1 && g.host_blocks[1] >= 0 && g.dev_blocks[0] >= 0,
             "evict into a tier with 1 free block: moved %d (%s)", moved, rc ? e.msg : "");
    const int keep = g.dev_blocks[0];
    rc = kv_swap_evict(&sw, b->mem, &g, 2, &moved, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && moved == 0 && strstr(e.msg, "host tier is full") &&
                 g.dev_blocks[0] == keep && g.n_on_host == 1 && dev->refcount[keep] == 1,
             "evict into a full tier: rc %d, moved %d, '%s'", rc, moved, rc ? e.msg : "");
    /* drop of a partly evicted sequence: both tiers get their blocks back */
    const int used_dev = dev->n_used, used_host = sw.pool.n_used;
    kv_swapped_drop(&sw, b->mem, &g);
    KV_CHECK(dev->n_used == used_dev - 1 && sw.pool.n_used == used_host - 1 && !g.resident,
             "drop: device %d -> %d, host %d -> %d blocks", used_dev, dev->n_used, used_host,
             sw.pool.n_used);

    /* prefetch into a full device pool: refused, nothing changes; then it goes */
    int hog[64], n_hog = 0;
    while (n_hog < 64 && kv_pool_alloc(dev, &hog[n_hog], &e) == KV_OK) n_hog++;
    rc = kv_swap_prefetch(&sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && h.ticket == 0 && h.pre_blocks[1] < 0 &&
                 h.pre_blocks[2] < 0 && h.n_on_host == 2,
             "prefetch into a full pool: rc %d, '%s'", rc, rc ? e.msg : "");
    rc = kv_swap_in(&sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && h.resident && b->mem->paged->tables[0].n_blocks == 0 &&
                 b->length(b, 0) == 0 && dev->refcount[h.dev_blocks[0]] == 1,
             "swap in into a full pool: rc %d, '%s'", rc, rc ? e.msg : "");
    for (int i = 0; i < n_hog; i++) kv_pool_unref(dev, hog[i], NULL);
    rc = kv_swap_prefetch(&sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_OK && h.ticket > 0 && h.pre_blocks[1] >= 0 && h.pre_blocks[2] >= 0,
             "prefetch: rc %d, ticket %lld (%s)", rc, (long long)h.ticket, rc ? e.msg : "");
    int pre = h.pre_blocks[2];
    rc = kv_swap_prefetch(&sw, b->mem, &h, &e); /* again: nothing to do */
    KV_CHECK(rc == KV_OK && h.pre_blocks[2] == pre, "a second prefetch changed the first");
    rc = kv_swap_evict(&sw, b->mem, &h, 100, &moved, &e); /* on its way back: left alone */
    KV_CHECK(rc == KV_OK && moved == 0, "evict of a prefetching sequence moved %d", moved);
    rc = kv_swap_in(&sw, b->mem, 0, &h, &e);
    KV_CHECK(rc == KV_OK && b->length(b, 0) == 21 && b->mem->paged->tables[0].blocks[2] == pre,
             "swap in after a prefetch: %s", rc ? e.msg : "table");
    same_step(b, 0, r, 21, tok, lb, lr, "a shared, then partly evicted, prefetched sequence");

    /* drop while a prefetch is in flight: it waits, then both tiers are clean */
    rc = kv_swap_detach(&sw, b->mem, 0, &h, &e);
    if (!rc) rc = kv_swap_evict(&sw, b->mem, &h, 100, &moved, &e);
    if (!rc) rc = kv_swap_prefetch(&sw, b->mem, &h, &e);
    KV_CHECK(rc == KV_OK && moved == 3 && h.ticket > 0, "evict all then prefetch: %s",
             rc ? e.msg : "moved");
    kv_swapped_drop(&sw, b->mem, &h);
    check_tiers(b, &sw, "partial");
    free(lb);
done:
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    kv_backend_destroy(r);
}

static void check_refusals_and_link(const kv_model *m)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec("fp8", 0, &e, &rc);
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
    kv_err e;
    kv_config c;
    uint64_t seed;
    kv_model m;
    memset(&m, 0, sizeof m);
    int rc = kv_config_default_by_name("tiny", &c, &seed, &e);
    if (!rc) rc = kv_model_alloc(&m, &c, &e);
    KV_CHECK(rc == KV_OK, "model: %s", e.msg);
    if (rc) return kv_test_finish();
    kv_model_randomize(&m, seed);
    const char *variants[3] = {"fp32", "int8", "fp16"};
    for (int i = 0; i < 3; i++) check_variant(&m, variants[i]);
    check_exhaustion(&m);
    check_partial(&m);
    kv_cache_spec ps = paged_spec("int8", 0, &e, &rc);
    kv_backend *b = NULL;
    if (!rc) rc = kv_backend_cpu(&b, &m, &ps, &e);
    KV_CHECK(rc == KV_OK, "async backend: %s", e.msg);
    if (!rc) check_async_io(&m, b, "cpu");
    kv_backend_destroy(b);
    check_refusals_and_link(&m);
    kv_model_free(&m);
    return kv_test_finish();
}
