/* Chapter 05: the prefix cache. Hits are verified (tokens and parent identity), forced hash
 * collisions are rejected, duplicates are not cached twice, eviction follows LRU order with a
 * sequence's deepest block first, and the documented hash has known values.
 *
 * A shadow cache (one token id per slot) stands in for K/V: what a hit hands out must read
 * back as the prompt's own tokens. */
#include <stdlib.h>
#include <string.h>

#include "kv_block_table.h"
#include "kv_pool.h"
#include "kv_prefix.h"
#include "common/kv_test.h"

#define B 4
#define NB 16

static kv_pool pool;
static kv_prefix pc;
static int store[NB * B]; /* [NB][B] token id at each slot */

/* a sequence computed from scratch: prefix match, then append + write the rest, register */
static int64_t run(kv_block_table *t, const int *toks, int n, int use_match)
{
    kv_err e;
    int64_t hit = 0, slots[64];
    kv_copy_list cl;
    kv_copy_list_init(&cl);
    kv_block_table_init(t, B);
    if (use_match) kv_prefix_match(&pc, toks, n, t, &hit, &e);
    if (kv_block_table_append(t, &pool, n - hit, slots, &cl, &e)) printf("  append: %s\n", e.msg);
    for (int i = 0; i < n - hit; i++) store[slots[i]] = toks[hit + i];
    kv_prefix_register(&pc, t, toks, &e);
    kv_copy_list_free(&cl);
    return hit;
}

static int reads_back(const kv_block_table *t, const int *toks)
{
    for (int64_t i = 0; i < t->n_tokens; i++)
        if (store[kv_block_table_slot(t, i)] != toks[i]) return 0;
    return 1;
}

static void setup(uint64_t mask)
{
    kv_err e;
    kv_pool_init(&pool, NB, B, 0, &e);
    kv_prefix_init(&pc, &pool, &e);
    pc.hash_mask = mask;
    memset(store, 0, sizeof(store));
}

static void teardown(void)
{
    kv_err e;
    kv_prefix_free(&pc);
    KV_CHECK(kv_pool_check_leaks(&pool, NULL, 0) == 0 && kv_pool_validate(&pool, &e) == KV_OK &&
             pool.n_free == NB, "pool clean at the end");
    kv_pool_free(&pool);
}

static void test_hash(void)
{
    /* values computed independently from the definition in kv_prefix.h (FNV-1a 64 over the
     * parent's 8 bytes then 4 bytes per token, little endian) */
    int a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, m1 = -1;
    uint64_t h0 = kv_prefix_hash(KV_PREFIX_ROOT, a, 4);
    KV_CHECK(h0 == 0x58cc85c45867f1c8ull, "hash(root, 1 2 3 4) = %#llx", (unsigned long long)h0);
    KV_CHECK(kv_prefix_hash(h0, b, 4) == 0x6e9d689f5e150beaull, "chained hash");
    KV_CHECK(kv_prefix_hash(0, &m1, 1) == 0x7f682652c26b1bf1ull, "token -1 as 4 bytes");
}

static void test_hits(void)
{
    setup(~0ull);
    kv_err e;
    int p[11] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32};
    int q[11] = {10, 11, 12, 13, 20, 21, 22, 23, 99, 98, 97};
    int r[11] = {10, 11, 12, 14, 20, 21, 22, 23, 30, 31, 32}; /* differs in block 0 */
    kv_block_table tp, tq, tr, tx;
    KV_CHECK(run(&tp, p, 11, 1) == 0, "cold cache: no hit");
    KV_CHECK(pc.n_entries == 2 && tp.n_hashed == 2, "two full blocks registered (%d)",
             pc.n_entries);
    KV_CHECK(run(&tq, q, 11, 1) == 8, "shared two blocks hit");
    KV_CHECK(tq.blocks[0] == tp.blocks[0] && tq.blocks[1] == tp.blocks[1] &&
             pool.refcount[tp.blocks[0]] == 2, "hits are the same physical blocks, shared");
    KV_CHECK(reads_back(&tq, q) && reads_back(&tp, p), "hit content is the prompt's own");
    KV_CHECK(run(&tr, r, 11, 1) == 0, "a different first block breaks the chain");
    /* the last prompt token is always computed: a fully cached 8-token prompt hits 1 block */
    kv_block_table_init(&tx, B);
    int64_t hit;
    kv_prefix_match(&pc, p, 8, &tx, &hit, &e);
    KV_CHECK(hit == 4, "8-token prompt hits %lld tokens, expected 4", (long long)hit);
    KV_CHECK(kv_prefix_match(&pc, p, 8, &tx, &hit, &e) == KV_ERR_ARG, "match needs an empty table");
    kv_block_table_release(&tx, &pool, &e);
    int used;
    KV_CHECK(kv_prefix_probe(&pc, q, 11, &used) == 2 && used == 2, "probe: 2 hits, both in use");
    /* duplicates: the same prompt computed without matching is not cached twice, and the
     * chain continues through the first copy */
    kv_block_table td, te;
    int longer[13] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33, 40};
    run(&td, longer, 13, 0);
    /* entries so far: p's two blocks and r's two; td adds only its third block */
    KV_CHECK(pc.n_entries == 5 && td.n_hashed == 3, "duplicate blocks skipped, third added "
             "(entries %d)", pc.n_entries);
    KV_CHECK(run(&te, longer, 13, 1) == 12, "longer prompt hits 3 blocks through the first copy");
    KV_CHECK(te.blocks[0] == tp.blocks[0] && te.blocks[2] == td.blocks[2] && reads_back(&te, longer),
             "hit blocks come from both sequences and read back right");
    kv_block_table *all[] = {&tp, &tq, &tr, &td, &te};
    for (int i = 0; i < 5; i++) kv_block_table_release(all[i], &pool, &e);
    KV_CHECK(pool.n_cached == pc.n_entries && pool.n_used == 0,
             "finished sequences leave their registered blocks cached (%d)", pool.n_cached);
    KV_CHECK(run(&tq, q, 11, 1) == 8 && reads_back(&tq, q), "cached blocks revive on a hit");
    kv_block_table_release(&tq, &pool, &e);
    teardown();
}

static void test_collisions(void)
{
    /* mask 0: every block has the same key, so only verification tells them apart */
    setup(0);
    kv_err e;
    int a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[9] = {2, 2, 3, 4, 5, 6, 7, 8, 9};
    int c[9] = {1, 2, 3, 4, 6, 6, 7, 8, 9};
    kv_block_table ta, tb, tc;
    run(&ta, a, 9, 1);
    KV_CHECK(run(&tb, b, 9, 1) == 0 && pc.collisions > 0, "colliding block 0 rejected (%lld)",
             (long long)pc.collisions);
    KV_CHECK(pc.n_entries == 4, "colliding blocks are all cached (%d)", pc.n_entries);
    KV_CHECK(run(&tc, c, 9, 1) == 4 && reads_back(&tc, c), "true block 0 hit, colliding "
             "block 1 rejected");
    kv_block_table_release(&ta, &pool, &e);
    kv_block_table_release(&tb, &pool, &e);
    kv_block_table_release(&tc, &pool, &e);
    teardown();

    /* parent identity: a block whose parent was evicted and whose id was reused must not
     * match, even with equal tokens and an equal (colliding) key */
    setup(0);
    int x[9] = {1, 1, 1, 1, 7, 7, 7, 7, 0}, w[9] = {2, 2, 2, 2, 7, 7, 7, 7, 0};
    int z[4] = {2, 2, 2, 2}; /* one full block, no match attempted (last token rule) */
    kv_block_table tx, th, tz, tw;
    run(&tx, x, 9, 1);
    int p0 = tx.blocks[0], p1 = tx.blocks[1];
    uint32_t gen0 = pool.gen[p0];
    kv_block_table_init(&th, B); /* hold block 1 alone, so block 0 can be evicted */
    kv_pool_ref(&pool, p1, &e);
    kv_block_table_push(&th, p1, B, &e);
    kv_block_table_release(&tx, &pool, &e);
    while (pool.n_free > 0) { /* use up FREE blocks so the next allocation reuses block 0 */
        int blk;
        kv_pool_alloc(&pool, &blk, &e);
    }
    run(&tz, z, 4, 1);
    KV_CHECK(tz.blocks[0] == p0 && pool.gen[p0] != gen0, "block %d evicted and reused (got %d)",
             p0, tz.blocks[0]);
    int64_t before = pc.collisions;
    kv_block_table_init(&tw, B);
    int64_t hit;
    kv_prefix_match(&pc, w, 9, &tw, &hit, &e);
    KV_CHECK(hit == 4 && pc.collisions > before, "stale child of a reused parent rejected "
             "(hit %lld)", (long long)hit);
    /* clean up: the filler blocks were taken bare; give them back */
    for (int blk = 0; blk < NB; blk++)
        if (pool.refcount[blk] == 1 && blk != p1 && blk != p0)
            kv_pool_unref(&pool, blk, &e);
    kv_block_table_release(&tw, &pool, &e);
    kv_block_table_release(&tz, &pool, &e);
    kv_block_table_release(&th, &pool, &e);
    teardown();
}

/* LRU list from head (next to evict) to tail */
static int lru(int *out)
{
    int n = 0;
    for (int b = pool.lru_head; b >= 0; b = pool.lru_next[b]) out[n++] = b;
    return n;
}

static void test_lru(void)
{
    setup(~0ull);
    kv_err e;
    int s[3][9];
    kv_block_table t[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 9; i++) s[k][i] = 100 * (k + 1) + i;
        run(&t[k], s[k], 9, 1);
    }
    int blk[3][2];
    for (int k = 0; k < 3; k++) {
        blk[k][0] = t[k].blocks[0];
        blk[k][1] = t[k].blocks[1];
        kv_block_table_release(&t[k], &pool, &e);
    }
    int order[NB], n = lru(order);
    int want[6] = {blk[0][1], blk[0][0], blk[1][1], blk[1][0], blk[2][1], blk[2][0]};
    KV_CHECK(n == 6 && memcmp(order, want, sizeof(want)) == 0,
             "LRU: sequences in release order, each deepest block first");
    KV_CHECK(kv_prefix_probe(&pc, s[0], 9, NULL) == 2, "A fully cached");
    /* allocation takes FREE blocks before evicting anything */
    int64_t ev = pool.n_evictions;
    kv_block_table tf;
    int f[5] = {9, 9, 9, 9, 9};
    run(&tf, f, 5, 1);
    KV_CHECK(pool.n_evictions == ev, "FREE blocks used before cached ones");
    kv_block_table_release(&tf, &pool, &e);
    kv_pool_evict_one(&pool, &e);
    KV_CHECK(kv_prefix_probe(&pc, s[0], 9, NULL) == 1, "A's deepest block evicted first");
    kv_pool_evict_one(&pool, &e);
    KV_CHECK(kv_prefix_probe(&pc, s[0], 9, NULL) == 0 && kv_prefix_probe(&pc, s[1], 9, NULL) == 2,
             "then A's first block; B untouched");
    /* a hit refreshes: B used again goes behind C */
    KV_CHECK(run(&t[1], s[1], 9, 1) == 8, "B hit");
    kv_block_table_release(&t[1], &pool, &e);
    n = lru(order);
    /* list now: C1 C0 F0 B1 B0 (F0: the full block of f, cached when f finished) */
    KV_CHECK(n == 5 && order[0] == blk[2][1] && order[3] == blk[1][1],
             "after a hit, B is most recent: C is evicted next");
    kv_pool_evict_one(&pool, &e);
    KV_CHECK(kv_prefix_probe(&pc, s[2], 9, NULL) == 1 && kv_prefix_probe(&pc, s[1], 9, NULL) == 2,
             "C loses its deepest block, B keeps both");
    KV_CHECK(pc.n_entries == pool.n_cached, "entries follow evictions (%d, %d)", pc.n_entries,
             pool.n_cached);
    teardown();
}

int main(void)
{
    test_hash();
    test_hits();
    test_collisions();
    test_lru();
    return kv_test_finish();
}
