/* Chapters 05 and 07 on a trained model (SmolLM2-135M-Instruct; realmodel, 77 when it is
 * absent): the scheduler serving prompts of real text, tokenized by the model's own tokenizer
 * and rendered in its chat template (kv_trace_set_prompts()).
 *
 * Predicted before measured:
 *  - every request's greedy tokens are those kv_generate() picks for its prompt alone, under
 *    continuous batching with a pool too small for all of them at once, whether a preempted
 *    request is recomputed or swapped to the host and back: batching, preemption and paging
 *    change where the rows live, not their values;
 *  - the pool holds the three prompts but not their growth (arriving together, each grows by
 *    a block at least): at least one preemption happens in each of those runs;
 *  - the prompts all open with the template's system message, so with prefix caching on
 *    and requests that arrive after the first is prefilled, each later request adopts the
 *    system message's whole blocks: at least floor(S / B) * B tokens each, S the tokens
 *    every prompt shares and B the block size.
 */
#include "common/kv_test.h"
#include "common/kv_test_chat_model.h"
#include "common/kv_test_model.h"

#include "kv_chat.h"
#include "kv_generate.h"
#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_sched.h"
#include "kv_trace.h"
#include "kv_vocab.h"

#include <stdlib.h>
#include <string.h>

#define NP 3    /* prompts */
#define OUT 18  /* tokens each: every request grows by a block at least (len + 17 rows) */
#define CAP 96  /* a prompt's ids at most */
#define BLOCK 16

static const char *const MESSAGES[NP] = {
    "What is the capital of France?",
    "Give me one tip for sleeping better.",
    "Summarise this text:\n\nFor unto which of the angels said he at any time, Thou art my Son, "
    "this day have I begotten thee?",
};

/* Arrivals: the first at 0, the others once it is prefilled (20 ms steps); or all at 0
 * (burst) where the pool is to run out. */
static const char TRACE[] = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n"
                            "0,1,18,1,1,-1\n0.1,1,18,1,1,-1\n0.2,1,18,1,1,-1\n";

static kv_backend *paged(const kv_model *m, int n_blocks, int prefix)
{
    kv_cache_spec spec = kv_cache_spec_default(NP, CAP + OUT);
    spec.layout.kind = KV_LAYOUT_PAGED;
    spec.layout.block_size = BLOCK;
    spec.layout.n_blocks = n_blocks;
    kv_backend *b = NULL;
    kv_err e = {{0}};
    int st = kv_backend_cpu(&b, m, &spec, &e);
    if (!st && prefix) st = kv_backend_enable_prefix_cache(b, &e);
    KV_CHECK(st == KV_OK, "paged backend: %s", e.msg);
    return st ? NULL : b;
}

/* One run of the trace; the tokens checked against want [NP][OUT]. */
static kv_sched_metrics serve(const kv_model *m, const kv_trace *t, int n_blocks, int prefix,
                              int preempt, const int (*want)[OUT], const char *what)
{
    kv_sched_metrics x = {0};
    kv_backend *b = paged(m, n_blocks, prefix);
    if (!b) return x;
    kv_sched_opts o = kv_sched_opts_default();
    o.preempt = preempt;
    o.max_len = CAP + OUT;
    o.burst = !prefix;
    o.watermark = 0.0;
    kv_sched_out out = {0};
    kv_err e = {{0}};
    const int st = kv_sched_run(b, t, NP, &o, &out, &e);
    KV_CHECK(st == KV_OK && out.m.n_done == NP, "%s: %d of %d done: %s", what, out.m.n_done, NP,
             st ? e.msg : (out.n ? out.results[0].error : ""));
    for (int i = 0; !st && i < out.n; i++) {
        const int q = out.index[i];
        KV_CHECK(out.results[i].status == KV_OK &&
                     !memcmp(out.results[i].tokens, want[q], sizeof want[q]),
                 "%s: request %d's tokens differ from its prompt generated alone", what, q);
    }
    x = out.m;
    printf("%s: %lld preemptions, prefix-cache hits %lld of %lld prompt tokens\n", what,
           (long long)x.preemptions, (long long)x.prefix_hit_tokens, (long long)x.prompt_tokens);
    kv_sched_out_free(&out);
    kv_backend_destroy(b);
    return x;
}

int main(void)
{
    char path[4096];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_test_chat c;
    kv_trace t = {0};
    kv_err e = {{0}};
    static int ids[NP][CAP];
    const int *rows[NP] = {ids[0], ids[1], ids[2]};
    int len[NP] = {0};
    int st = kv_test_chat_open(path, &c, &e);
    for (int i = 0; i < NP && !st; i++)
        st = kv_chat_render_prompt(&c.t, c.v, NULL, MESSAGES[i], strlen(MESSAGES[i]), ids[i], CAP,
                                   &len[i], &e);
    if (!st) st = kv_trace_parse(TRACE, &t, &e);
    if (!st) st = kv_trace_set_prompts(&t, rows, len, NP, &e);
    KV_CHECK(st == KV_OK, "model, prompts and trace: %s", e.msg);
    if (st) goto done;
    /* the tokens every prompt shares: the system message and the user header */
    int shared = 0;
    while (shared < len[0] && shared < len[1] && shared < len[2] &&
           ids[0][shared] == ids[1][shared] && ids[0][shared] == ids[2][shared])
        shared++;
    int want[NP][OUT], blocks_all = 0;
    for (int i = 0; i < NP && !st; i++) {
        kv_backend *one = paged(&c.m, (CAP + OUT) / BLOCK + 1, 0);
        const kv_gen_opts go = {KV_MODE_CACHED, 0, OUT, NULL, NULL, NULL, NULL};
        st = one ? kv_generate(one, ids[i], len[i], &go, want[i], NULL, &e) : KV_ERR_ARG;
        KV_CHECK(st == KV_OK, "prompt %d alone: %s", i, e.msg);
        kv_backend_destroy(one);
        blocks_all += (len[i] + OUT + BLOCK - 1) / BLOCK;
    }
    if (st) goto done;
    printf("prompts of %d, %d and %d tokens, %d shared; %d blocks hold them all\n", len[0],
           len[1], len[2], shared, blocks_all);
    /* a pool of the three prompts' blocks: all three are admitted at once, and each grows by
     * a block at least, so one is preempted; the longest request alone fits */
    int small = 0, longest = 0;
    for (int i = 0; i < NP; i++) {
        small += (len[i] + BLOCK - 1) / BLOCK;
        const int alone = (len[i] + OUT - 1 + BLOCK - 1) / BLOCK;
        longest = alone > longest ? alone : longest;
    }
    KV_CHECK(small < blocks_all && longest <= small, "the small pool (%d blocks) holds all %d, "
             "or not the longest request (%d)", small, blocks_all, longest);
    kv_sched_metrics x = serve(&c.m, &t, small, 0, KV_PREEMPT_RECOMPUTE, want, "recompute");
    KV_CHECK(x.preemptions > 0, "recompute: no preemption in a pool of %d blocks", small);
    x = serve(&c.m, &t, small, 0, KV_PREEMPT_SWAP, want, "swap");
    KV_CHECK(x.preemptions > 0 && x.swap_blocks_out > 0 && x.swap_blocks_in == x.swap_blocks_out,
             "swap: %lld preemptions, %lld blocks out, %lld in", (long long)x.preemptions,
             (long long)x.swap_blocks_out, (long long)x.swap_blocks_in);
    x = serve(&c.m, &t, 4 * blocks_all, 1, KV_PREEMPT_RECOMPUTE, want, "prefix cache");
    KV_CHECK(shared >= BLOCK && x.prefix_hit_tokens >= (NP - 1) * (shared / BLOCK * BLOCK),
             "prefix cache: %lld tokens adopted, at least %d expected (%d shared)",
             (long long)x.prefix_hit_tokens, (NP - 1) * (shared / BLOCK * BLOCK), shared);
done:
    kv_trace_free(&t);
    kv_test_chat_close(&c);
    return kv_test_finish();
}
