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
 *  - no block leaks in either tier (kv_pool_check_leaks + kv_pool_validate on both). */
#include "kv_test.h"

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
    s.layout = KV_LAYOUT_PAGED;
    s.block_size = B;
    s.n_blocks = 2 * ((CAP + B - 1) / B) + extra;
    return s;
}

/* Overwrite every free device block with 0xFF bytes (NaN in fp32, fp16 and int8 scales) and
 * put them back on the free stack in a shuffled order: a swap in lands on other blocks than
 * the swap out left, and a byte it failed to bring back shows. */
static int relocated;
static void poison_free_blocks(kv_backend *b, uint64_t seed)
{
    kv_pool *p = &b->paged->pool;
    int *ids = malloc((size_t)p->n_blocks * sizeof(int));              /* [N] */
    kv_block_copy *pairs = malloc((size_t)p->n_blocks * sizeof *pairs); /* [N] */
    const size_t bb = b->block_bytes(b);
    uint8_t *junk = malloc(bb);                                         /* [block_bytes] */
    memset(junk, 0xFF, bb);
    kv_err e;
    int n = 0;
    while (n < p->n_blocks && kv_pool_alloc(p, &ids[n], &e) == KV_OK) {
        pairs[n] = (kv_block_copy){0, ids[n]};
        n++;
    }
    KV_CHECK(b->write_blocks(b, pairs, n, junk, bb, &e) == KV_OK, "poison: %s", e.msg);
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(kv_rng_u32(&r) % (uint32_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int i = 0; i < n; i++) kv_pool_unref(p, ids[i], &e);
    free(ids);
    free(pairs);
    free(junk);
}

/* One run: sequences A and Bq generate greedily from their prompts. A step is both (A first)
 * or, after each swap point, Bq alone. With sw != NULL, A is swapped out at each swap point
 * and swapped back in (into the other free slot) after Bq's lone step.
 * logits [MAX_STEPS][2][V] (absent rows 0). Returns the steps run, or -1. */
static int run(kv_backend *b, kv_swap *sw, float *logits, kv_err *e)
{
    const int V = b->config->vocab_size;
    int ta[CAP], tb[CAP], la = PROMPT, lb = PROMPT - 4, sa = 0, st = 0;
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
            n_old = b->paged->tables[sa].n_blocks;
            memcpy(old, b->paged->tables[sa].blocks, (size_t)n_old * sizeof(int));
            int rc = kv_swap_out(sw, b, sa, &h, e);
            KV_CHECK(rc == KV_OK, "swap out at length %d: %s", pa, e->msg);
            if (rc) return -1;
            KV_CHECK(b->length(b, sa) == 0 && b->paged->tables[sa].n_blocks == 0,
                     "slot %d still holds %d tokens after the swap out", sa, b->length(b, sa));
            poison_free_blocks(b, 900 + (uint64_t)pa);
        }
        lg = logits + (size_t)st * 2 * V; /* Bq alone: takes blocks A just freed */
        kv_seq qb = {1, pb, lb - pb, tb + pb};
        if (b->forward(b, &qb, 1, lg + V, NULL, e)) return -1;
        pb = lb;
        tb[lb++] = kv_argmax(lg + V, V);
        st++;
        if (sw) {
            sa = sa == 0 ? 2 : 0;
            int rc = kv_swap_in(sw, b, sa, &h, e);
            KV_CHECK(rc == KV_OK, "swap in at length %d: %s", pa, e->msg);
            if (rc) return -1;
            KV_CHECK(b->length(b, sa) == pa && !h.resident, "swap in: slot %d holds %d of %d",
                     sa, b->length(b, sa), pa);
            relocated += memcmp(old, b->paged->tables[sa].blocks, (size_t)n_old * sizeof(int)) != 0;
        }
    }
    return st;
}

static void check_tiers(kv_backend *b, kv_swap *sw, const char *what)
{
    for (int s = 0; s < N_SLOTS; s++) b->reset(b, s);
    kv_err e;
    int n = kv_pool_check_leaks(&b->paged->pool, NULL, 0);
    KV_CHECK(n == 0, "%s: %d device blocks leaked", what, n);
    KV_CHECK(kv_pool_validate(&b->paged->pool, &e) == KV_OK, "%s: device pool: %s", what, e.msg);
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
    int n_ref = rc ? -1 : run(b, NULL, ref, &e);
    KV_CHECK(n_ref > 0, "%s: reference run: %s", variant, e.msg);
    kv_backend_destroy(b);
    b = NULL;

    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    rc = kv_backend_cpu(&b, m, &ps, &e);
    KV_CHECK(rc == KV_OK, "%s: swap backend: %s", variant, e.msg);
    if (!rc) rc = kv_swap_init(&sw, b, 8, NULL, &e);
    KV_CHECK(rc == KV_OK, "%s: host tier: %s", variant, e.msg);
    if (rc || n_ref <= 0) goto done;
    const size_t bb = b->block_bytes(b);
    KV_CHECK(bb == expected_block_bytes(&m->config, variant) && sw.pool.block_bytes == bb &&
                 sw.pool.block_size == B,
             "%s: block bytes %zu (host tier %zu), the formula says %zu", variant, bb,
             sw.pool.block_bytes, expected_block_bytes(&m->config, variant));

    relocated = 0;
    int n_got = run(b, &sw, got, &e);
    KV_CHECK(relocated == N_SWAP, "%s: only %d of %d swaps came back to other blocks", variant,
             relocated, N_SWAP);
    KV_CHECK(n_got == n_ref, "%s: %d steps with swaps, %d without", variant, n_got, n_ref);
    int bad = 0, first = -1;
    for (int st = 0; st < n_ref && n_got == n_ref; st++)
        if (memcmp(got + (size_t)st * 2 * V, ref + (size_t)st * 2 * V,
                   2 * (size_t)V * sizeof(float))) {
            bad++;
            if (first < 0) first = st;
        }
    KV_CHECK(n_got == n_ref && bad == 0, "%s: swapped logits differ from the resident run in "
             "%d of %d steps (first: step %d)", variant, bad, n_ref, first);

    /* the link: one batched copy per swap each way, whole blocks */
    int64_t blocks = 0;
    double secs = 0;
    const kv_link L = kv_link_default();
    for (int i = 0; i < N_SWAP; i++) {
        const int nb = (SWAP_AT[i] + B - 1) / B;
        blocks += nb;
        secs += L.latency + (double)nb * (double)bb / L.bandwidth;
    }
    for (int dir = 0; dir < 2; dir++) {
        KV_CHECK(sw.stats.copies[dir] == N_SWAP && sw.stats.blocks[dir] == blocks &&
                     sw.stats.bytes[dir] == blocks * (int64_t)bb,
                 "%s: link %s: %lld copies, %lld blocks, %lld bytes; expected %d, %lld, %lld",
                 variant, dir ? "in" : "out", (long long)sw.stats.copies[dir],
                 (long long)sw.stats.blocks[dir], (long long)sw.stats.bytes[dir], N_SWAP,
                 (long long)blocks, (long long)(blocks * (int64_t)bb));
        KV_CHECK(fabs(sw.stats.seconds[dir] - secs) <= 1e-12 * secs, "%s: link %s: %.9g s "
                 "modelled, expected %.9g", variant, dir ? "in" : "out", sw.stats.seconds[dir],
                 secs);
    }
    check_tiers(b, &sw, variant);
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
    if (!rc) rc = kv_swap_init(&sw, b, 2, NULL, &e);
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
    memcpy(before, b->paged->tables[0].blocks, sizeof before);
    kv_swapped h;
    rc = kv_swap_out(&sw, b, 0, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "3 blocks") && strstr(e.msg, "2 free of 2"),
             "host tier of 2 blocks, sequence of 3: rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(b->length(b, 0) == 21 && b->paged->tables[0].n_blocks == 3 &&
                 !memcmp(before, b->paged->tables[0].blocks, sizeof before),
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
    rc = kv_swap_out(&sw, b, 1, &h, &e);
    KV_CHECK(rc == KV_OK && h.n_blocks == 2, "swap out of 2 blocks: %s", rc ? e.msg : "");
    if (rc) {
        free(lb);
        goto done;
    }
    int hog[64], n_hog = 0;
    while (n_hog < 64 && kv_pool_alloc(&b->paged->pool, &hog[n_hog], &e) == KV_OK) n_hog++;
    rc = kv_swap_in(&sw, b, 1, &h, &e);
    KV_CHECK(rc == KV_ERR_CAPACITY && strstr(e.msg, "2 blocks") && strstr(e.msg, "0 free"),
             "full device pool: swap in rc %d, '%s'", rc, rc ? e.msg : "");
    KV_CHECK(h.resident && h.n_blocks == 2 && sw.pool.n_used == 2 && b->length(b, 1) == 0 &&
                 b->paged->tables[1].n_blocks == 0,
             "the refused swap in lost the sequence or left blocks behind");
    for (int i = 0; i < n_hog; i++) kv_pool_unref(&b->paged->pool, hog[i], NULL);
    rc = kv_swap_in(&sw, b, 1, &h, &e);
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

static void check_refusals_and_link(const kv_model *m)
{
    kv_err e;
    int rc;
    kv_cache_spec ps = paged_spec("fp8", 0, &e, &rc);
    kv_backend *b = NULL;
    kv_swap sw;
    memset(&sw, 0, sizeof sw);
    if (!rc) rc = kv_backend_cpu(&b, m, &ps, &e);
    if (!rc) rc = kv_swap_init(&sw, b, 4, NULL, &e);
    KV_CHECK(rc == KV_OK, "fp8 setup: %s", e.msg);
    if (!rc) {
        int tok[4] = {5, 6, 7, 8};
        kv_seq q = {0, 0, 4, tok};
        float *lg = calloc((size_t)m->config.vocab_size, sizeof(float));
        rc = b->forward(b, &q, 1, lg, NULL, &e);
        free(lg);
        kv_swapped h;
        rc = rc ? rc : kv_swap_out(&sw, b, 0, &h, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "fp8") && b->length(b, 0) == 4,
                 "fp8 swap: rc %d, '%s'", rc, rc ? e.msg : "");
        check_tiers(b, &sw, "fp8");
    }
    kv_swap_free(&sw);
    kv_link bad = {0, 1e-6, 0};
    KV_CHECK(b && kv_swap_init(&sw, b, 4, &bad, &e) == KV_ERR_ARG, "a link of 0 B/s accepted");
    kv_swap_free(&sw);
    kv_backend_destroy(b);

    /* a contiguous backend has no blocks to swap */
    kv_cache_spec cs = ps;
    cs.layout = KV_LAYOUT_CONTIGUOUS;
    b = NULL;
    rc = kv_backend_cpu(&b, m, &cs, &e);
    KV_CHECK(rc == KV_OK && !b->read_blocks && kv_swap_init(&sw, b, 4, NULL, &e) == KV_ERR_ARG,
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
    check_refusals_and_link(&m);
    kv_model_free(&m);
    return kv_test_finish();
}
