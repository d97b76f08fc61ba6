/*
 * The chapter-07 round trip run per backend (test_swap on the CPU, test_gpu_swap on CUDA): two
 * sequences A and Bq generate greedily; at each swap point A leaves its slot (whole swap,
 * detach, evict, or evict + prefetch), the blocks it freed are poisoned (0xFF, shuffled free
 * stack) while Bq steps alone and takes them, and A comes back into another slot. Checked:
 * every logit bit for bit those of the same backend's run that never swapped; a whole swap
 * always comes back to other blocks, a detach to its own; the last logical blocks are the ones
 * evicted; the link carried blocks x block bytes each way in one batched copy per swap point,
 * with the modelled seconds; block bytes as the format's formula says; no leak in either tier.
 * The backend comes from a factory (kv_test_make_cpu, kv_test_make_cuda); check_swap_async()
 * runs test_swap_io.h's asynchronous-hook check the same way.
 * Include after kv_test.h and kv_test_backend.h.
 */
#ifndef TEST_SWAP_RUN_H
#define TEST_SWAP_RUN_H

#include <math.h>
#include <string.h>

#include "kv_needle.h"
#include "kv_rng.h"
#include "kv_sampler.h"
#include "kv_swap.h"
#include "test_swap_io.h"

#define CAP 48
#define PROMPT 13
#define N_SLOTS 3
#define MAX_STEPS 64
#define SWAP_B 8 /* the round trip's block size */

/* A's lengths at which it is swapped out (then Bq steps alone, then A comes back) */
static const int SWAP_AT[] = {13, 16, 17, 24, 30, 32};

/* How much of the plan a backend runs: the first n_swap swap points, A's final length end. */
typedef struct {
    int n_swap, end;
} swap_plan;

static kv_cache_spec paged_spec(const char *variant, int B, kv_err *e, int *rc)
{
    kv_cache_spec s;
    *rc = kv_needle_cache_spec(variant, N_SLOTS, CAP, &s, e);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = B;
    s.layout.n_blocks = 2 * ((CAP + B - 1) / B);
    return s;
}

/* How A leaves its slot at a swap point and comes back:
 *  WHOLE     kv_swap_out, then kv_swap_in (every block through the host);
 *  DETACH    kv_swap_detach, then kv_swap_in: no byte moves, A gets its own blocks back;
 *  EVICT     detach, kv_swap_evict of evict_k(i) blocks, then kv_swap_in copies them back;
 *  PREFETCH  detach, evict, kv_swap_prefetch (the I/O thread or the copy stream copies while
 *            Bq's lone step runs on other blocks), then kv_swap_in waits for it. */
enum { WHOLE = 0, DETACH, EVICT, PREFETCH, N_MODES };
static const char *MODE_NAME[N_MODES] = {"whole", "detach", "evict", "prefetch"};

/* Blocks evicted at the i-th swap point: 1, 2, or all of them. */
static int evict_k(int i) { return i % 3 == 2 ? 1000 : i % 3 + 1; }

static int relocated, evicted, in_flight; /* what swap_run() saw, for the checks after it */

static int is_swap_point(const swap_plan *p, int len)
{
    for (int i = 0; i < p->n_swap; i++)
        if (SWAP_AT[i] == len) return 1;
    return 0;
}

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
static int swap_run(kv_backend *b, const swap_plan *p, kv_swap *sw, int mode, float *logits,
                    kv_err *e)
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
    while (la < p->end && st < MAX_STEPS) {
        float *lg = logits + (size_t)st * 2 * V;
        kv_seq q[2] = {{sa, pa, la - pa, ta + pa}, {1, pb, lb - pb, tb + pb}};
        if (b->forward(b, q, 2, lg, NULL, e)) return -1;
        pa = la;
        pb = lb;
        ta[la++] = kv_argmax(lg, V);
        tb[lb++] = kv_argmax(lg + V, V);
        st++;
        if (!is_swap_point(p, pa)) continue;
        kv_swapped h;
        int old[CAP / SWAP_B + 1], n_old = 0;
        if (sw) {
            n_old = b->mem->paged->tables[sa].n_blocks;
            memcpy(old, b->mem->paged->tables[sa].blocks, (size_t)n_old * sizeof(int));
            int rc = take_out(sw, b, mode, sa, i_swap++, &h, e);
            KV_CHECK(rc == KV_OK, "%s: out at length %d: %s", MODE_NAME[mode], pa, e->msg);
            if (rc) return -1;
            KV_CHECK(b->length(b, sa) == 0 && b->mem->paged->tables[sa].n_blocks == 0,
                     "slot %d still holds %d tokens after the swap out", sa, b->length(b, sa));
            /* poisoned before a prefetch takes its blocks: the prefetch must fill them */
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
static size_t expected_block_bytes(const kv_config *c, const char *variant, int B)
{
    const size_t d = (size_t)(c->dim / c->n_heads);
    const size_t row = !strcmp(variant, "fp32") ? 4 * d : !strcmp(variant, "fp16") ? 2 * d
                                                                                   : d + 4;
    return (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * (size_t)B * row;
}

/* A run with swaps against the reference: bit for bit, and the link carried what the mode
 * moves: whole swaps every block both ways, detach nothing, evict and prefetch the evicted
 * blocks both ways; one batched copy per swap point and direction. */
static void check_run(const char *what, const swap_plan *p, int mode, const kv_swap *sw,
                      size_t bb, const float *ref, const float *got, int n_ref, int n_got, int V)
{
    const char *mn = MODE_NAME[mode];
    KV_CHECK(mode == WHOLE ? relocated == p->n_swap : mode == DETACH ? relocated == 0 : 1,
             "%s %s: %d of %d swaps came back to other blocks", what, mn, relocated, p->n_swap);
    KV_CHECK(mode != PREFETCH || in_flight == p->n_swap, "%s: only %d of %d prefetches were "
             "asynchronous", what, in_flight, p->n_swap);
    KV_CHECK(n_got == n_ref, "%s %s: %d steps with swaps, %d without", what, mn, n_got, n_ref);
    int bad = 0, first = -1;
    for (int st = 0; st < n_ref && n_got == n_ref; st++)
        if (memcmp(got + (size_t)st * 2 * V, ref + (size_t)st * 2 * V,
                   2 * (size_t)V * sizeof(float))) {
            bad++;
            if (first < 0) first = st;
        }
    KV_CHECK(n_got == n_ref && bad == 0, "%s %s: swapped logits differ from the resident run "
             "in %d of %d steps (first: step %d)", what, mn, bad, n_ref, first);
    int64_t blocks = 0;
    double secs = 0;
    const kv_link L = kv_link_default();
    for (int i = 0; i < p->n_swap; i++) {
        const int held = (SWAP_AT[i] + SWAP_B - 1) / SWAP_B;
        const int nb = mode == WHOLE ? held : mode == DETACH ? 0
                       : evict_k(i) < held ? evict_k(i) : held;
        blocks += nb;
        secs += nb ? L.latency + (double)nb * (double)bb / L.bandwidth : 0.0;
    }
    KV_CHECK(mode == WHOLE || mode == DETACH || evicted == blocks, "%s %s: %d blocks evicted, "
             "expected %lld", what, mn, evicted, (long long)blocks);
    const int copies = mode == DETACH ? 0 : p->n_swap;
    for (int dir = 0; dir < 2; dir++) {
        KV_CHECK(sw->stats.copies[dir] == copies && sw->stats.blocks[dir] == blocks &&
                     sw->stats.bytes[dir] == blocks * (int64_t)bb,
                 "%s %s: link %s: %lld copies, %lld blocks, %lld bytes; expected %d, %lld, "
                 "%lld", what, mn, dir ? "in" : "out", (long long)sw->stats.copies[dir],
                 (long long)sw->stats.blocks[dir], (long long)sw->stats.bytes[dir], copies,
                 (long long)blocks, (long long)(blocks * (int64_t)bb));
        KV_CHECK(fabs(sw->stats.seconds[dir] - secs) <= 1e-12 * secs, "%s %s: link %s: %.9g s "
                 "modelled, expected %.9g", what, mn, dir ? "in" : "out",
                 sw->stats.seconds[dir], secs);
    }
}

/* The round trip of one format on the factory's backend, in the modes whose bit is set in
 * @p modes (1 << WHOLE | ...): the resident run first, then each mode with swaps. */
static void check_swap_variant(kv_needle_backend_fn make, const char *dev, const kv_model *m,
                               const char *variant, const swap_plan *p, unsigned modes)
{
    kv_err e;
    int rc;
    char what[64];
    snprintf(what, sizeof what, "%s %s", dev, variant);
    kv_cache_spec ps = paged_spec(variant, SWAP_B, &e, &rc);
    KV_CHECK(rc == KV_OK, "%s: %s", what, e.msg);
    if (rc) return;
    const int V = m->config.vocab_size;
    const size_t n_logits = (size_t)MAX_STEPS * 2 * V;
    float *ref = calloc(n_logits, sizeof(float)), *got = calloc(n_logits, sizeof(float));
    kv_backend *b = NULL;
    rc = make(&b, m, &ps, NULL, &e);
    int n_ref = rc ? -1 : swap_run(b, p, NULL, WHOLE, ref, &e);
    KV_CHECK(n_ref > 0, "%s: reference run: %s", what, e.msg);
    kv_backend_destroy(b);
    b = NULL;

    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    rc = make(&b, m, &ps, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s: swap backend: %s", what, e.msg);
    if (!rc) rc = kv_swap_init(&sw, b->mem, 8, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s: host tier: %s", what, e.msg);
    if (rc || n_ref <= 0) goto done;
    const size_t bb = b->mem->block_bytes(b->mem);
    KV_CHECK(bb == expected_block_bytes(&m->config, variant, SWAP_B) &&
                 sw.pool.block_bytes == bb && sw.pool.block_size == SWAP_B,
             "%s: block bytes %zu (host tier %zu), the formula says %zu", what, bb,
             sw.pool.block_bytes, expected_block_bytes(&m->config, variant, SWAP_B));

    for (int mode = 0; mode < N_MODES; mode++) {
        if (!(modes >> mode & 1)) continue;
        relocated = evicted = in_flight = 0;
        memset(&sw.stats, 0, sizeof sw.stats);
        memset(got, 0, n_logits * sizeof(float));
        int n_got = swap_run(b, p, &sw, mode, got, &e);
        check_run(what, p, mode, &sw, bb, ref, got, n_ref, n_got, V);
        check_tiers(b, &sw, what);
    }
done:
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    free(ref);
    free(got);
}

/* The tiny model both backends swap on (random weights from its own seed). */
static int swap_model(kv_model *m, kv_config *c)
{
    kv_err e;
    uint64_t seed;
    memset(m, 0, sizeof *m);
    int rc = kv_config_default_by_name("tiny", c, &seed, &e);
    if (!rc) rc = kv_model_alloc(m, c, &e);
    KV_CHECK(rc == KV_OK, "model: %s", e.msg);
    if (!rc) kv_model_randomize(m, seed);
    return rc;
}

/* check_async_io() (test_swap_io.h) on the factory's backend of one format. */
static void check_swap_async(kv_needle_backend_fn make, const kv_model *m, const char *variant,
                             const char *what)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec(variant, SWAP_B, &e, &rc);
    kv_backend *b = NULL;
    if (!rc) rc = make(&b, m, &ps, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s: async backend: %s", what, e.msg);
    if (!rc) check_async_io(m, b, what);
    kv_backend_destroy(b);
}

#endif
