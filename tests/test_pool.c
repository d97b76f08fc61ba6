/* Chapter 05: block pool, block tables, copy-on-write, and a 1M-operation property test.
 *
 * The property test drives a pool, its block tables and a prefix cache with random
 * alloc / append / fork / free / evict operations (plus deliberate misuse), and keeps a
 * shadow "cache": one token id per slot, written through the slot mapping and copied by the
 * copy lists exactly as a real cache would move K/V. Every sequence must read back its own
 * tokens through its table, which proves copy-on-write never changes a sharer and a prefix
 * hit hands out exactly the prompt's content.
 *
 * Cost: after each op the cheap invariants are checked (counters add up to N, the sum of
 * refcounts equals the entries of all tables, the touched sequences read back correctly, the
 * touched blocks are live); every FULL_EVERY ops and at the end the O(N) audit runs
 * (kv_pool_validate, refcounts recomputed from the tables block by block, every sequence's
 * content, the prefix cache's entry count). The pools here are small (12..64 blocks, 16
 * sequences of <= 40 tokens) so FULL_EVERY = 1 is affordable: the full audit runs after
 * every one of the 1M ops (about 1 s of CPU). Raise it if the sizes grow.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_block_table.h"
#include "kv_pool.h"
#include "kv_prefix.h"
#include "kv_rng.h"
#include "common/kv_test.h"

#define MAX_SEQS 16
#define MAX_LEN 40
#define FULL_EVERY 1

/* ---- deterministic unit checks --------------------------------------------------------- */

/* a made-up int8 format with one fp32 scale per (token, layer, head, K or V) row */
static size_t int8_row_scale_bytes(const kv_config *c, const void *ctx)
{
    (void)ctx;
    return (size_t)c->n_layers * 2 * c->n_kv_heads * ((size_t)(c->dim / c->n_heads) + 4);
}

static void test_sizes(void)
{
    kv_config c = {0};
    c.dim = 64; c.n_heads = 4; c.n_kv_heads = 2; c.n_layers = 3;
    /* L · 2 · H_kv · d · 4 = 3 · 2 · 2 · 16 · 4 = 768 bytes per token, 16 tokens per block */
    KV_CHECK(kv_token_bytes_fp32(&c, NULL) == 768, "fp32 token bytes %zu",
             kv_token_bytes_fp32(&c, NULL));
    KV_CHECK(kv_pool_block_bytes(&c, 16, kv_token_bytes_fp32, NULL) == 768 * 16,
             "block bytes");
    KV_CHECK(kv_pool_block_bytes(&c, 0, kv_token_bytes_fp32, NULL) == 0, "B = 0 -> 0 bytes");
    /* any format: 3 · 2 · 2 · (16 + 4) = 240 bytes per token */
    KV_CHECK(kv_pool_block_bytes(&c, 8, int8_row_scale_bytes, NULL) == 240 * 8,
             "block bytes through a format's token-bytes function");
    kv_pool p;
    kv_err e;
    KV_CHECK(kv_pool_init(&p, 0, 16, 0, &e) == KV_ERR_ARG, "0 blocks refused");
    KV_CHECK(kv_pool_init(&p, 4, 0, 0, &e) == KV_ERR_ARG, "block size 0 refused");
}

static void test_misuse(void)
{
    kv_pool p;
    kv_err e;
    int b0, b1, b2, leaks[4];
    KV_CHECK(kv_pool_init(&p, 3, 4, 0, &e) == KV_OK, "init");
    KV_CHECK(kv_pool_alloc(&p, &b0, &e) == KV_OK && b0 == 0, "first block is 0 (got %d)", b0);
    kv_pool_alloc(&p, &b1, &e);
    kv_pool_alloc(&p, &b2, &e);
    KV_CHECK(kv_pool_alloc(&p, &b2, &e) == KV_ERR_CAPACITY, "exhausted pool -> capacity");
    KV_CHECK(kv_pool_check_leaks(&p, leaks, 4) == 3 && leaks[0] == 0 && leaks[2] == 2,
             "three referenced blocks reported");
    KV_CHECK(kv_pool_unref(&p, b1, &e) == KV_OK, "free");
    KV_CHECK(kv_pool_unref(&p, b1, &e) == KV_ERR_ARG && strstr(e.msg, "double free"),
             "double free detected: %s", e.msg);
    KV_CHECK(kv_pool_touch(&p, b1, &e) == KV_ERR_ARG && strstr(e.msg, "use after free"),
             "use after free detected: %s", e.msg);
    KV_CHECK(kv_pool_ref(&p, b1, &e) == KV_ERR_ARG, "ref of a free block refused");
    KV_CHECK(kv_pool_revive(&p, b1, &e) == KV_ERR_ARG, "revive of a free (uncached) block");
    KV_CHECK(kv_pool_touch(&p, 7, &e) == KV_ERR_ARG && kv_pool_unref(&p, -1, &e) == KV_ERR_ARG,
             "ids out of range refused");
    KV_CHECK(kv_pool_validate(&p, &e) == KV_OK, "misuse left the pool consistent: %s", e.msg);
    KV_CHECK(kv_pool_check_leaks(&p, leaks, 4) == 2 && leaks[0] == 0 && leaks[1] == 2,
             "leak check lists blocks 0 and 2");
    kv_pool_unref(&p, b0, &e);
    kv_pool_unref(&p, b2, &e);
    KV_CHECK(kv_pool_check_leaks(&p, NULL, 0) == 0, "no leak after all frees");
    /* a table that releases twice: the second release is empty, no double free */
    kv_block_table t;
    kv_block_table_init(&t, 4);
    KV_CHECK(kv_block_table_append(&t, &p, 9, NULL, NULL, &e) == KV_OK && t.n_blocks == 3,
             "9 tokens take 3 blocks of 4");
    KV_CHECK(kv_block_table_release(&t, &p, &e) == KV_OK, "release");
    KV_CHECK(kv_block_table_release(&t, &p, &e) == KV_OK && t.n_blocks == 0, "release twice");
    KV_CHECK(kv_pool_available(&p) == 3, "all blocks back");
    kv_pool_free(&p);
}

static void test_cow(void)
{
    kv_pool p;
    kv_err e;
    kv_copy_list cl;
    kv_copy_list_init(&cl);
    kv_pool_init(&p, 8, 4, 0, &e);
    kv_block_table a, b, c;
    kv_block_table_init(&a, 4);
    kv_block_table_init(&b, 4);
    kv_block_table_init(&c, 4);
    int64_t s[8];
    kv_block_table_append(&a, &p, 6, s, &cl, &e); /* blocks 0 (full), 1 (2 of 4) */
    KV_CHECK(s[0] == 0 && s[3] == 3 && s[4] == 4 && s[5] == 5, "slots block*B+offset");
    KV_CHECK(kv_block_table_unused_slots(&a) == 2 && kv_slot_block(s[5], 4) == 1 &&
             kv_slot_offset(s[5], 4) == 1, "2 unused slots; slot 5 is block 1 offset 1");
    KV_CHECK(kv_block_table_slot(&a, 5) == 5 && kv_block_table_slot(&a, 6) == -1,
             "slot lookup and out-of-range");
    KV_CHECK(kv_block_table_fork(&b, &a, &p, &e) == KV_OK, "fork");
    KV_CHECK(p.refcount[0] == 2 && p.refcount[1] == 2 && p.n_used == 2, "fork shares blocks");
    KV_CHECK(kv_block_table_fork(&b, &a, &p, &e) == KV_ERR_ARG, "fork into a non-empty table");
    KV_CHECK(kv_block_table_blocks_needed(&b, &p, 1) == 1, "CoW needs one block");
    KV_CHECK(kv_block_table_append(&b, &p, 1, s, NULL, &e) == KV_ERR_ARG,
             "CoW without a copy list refused");
    KV_CHECK(kv_block_table_append(&b, &p, 1, s, &cl, &e) == KV_OK, "append to the fork");
    KV_CHECK(cl.n == 1 && cl.pairs[0].src == 1 && cl.pairs[0].dst == 2,
             "one copy 1 -> 2 recorded (n %d)", cl.n);
    KV_CHECK(s[0] == 2 * 4 + 2, "child writes position 6 in its copy (slot %lld)",
             (long long)s[0]);
    KV_CHECK(a.blocks[1] == 1 && a.n_tokens == 6 && p.refcount[1] == 1,
             "parent unchanged: still block 1, 6 tokens, now sole owner");
    /* the parent appends in place now: refcount 1, no copy */
    kv_copy_list_clear(&cl);
    kv_block_table_append(&a, &p, 2, s, &cl, &e);
    KV_CHECK(cl.n == 0 && s[0] == 6 && s[1] == 7, "sole owner writes in place");
    /* fork at a block boundary: the next token opens a new block, nothing to copy */
    KV_CHECK(kv_block_table_fork(&c, &a, &p, &e) == KV_OK, "fork at a full block");
    kv_block_table_append(&c, &p, 1, s, &cl, &e);
    KV_CHECK(cl.n == 0 && c.n_blocks == 3, "no copy when the shared block is full");
    /* all or nothing on exhaustion */
    int avail = kv_pool_available(&p);
    int64_t before = c.n_tokens;
    KV_CHECK(kv_block_table_append(&c, &p, 4 * (avail + 1) + 3, s, &cl, &e) == KV_ERR_CAPACITY,
             "too long an append -> capacity");
    KV_CHECK(c.n_tokens == before && kv_pool_available(&p) == avail && cl.n == 0,
             "failed append changed nothing");
    kv_block_table_release(&a, &p, &e);
    kv_block_table_release(&b, &p, &e);
    kv_block_table_release(&c, &p, &e);
    KV_CHECK(kv_pool_check_leaks(&p, NULL, 0) == 0 && kv_pool_validate(&p, &e) == KV_OK,
             "no leak");
    kv_copy_list_free(&cl);
    kv_pool_free(&p);
}

/* ---- the property test ----------------------------------------------------------------- */

typedef struct {
    int live;
    kv_block_table t;
    int toks[MAX_LEN]; /* what the sequence holds, position by position */
} seq;

typedef struct {
    kv_pool pool;
    kv_prefix pc;
    int use_prefix;
    int B;
    int *store; /* [N][B] the shadow cache: token id written at each slot */
    seq s[MAX_SEQS];
    kv_copy_list cl;
    kv_rng rng;
    int64_t table_entries; /* sum of n_blocks over live sequences, kept incrementally */
    long ops, bad, cows, hits, exhausted, evictions, misuse;
} world;

static int rnd(world *w, int n) { return (int)(kv_rng_u32(&w->rng) % (uint32_t)n); }

static int fail(world *w, long op, const char *what)
{
    if (w->bad++ < 5) printf("  op %ld: %s\n", op, what);
    return 1;
}

/* the sequence reads back its own tokens through its table */
static int content_ok(const world *w, const seq *q)
{
    for (int64_t i = 0; i < q->t.n_tokens; i++) {
        int64_t slot = kv_block_table_slot(&q->t, i);
        if (slot < 0 || w->store[slot] != q->toks[i]) return 0;
    }
    return q->t.n_blocks == (q->t.n_tokens + w->B - 1) / w->B;
}

static int blocks_live(const world *w, const seq *q)
{
    for (int i = 0; i < q->t.n_blocks; i++)
        if (kv_pool_touch(&w->pool, q->t.blocks[i], NULL)) return 0;
    return 1;
}

/* append n tokens (already in q->toks past n_tokens); perform the copies, then the writes */
static int grow(world *w, seq *q, int n)
{
    int64_t slots[MAX_LEN];
    kv_err e;
    int64_t old = q->t.n_tokens;
    int st = kv_block_table_append(&q->t, &w->pool, n, slots, &w->cl, &e);
    if (st) return st;
    w->table_entries += q->t.n_blocks - (old + w->B - 1) / w->B;
    for (int i = 0; i < w->cl.n; i++) {
        memcpy(w->store + (size_t)w->cl.pairs[i].dst * w->B,
               w->store + (size_t)w->cl.pairs[i].src * w->B, (size_t)w->B * sizeof(int));
        w->cows++;
    }
    kv_copy_list_clear(&w->cl);
    for (int i = 0; i < n; i++) w->store[slots[i]] = q->toks[old + i];
    if (w->use_prefix) kv_prefix_register(&w->pc, &q->t, q->toks, NULL);
    return KV_OK;
}

static void release(world *w, seq *q)
{
    w->table_entries -= q->t.n_blocks;
    kv_block_table_release(&q->t, &w->pool, NULL);
    q->live = 0;
}

/* the O(N) audit */
static void full_check(world *w, long op)
{
    kv_err e;
    if (kv_pool_validate(&w->pool, &e)) fail(w, op, e.msg);
    int *expect = calloc((size_t)w->pool.n_blocks, sizeof(int));
    for (int i = 0; i < MAX_SEQS; i++) {
        if (!w->s[i].live) continue;
        for (int j = 0; j < w->s[i].t.n_blocks; j++) expect[w->s[i].t.blocks[j]]++;
        if (!content_ok(w, &w->s[i])) fail(w, op, "a sequence reads back wrong tokens");
    }
    int hashed = 0;
    for (int b = 0; b < w->pool.n_blocks; b++) {
        if (expect[b] != w->pool.refcount[b]) fail(w, op, "refcount != table references");
        hashed += w->pool.hashed[b];
    }
    if (w->use_prefix && hashed != w->pc.n_entries) fail(w, op, "prefix entries != hashed");
    free(expect);
}

/* prompts share beginnings so prefix hits happen: one of 4 fixed stems, then random tokens */
static int make_prompt(world *w, int *toks)
{
    int len = 1 + rnd(w, MAX_LEN / 2), stem = rnd(w, 4), keep = rnd(w, len + 1);
    for (int i = 0; i < len; i++) toks[i] = i < keep ? 1000 * stem + i : rnd(w, 1000);
    return len;
}

static void property(int B, int n_blocks, int use_prefix, uint64_t mask, long n_ops,
                     uint64_t seed)
{
    world *w = calloc(1, sizeof(world));
    kv_err e;
    w->B = B;
    w->use_prefix = use_prefix;
    kv_rng_seed(&w->rng, seed);
    kv_pool_init(&w->pool, n_blocks, B, 0, &e);
    if (use_prefix) {
        kv_prefix_init(&w->pc, &w->pool, &e);
        w->pc.hash_mask = mask;
    }
    w->store = calloc((size_t)n_blocks * B, sizeof(int));
    kv_copy_list_init(&w->cl);
    for (int i = 0; i < MAX_SEQS; i++) kv_block_table_init(&w->s[i].t, B);
    double t0 = kv_now();

    for (long op = 0; op < n_ops; op++) {
        int k = rnd(w, MAX_SEQS), kind = rnd(w, 100);
        w->ops++;
        seq *q = &w->s[k];
        seq *other = NULL;
        if (!q->live && kind < 70) kind = 0; /* an empty slot mostly gets a new sequence */
        if (kind < 15) { /* alloc: a new sequence, prefix hits first, then its prompt */
            if (q->live) release(w, q);
            int len = make_prompt(w, q->toks);
            int64_t hit = 0;
            if (use_prefix) {
                kv_prefix_match(&w->pc, q->toks, len, &q->t, &hit, &e);
                w->table_entries += q->t.n_blocks;
                w->hits += hit / B;
            }
            q->live = 1;
            if (grow(w, q, len - (int)hit)) { /* pool full: the request waits, keeps nothing */
                w->exhausted++;
                release(w, q);
            }
        } else if (kind < 60) { /* append 1..6 tokens */
            int n = 1 + rnd(w, 6);
            if (q->t.n_tokens + n > MAX_LEN) { /* long enough: it finishes instead */
                release(w, q);
                goto check;
            }
            int avail = kv_pool_available(&w->pool);
            int64_t len0 = q->t.n_tokens;
            for (int i = 0; i < n; i++) q->toks[len0 + i] = rnd(w, 1000);
            int st = grow(w, q, n);
            if (st == KV_ERR_CAPACITY) {
                w->exhausted++;
                if (q->t.n_tokens != len0 || kv_pool_available(&w->pool) != avail)
                    fail(w, op, "failed append changed the table or pool");
            } else if (st) {
                fail(w, op, "append failed unexpectedly");
            }
        } else if (kind < 75) { /* fork into another slot */
            int d = rnd(w, MAX_SEQS);
            if (d == k) goto check;
            other = &w->s[d];
            if (other->live) release(w, other);
            if (kv_block_table_fork(&other->t, &q->t, &w->pool, &e)) fail(w, op, e.msg);
            memcpy(other->toks, q->toks, sizeof(q->toks));
            other->live = 1;
            w->table_entries += other->t.n_blocks;
        } else if (kind < 92) { /* free on finish */
            release(w, q);
        } else if (kind < 97) { /* evict a cached block */
            if (kv_pool_evict_one(&w->pool, NULL) == KV_OK) w->evictions++;
        } else { /* misuse: free or touch a block nobody references */
            int b = rnd(w, n_blocks);
            if (w->pool.refcount[b] == 0) {
                int avail = kv_pool_available(&w->pool);
                if (kv_pool_unref(&w->pool, b, NULL) != KV_ERR_ARG ||
                    kv_pool_touch(&w->pool, b, NULL) != KV_ERR_ARG ||
                    kv_pool_available(&w->pool) != avail)
                    fail(w, op, "double free / use after free not caught");
                w->misuse++;
            }
        }
    check:; /* cheap invariants, every op */
        const kv_pool *p = &w->pool;
        if (p->n_free + p->n_cached + p->n_used != p->n_blocks) fail(w, op, "counters != N");
        if (p->total_refs != w->table_entries) fail(w, op, "refs != table entries");
        if (q->live && (!content_ok(w, q) || !blocks_live(w, q)))
            fail(w, op, "touched sequence wrong");
        if (other && (!content_ok(w, other) || !blocks_live(w, other)))
            fail(w, op, "forked sequence wrong");
        if (op % FULL_EVERY == FULL_EVERY - 1) full_check(w, op);
    }
    full_check(w, n_ops);
    for (int i = 0; i < MAX_SEQS; i++)
        if (w->s[i].live) release(w, &w->s[i]);
    KV_CHECK(kv_pool_check_leaks(&w->pool, NULL, 0) == 0 && w->table_entries == 0,
             "no leak after releasing every sequence");
    KV_CHECK(kv_pool_validate(&w->pool, &e) == KV_OK, "final audit: %s", e.msg);
    KV_CHECK(w->bad == 0, "B %d N %d: %ld invariant violations", B, n_blocks, w->bad);
    /* the run must have exercised what it claims to test */
    KV_CHECK(w->cows > 0 && w->exhausted > 0 && w->misuse > 0, "CoW, exhaustion, misuse seen");
    if (use_prefix)
        KV_CHECK(w->hits > 0 && w->pool.n_evictions > 0, "prefix hits and evictions seen");
    if (use_prefix && mask != ~0ull)
        KV_CHECK(w->pc.collisions > 0, "forced collisions were rejected (%lld)",
                 (long long)w->pc.collisions);
    printf("  B %2d N %3d prefix %d mask %#llx: %ld ops in %.2f s, %ld copies-on-write, "
           "%ld block hits, %ld exhausted, %lld evictions, %ld misuse\n",
           B, n_blocks, use_prefix, (unsigned long long)mask, w->ops, kv_now() - t0, w->cows,
           w->hits, w->exhausted, (long long)w->pool.n_evictions, w->misuse);
    if (use_prefix) {
        kv_prefix_free(&w->pc);
        KV_CHECK(w->pool.n_free == n_blocks, "every block FREE once the prefix cache is gone");
    }
    kv_copy_list_free(&w->cl);
    free(w->store);
    kv_pool_free(&w->pool);
    free(w);
}

int main(void)
{
    test_sizes();
    test_misuse();
    test_cow();
    /* 1M ops in all, three shapes: prefix cache on, forced hash collisions, plain pool */
    property(4, 64, 1, ~0ull, 600000, 1);
    property(2, 48, 1, 0x7, 200000, 2);
    property(16, 12, 0, ~0ull, 200000, 3);
    return kv_test_finish();
}
