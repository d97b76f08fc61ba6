/* Chapter 07: the dialogue suite with the conversation swapped out between every turn.
 *
 * A chat server pauses a conversation while its user types; its cache may go to host memory
 * meanwhile. Predicted before measured: a swap copies every byte of every block out and back,
 * so the next turn reads exactly the rows it would have read, and every turn of every dialogue
 * in datasets/dialogues, on both recall models (direct and induction), gives the same reply,
 * the same margin and the same logits, bit for bit (memcmp), as the run that never swapped.
 *
 * The runs go through kv_dialogue_run_hooked(); its hook, called after each turn, moves the
 * session's cache:
 *  - whole: kv_swap_out of the session's slot, then kv_swap_in into the other slot (the
 *    session follows it), so the turn after reads its history from other physical blocks of
 *    another slot; checked: the slot is empty and its blocks back in the pool while it is out;
 *  - partial: kv_swap_detach (nothing moves), kv_swap_evict of half its blocks (last ones
 *    first), kv_swap_prefetch, kv_swap_in into the other slot.
 * Between out and in every free device block is overwritten with 0xff bytes (NaN in fp32), so
 * only bytes the swap-in really copied back can be read.
 * Paged CPU backends, fp32 and int8 (per-token formats, which kv_swap moves), blocks of 16
 * (fp32) and 8 (int8) tokens. At the end no block is held in either tier.
 *
 *   test_swap_dialogue DATASETS/dialogues  */
#include "common/kv_test.h"
#include "common/kv_test_data.h"

#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kv_swap.h"

#include <stdlib.h>
#include <string.h>

static const char *const FILES[] = {"early-facts.dlg", "interleaved.dlg", "long-filler.dlg",
                                    "dense.dlg", "shared-values.dlg", "boundaries.dlg"};
#define N_FILES 6

enum { MODE_NONE = 0, MODE_WHOLE = 1, MODE_PARTIAL = 2 };
static const char *const MODE_NAMES[] = {"none", "whole", "partial"};

/* What the hook needs and what it records. */
typedef struct {
    int mode;
    kv_swap *sw;
    float *logits;  /* [n_turns][V] the logits that chose each turn's reply */
    int V;
    int swaps;      /* round trips made */
    int64_t evicted; /* partial: blocks moved to the host by kv_swap_evict */
    int emptied;    /* 1 while every swap-out left its slot empty and its blocks free */
    uint8_t *garbage; /* [block_bytes] 0xff: NaN in fp32, what a free block holds meanwhile */
} hook_ctx;

static int on_turn(void *user, kv_session *s, int t, kv_err *err)
{
    hook_ctx *h = user;
    memcpy(h->logits + (size_t)t * h->V, s->logits, sizeof(float) * (size_t)h->V);
    if (h->mode == MODE_NONE) return KV_OK;
    kv_backend *b = s->b;
    const int used = b->mem->paged->pool.n_used, held = b->mem->paged->tables[s->slot].n_blocks;
    kv_swapped out = {0};
    int rc;
    if (h->mode == MODE_WHOLE) {
        rc = kv_swap_out(h->sw, b->mem, s->slot, &out, err);
        if (rc) return rc;
        h->emptied &= b->length(b, s->slot) == 0 && b->mem->paged->pool.n_used == used - held &&
                      out.n_tokens == s->n_history;
    } else {
        rc = kv_swap_detach(h->sw, b->mem, s->slot, &out, err);
        int moved = 0;
        if (!rc) rc = kv_swap_evict(h->sw, b->mem, &out, (held + 1) / 2, &moved, err);
        if (!rc) {
            h->evicted += moved;
            h->emptied &= b->length(b, s->slot) == 0 && moved == (held + 1) / 2 &&
                          b->mem->paged->pool.n_used == used - moved;
            rc = kv_swap_prefetch(h->sw, b->mem, &out, err);
        }
        if (rc) {
            kv_swapped_drop(h->sw, b->mem, &out);
            return rc;
        }
    }
    /* Freed blocks keep their bytes and the pool hands the last freed out first, so a swap-in
     * that copied nothing could still read the old rows: overwrite every free block first. */
    for (int blk = 0; blk < b->mem->paged->pool.n_blocks; blk++) {
        kv_block_copy poison = {0, blk};
        if (b->mem->paged->pool.refcount[blk] == 0 &&
            (rc = b->mem->write_blocks(b->mem, &poison, 1, h->garbage, h->sw->pool.block_bytes,
                                       err))) {
            kv_swapped_drop(h->sw, b->mem, &out);
            return rc;
        }
    }
    s->slot = 1 - s->slot; /* come back into the other slot */
    rc = kv_swap_in(h->sw, b->mem, s->slot, &out, err);
    if (rc) {
        kv_swapped_drop(h->sw, b->mem, &out);
        return rc;
    }
    h->swaps++;
    return b->length(b, s->slot) == s->n_history
               ? KV_OK
               : kv_fail(err, KV_ERR_ARG, "turn %d: %d tokens back, %d expected", t + 1,
                         b->length(b, s->slot), s->n_history);
}

/* One dialogue on a fresh paged backend (2 slots, host tier as large as the pool). */
static int run(const kv_model *m, const kv_dialogue *d, int kind, const char *variant, int B,
               int mode, kv_dlg_result *res, float *logits, hook_ctx *h, kv_err *e)
{
    kv_cache_spec sp;
    kv_backend *b = NULL;
    kv_swap sw = {0};
    int rc = kv_needle_cache_spec(variant, 2, kv_dialogue_length(d, kind), &sp, e);
    if (!rc) {
        sp.layout.kind = KV_LAYOUT_PAGED;
        sp.layout.block_size = B;
        sp.layout.n_blocks = sp.n_slots * ((sp.capacity + B - 1) / B);
        rc = kv_backend_cpu(&b, m, &sp, e);
    }
    if (!rc) rc = kv_swap_init(&sw, b->mem, sp.layout.n_blocks, NULL, e);
    memset(h, 0, sizeof *h);
    h->mode = mode;
    h->sw = &sw;
    h->logits = logits;
    h->V = m->config.vocab_size;
    h->emptied = 1;
    if (!rc) {
        h->garbage = malloc(sw.pool.block_bytes);
        if (!h->garbage) rc = kv_fail(e, KV_ERR_NOMEM, "garbage block");
        else memset(h->garbage, 0xff, sw.pool.block_bytes);
    }
    if (!rc) rc = kv_dialogue_run_hooked(b, d, kind, 0, on_turn, h, res, e);
    free(h->garbage);
    h->garbage = NULL;
    if (b) {
        /* release the slots the session used: then nothing is held in either tier */
        b->reset(b, 0);
        b->reset(b, 1);
        int leaks[4];
        KV_CHECK(kv_pool_check_leaks(&b->mem->paged->pool, leaks, 4) == 0 &&
                     kv_pool_validate(&b->mem->paged->pool, e) == KV_OK,
                 "%s %s: device pool leaks or is inconsistent", d->name, MODE_NAMES[mode]);
        KV_CHECK(sw.pool.n_used == 0 && kv_pool_validate(&sw.pool, e) == KV_OK,
                 "%s %s: host tier holds %d blocks after the run", d->name, MODE_NAMES[mode],
                 sw.pool.n_used);
    }
    h->sw = NULL;
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_swap_dialogue DATASETS/dialogues [--quick]\n");
        return 2;
    }
    /* --quick (the sanitizer builds, 10-40x slower): the first two dialogues only, one of
     * them with the int8 cache too; every mode and model still runs */
    const int quick = argc > 2 && strcmp(argv[2], "--quick") == 0;
    if (quick) printf("quick: dialogues 1-2 of %d\n", N_FILES);
    const double t0 = kv_now();
    kv_model models[2];
    kv_err e;
    if (kv_test_recall_models(models)) return kv_test_finish();
    static const struct { const char *variant; int B; } caches[] = {{"fp32", 16}, {"int8", 8}};
    for (int f = 0; f < N_FILES; f++) {
        if (quick && f >= 2) break;
        kv_dialogue d;
        if (kv_test_dialogue_read(argv[1], FILES[f], &d)) continue;
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < 2; c++) {
                if (c == 1 && f % 2) continue; /* int8 on every other dialogue: time */
                const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
                const int V = models[k].config.vocab_size;
                kv_dlg_result *ref = calloc(d.n_turns, sizeof *ref);
                kv_dlg_result *res = calloc(d.n_turns, sizeof *res);
                float *lref = malloc(sizeof(float) * (size_t)d.n_turns * V);
                float *lres = malloc(sizeof(float) * (size_t)d.n_turns * V);
                hook_ctx h;
                int rc = run(&models[k], &d, kind, caches[c].variant, caches[c].B, MODE_NONE,
                             ref, lref, &h, &e);
                KV_CHECK(rc == KV_OK, "%s unswapped: %s", FILES[f], e.msg);
                for (int mode = MODE_WHOLE; mode <= MODE_PARTIAL && !rc; mode++) {
                    int r2 = run(&models[k], &d, kind, caches[c].variant, caches[c].B, mode, res,
                                 lres, &h, &e);
                    KV_CHECK(r2 == KV_OK, "%s %s swap: %s", FILES[f], MODE_NAMES[mode], e.msg);
                    if (r2) continue;
                    int pass = 0, same = 0;
                    for (int t = 0; t < d.n_turns; t++) {
                        pass += res[t].pass;
                        same += res[t].reply == ref[t].reply && res[t].cached == ref[t].cached &&
                                !memcmp(&res[t].margin, &ref[t].margin, sizeof(float)) &&
                                !memcmp(lres + (size_t)t * V, lref + (size_t)t * V,
                                        sizeof(float) * (size_t)V);
                    }
                    KV_CHECK(pass == d.n_turns && same == d.n_turns,
                             "%s (%s) %s, %s swaps: %d of %d turns pass, %d identical to the "
                             "unswapped run", FILES[f], kv_recall_kind_name(kind),
                             caches[c].variant, MODE_NAMES[mode], pass, d.n_turns, same);
                    KV_CHECK(h.swaps == d.n_turns && h.emptied,
                             "%s %s: %d swaps for %d turns; swapped-out slots empty and their "
                             "blocks freed: %s", FILES[f], MODE_NAMES[mode], h.swaps, d.n_turns,
                             h.emptied ? "yes" : "no");
                    if (mode == MODE_PARTIAL)
                        KV_CHECK(h.evicted > 0, "%s: partial swaps moved blocks", FILES[f]);
                    printf("%-18s %-9s %-4s B=%-2d %-7s swaps: %2d/%2d turns pass, %2d identical "
                           "(reply, margin, logits bit for bit), %4d tokens\n", FILES[f],
                           kv_recall_kind_name(kind), caches[c].variant, caches[c].B,
                           MODE_NAMES[mode], pass, d.n_turns, same, res[d.n_turns - 1].cached);
                }
                free(ref);
                free(res);
                free(lref);
                free(lres);
            }
        kv_dialogue_free(&d);
    }
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
    printf("test_swap_dialogue: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
