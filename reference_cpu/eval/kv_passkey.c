/*
 * The pass-key test (kv_passkey.h): a prompt of a given length with a key at a given depth,
 * one greedy answer, an exact check of its digits.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_common.h"
#include "kv_generate.h"
#include "kv_passkey.h"
#include "kv_rng.h"

#define PASSKEY_ANSWER 8 /* tokens of answer: a space and five digits take at most six */
#define PASSKEY_STEP 32  /* prompt tokens a step under a hook: KIVI's key groups */

static const char *const intro =
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.";
static const char *const filler =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
static const char *const question = " What is the pass key? The pass key is";

void kv_passkey_hay_free(kv_passkey_hay *hay)
{
    if (!hay) return;
    free(hay->ids);
    memset(hay, 0, sizeof *hay);
}

int kv_passkey_filler(const kv_text_codec *tc, kv_passkey_hay *hay, kv_err *err)
{
    memset(hay, 0, sizeof *hay);
    return tc->encode(tc->ctx, filler, &hay->ids, &hay->n, err);
}

int kv_passkey_text(const kv_text_codec *tc, const char *text, kv_passkey_hay *hay, kv_err *err)
{
    memset(hay, 0, sizeof *hay);
    int rc = tc->encode(tc->ctx, text, &hay->ids, &hay->n, err);
    if (rc) return rc;
    if (hay->n < 64) {
        int n = hay->n;
        kv_passkey_hay_free(hay);
        return kv_fail(err, KV_ERR_ARG, "the haystack text holds %d tokens; it needs at least 64",
                       n);
    }
    return KV_OK;
}

int kv_passkey_key(uint64_t seed, int i)
{
    kv_rng r;
    kv_rng_seed(&r, seed * 1000003ull + (uint64_t)i);
    return 10000 + (int)(kv_rng_u32(&r) % 90000u);
}

/* out[*n ..] += the ids of text (no BOS) */
static int append_text(const kv_text_codec *tc, const char *text, int *out, int cap, int *n,
                       kv_err *err)
{
    int *ids = NULL, k = 0;
    int rc = tc->encode(tc->ctx, text, &ids, &k, err);
    if (rc) return rc;
    if (*n + k > cap) {
        free(ids);
        return kv_fail(err, KV_ERR_ARG, "the pass-key prompt's fixed parts need more than %d "
                       "tokens", cap);
    }
    memcpy(out + *n, ids, (size_t)k * sizeof(int));
    *n += k;
    free(ids);
    return KV_OK;
}

/* out[*n ..] += k haystack tokens, starting at haystack position `from` (the haystack repeats) */
static void append_hay(const kv_passkey_hay *hay, int64_t from, int k, int *out, int *n)
{
    for (int i = 0; i < k; i++) out[(*n)++] = hay->ids[(from + i) % hay->n];
}

int kv_passkey_prompt(const kv_text_codec *tc, const kv_passkey_frame *frame,
                      const kv_passkey_hay *hay, int length, double depth, int key, int **ids,
                      int *n, int *needle_at, kv_err *err)
{
    *ids = NULL;
    *n = 0;
    if (depth < 0.0 || depth > 1.0)
        return kv_fail(err, KV_ERR_ARG, "pass-key depth %g outside 0..1", depth);
    if (!hay->n) return kv_fail(err, KV_ERR_ARG, "the pass-key haystack is empty");
    char needle[160];
    snprintf(needle, sizeof needle, " The pass key is %d. Remember it. %d is the pass key.",
             key, key);
    /* the fixed parts first, into a scratch row, to learn how many tokens they take */
    const int cap = 2048;
    int fixed[2048], nf = 0, n_intro = 0, n_needle = 0;
    if (frame && frame->n_pre > cap - 1024)
        return kv_fail(err, KV_ERR_ARG, "the pass-key frame's %d tokens before the intro are "
                       "too many", frame->n_pre);
    if (frame) {
        memcpy(fixed, frame->pre, (size_t)frame->n_pre * sizeof(int));
        nf = frame->n_pre;
    } else if (tc->bos >= 0) {
        fixed[nf++] = tc->bos;
    }
    int rc = append_text(tc, intro, fixed, cap, &nf, err);
    n_intro = nf;
    if (!rc) rc = append_text(tc, needle, fixed, cap, &nf, err);
    n_needle = nf - n_intro;
    if (!rc) rc = append_text(tc, frame ? frame->question : question, fixed, cap, &nf, err);
    if (!rc && frame) {
        if (nf + frame->n_post > cap)
            return kv_fail(err, KV_ERR_ARG, "the pass-key frame's %d tokens after the question "
                           "are too many", frame->n_post);
        memcpy(fixed + nf, frame->post, (size_t)frame->n_post * sizeof(int));
        nf += frame->n_post;
    }
    if (rc) return rc;
    const int h = length - nf; /* haystack tokens */
    if (h < 1)
        return kv_fail(err, KV_ERR_ARG, "a pass-key prompt of %d tokens cannot hold its intro, "
                       "needle and question (%d tokens) and a haystack", length, nf);
    const int a = (int)(depth * h + 0.5); /* haystack tokens before the needle */
    int *out = malloc((size_t)length * sizeof(int));
    if (!out) return kv_fail(err, KV_ERR_NOMEM, "pass-key prompt of %d tokens", length);
    int k = 0;
    memcpy(out, fixed, (size_t)n_intro * sizeof(int));
    k = n_intro;
    append_hay(hay, 0, a, out, &k);
    *needle_at = k;
    memcpy(out + k, fixed + n_intro, (size_t)n_needle * sizeof(int));
    k += n_needle;
    append_hay(hay, a, h - a, out, &k);
    memcpy(out + k, fixed + n_intro + n_needle, (size_t)(nf - n_intro - n_needle) * sizeof(int));
    k += nf - n_intro - n_needle;
    *ids = out;
    *n = k; /* == length */
    return KV_OK;
}

int kv_passkey_match(const char *answer, int key)
{
    char want[16];
    snprintf(want, sizeof want, "%d", key);
    const char *p = answer;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    const size_t w = strlen(want);
    return strncmp(p, want, w) == 0 && !isdigit((unsigned char)p[w]);
}

int kv_passkey_run(kv_backend *b, const kv_text_codec *tc, const kv_passkey_frame *frame,
                   const kv_passkey_hay *hay, int length, double depth, int key,
                   kv_passkey_result *res, kv_err *err)
{
    return kv_passkey_run_hooked(b, tc, frame, hay, length, depth, key, NULL, NULL, res, err);
}

int kv_passkey_run_hooked(kv_backend *b, const kv_text_codec *tc, const kv_passkey_frame *frame,
                          const kv_passkey_hay *hay, int length, double depth, int key,
                          kv_passkey_step_fn before_step, void *hook, kv_passkey_result *res,
                          kv_err *err)
{
    memset(res, 0, sizeof *res);
    res->key = key;
    int *prompt = NULL, n = 0;
    int rc = kv_passkey_prompt(tc, frame, hay, length, depth, key, &prompt, &n, &res->needle_at,
                               err);
    if (rc) return rc;
    res->n_prompt = n;
    const double t0 = kv_now();
    b->reset(b, 0);
    int out[PASSKEY_ANSWER], n_out = 0;
    /* under a hook the prompt goes 32 tokens a step, so a KIVI emulation's spills fall where
     * the cache's would; the answer one token a step either way */
    kv_gen_opts o = {KV_MODE_CACHED, 0, PASSKEY_ANSWER, NULL, NULL, NULL, NULL, tc->stop,
                     tc->n_stop, before_step, hook, before_step ? PASSKEY_STEP : 0};
    rc = kv_generate_stop(b, prompt, n, &o, out, &n_out, NULL, err);
    free(prompt);
    if (rc) return rc;
    res->seconds = kv_now() - t0;
    /* the answer's text, without the stop token */
    size_t len = 0;
    int prev = -1;
    for (int i = 0; i < n_out; i++) {
        int is_stop = 0;
        for (int s = 0; s < tc->n_stop; s++) is_stop |= out[i] == tc->stop[s];
        if (is_stop) break;
        char piece[64];
        int k = tc->piece(tc->ctx, prev, out[i], piece, (int)sizeof piece);
        prev = out[i];
        if (k < 0) k = 0;
        if (len + (size_t)k >= sizeof res->answer) k = (int)(sizeof res->answer - 1 - len);
        memcpy(res->answer + len, piece, (size_t)k);
        len += (size_t)k;
    }
    res->answer[len] = '\0';
    res->found = kv_passkey_match(res->answer, key);
    return KV_OK;
}
