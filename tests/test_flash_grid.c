/* Chapter 08's scheduling model of a causal grid (kv_flash_grid.h), against schedules worked by
 * hand and, for the chapter's case, an independent list-scheduling simulation (a heap of slot
 * end times in Python, blocks in the same two orders):
 *  - T 4, one query and one key a tile, one KV head, no fixed cost, 2 slots: blocks of 1, 2, 3,
 *    4 tiles. Index order: 1 and 2 start at 0, 3 on the slot free at 1 (ends 4), 4 on the slot
 *    free at 2 (ends 6): 6, balanced 5. Longest first: 4 and 3 at 0, 2 after 3 (ends 5), 1 after
 *    4 (ends 5): 5.
 *  - T 10, 4 queries a block, 3 keys a tile, 2 KV heads, 1 tile of fixed cost, 3 slots: query
 *    tiles of 4, 4, 2 queries see 4, 8, 10 keys, 2, 3, 4 key tiles, times 3, 4, 5, twice each
 *    (total 24, balanced 8). Index order 3 3 4 | 4 on the slot free at 3 (7), 5 on the other at
 *    3 (8), 5 on the one at 4 (9): 9. Longest first 5 5 4 | 4 at 4 (8), 3 at 5 (8), 3 at 5
 *    (8): 8, the balanced time.
 *  - the first grid on 8 slots: every block starts at 0, so both orders end with the longest
 *    block, at 4; balanced is that 4, not 10 / 8 (less than one wave).
 *  - the chapter's: T 4 096, 32 queries a block (128 rows / G 4), 32 keys a tile (d 128), 8 KV
 *    heads, 2 tiles of fixed cost, 132 SMs × 2: 1 024 blocks, total 8 · (8 256 + 256) = 68 096,
 *    balanced 257.94; the simulation ends index order at 322 and longest first at 259. */
#include "common/kv_test.h"

#include "kv_flash_grid.h"

static void check(const kv_flash_grid *g, int64_t blocks, int64_t total, double balanced,
                  int64_t index_end, int64_t longest_end, const char *what)
{
    kv_flash_grid_time a, b;
    kv_err e = {{0}};
    const int st = kv_flash_grid_schedule(g, 0, &a, &e) || kv_flash_grid_schedule(g, 1, &b, &e);
    KV_CHECK(st == 0, "%s: %s", what, e.msg);
    if (st) return;
    KV_CHECK(a.blocks == blocks && b.blocks == blocks && a.total == total && b.total == total,
             "%s: %lld and %lld blocks, totals %lld and %lld (expected %lld blocks, total %lld)",
             what, (long long)a.blocks, (long long)b.blocks, (long long)a.total,
             (long long)b.total, (long long)blocks, (long long)total);
    KV_CHECK(a.balanced == balanced && b.balanced == balanced, "%s: balanced %g and %g, "
             "expected %g", what, a.balanced, b.balanced, balanced);
    KV_CHECK(a.makespan == index_end, "%s: index order ends at %lld, expected %lld", what,
             (long long)a.makespan, (long long)index_end);
    KV_CHECK(b.makespan == longest_end, "%s: longest first ends at %lld, expected %lld", what,
             (long long)b.makespan, (long long)longest_end);
}

int main(void)
{
    const kv_flash_grid small = {4, 1, 1, 1, 0, 2};
    check(&small, 4, 10, 5.0, 6, 5, "T 4 on 2 slots");
    const kv_flash_grid wide = {4, 1, 1, 1, 0, 8};
    check(&wide, 4, 10, 4.0, 4, 4, "T 4 on 8 slots");
    const kv_flash_grid odd = {10, 4, 3, 2, 1, 3};
    check(&odd, 6, 24, 8.0, 9, 8, "T 10, tiles 4 and 3, on 3 slots");
    const kv_flash_grid ch08 = {4096, 32, 32, 8, 2, 132 * 2};
    check(&ch08, 1024, 68096, 68096.0 / 264, 322, 259, "chapter 08's T 4096 on 132 SMs x 2");

    kv_flash_grid_time t;
    kv_err e = {{0}};
    const kv_flash_grid no_slots = {4, 1, 1, 1, 0, 0};
    KV_CHECK(kv_flash_grid_schedule(&no_slots, 0, &t, &e) == KV_ERR_ARG,
             "no slots: not refused");
    return kv_test_finish();
}
