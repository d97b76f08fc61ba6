/*
 * kv_vocab_from_gguf(): the tokenizer.ggml.* keys of a GGUF file into a kv_vocab_desc, then
 * kv_vocab_create(). Keys, as llama.cpp reads them:
 *
 *   model, pre                         strings: which tokenizer, which pre-tokenizer
 *   tokens                             [n] strings
 *   scores                             [>= n] f32 or i32 (optional: all 0)
 *   token_type                         [>= n] i32 (optional: all normal)
 *   merges                             strings "left right" (gpt2)
 *   bos_token_id, eos_token_id,
 *   unknown_token_id                   ids (optional: the model's defaults)
 *   add_bos_token, add_eos_token,
 *   add_space_prefix                   bools (optional: the model's defaults)
 *
 * Every array is copied out of the mapping (it may be unaligned): the vocabulary outlives the
 * file.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_vocab.h"

#define KEY "tokenizer.ggml."

/* a string key into a NUL-terminated buffer; missing -> "" */
static int get_name(const kv_gguf *g, const char *key, char *buf, size_t cap, kv_err *err)
{
    buf[0] = '\0';
    if (!kv_gguf_has(g, key)) return KV_OK;
    kv_gguf_str s;
    int st = kv_gguf_get_str(g, key, &s, err);
    if (st) return st;
    if (s.n >= cap || memchr(s.s, '\0', s.n))
        return kv_fail(err, KV_ERR_FORMAT, "%s: a name of %llu bytes", key, (unsigned long long)s.n);
    memcpy(buf, s.s, s.n);
    buf[s.n] = '\0';
    return KV_OK;
}

/* an optional int key: KV_VOCAB_UNSET when missing, -1 when outside 0..INT32_MAX */
static int get_opt(const kv_gguf *g, const char *key, int *out, kv_err *err)
{
    *out = KV_VOCAB_UNSET;
    if (!kv_gguf_has(g, key)) return KV_OK;
    int64_t x;
    int st = kv_gguf_get_int(g, key, &x, err);
    if (st) return st;
    *out = x >= 0 && x <= INT32_MAX ? (int)x : -1;
    return KV_OK;
}

/* strings -> kv_vocab_str (a fresh array; NULL and 0 when the key is missing) */
static int get_strs(const kv_gguf *g, const char *key, kv_vocab_str **out, int *n, kv_err *err)
{
    *out = NULL, *n = 0;
    if (!kv_gguf_has(g, key)) return KV_OK;
    const kv_gguf_str *s;
    uint64_t count;
    int st = kv_gguf_get_strings(g, key, &s, &count, err);
    if (st) return st;
    if (count > (1u << 24)) return kv_fail(err, KV_ERR_FORMAT, "%s: %llu strings", key,
                                           (unsigned long long)count);
    *out = malloc((count + 1) * sizeof **out);
    if (!*out) return kv_fail(err, KV_ERR_NOMEM, "%s: %llu strings", key, (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) (*out)[i] = (kv_vocab_str){s[i].s, (size_t)s[i].n};
    *n = (int)count;
    return KV_OK;
}

/* a numeric array of at least n elements of one of the types allowed (a, b) */
static int get_nums(const kv_gguf *g, const char *key, int n, int a, int b, const void **data,
                    int *type, kv_err *err)
{
    *data = NULL;
    if (!kv_gguf_has(g, key)) return KV_OK;
    uint64_t count;
    int st = kv_gguf_get_array(g, key, type, &count, data, err);
    if (st) return st;
    if (*type != a && *type != b)
        return kv_fail(err, KV_ERR_FORMAT, "%s: elements of type %s", key, kv_gguf_type_name(*type));
    if (count < (uint64_t)n)
        return kv_fail(err, KV_ERR_FORMAT, "%s: %llu values for %d tokens", key,
                       (unsigned long long)count, n);
    return KV_OK;
}

int kv_vocab_from_gguf(const kv_gguf *g, kv_vocab **out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_vocab_from_gguf: out is NULL");
    *out = NULL;
    if (!g) return kv_fail(err, KV_ERR_ARG, "kv_vocab_from_gguf: no file");
    kv_vocab_desc d;
    memset(&d, 0, sizeof d);
    char model[64], pre[64];
    kv_vocab_str *tokens = NULL, *merges = NULL;
    float *scores = NULL;
    int *types = NULL;
    const void *sdata, *tdata;
    int stype = 0, ttype = 0, st;
    if (!kv_gguf_has(g, KEY "model") || !kv_gguf_has(g, KEY "tokens"))
        return kv_fail(err, KV_ERR_FORMAT, "the file has no tokenizer (" KEY "model, " KEY "tokens)");
    if ((st = get_name(g, KEY "model", model, sizeof model, err)) ||
        (st = get_name(g, KEY "pre", pre, sizeof pre, err)) ||
        (st = get_strs(g, KEY "tokens", &tokens, &d.n_tokens, err)) ||
        (st = get_strs(g, KEY "merges", &merges, &d.n_merges, err)) ||
        (st = get_nums(g, KEY "scores", d.n_tokens, KV_GGUF_F32, KV_GGUF_I32, &sdata, &stype, err)) ||
        (st = get_nums(g, KEY "token_type", d.n_tokens, KV_GGUF_I32, KV_GGUF_I32, &tdata, &ttype, err)) ||
        (st = get_opt(g, KEY "bos_token_id", &d.bos, err)) ||
        (st = get_opt(g, KEY "eos_token_id", &d.eos, err)) ||
        (st = get_opt(g, KEY "unknown_token_id", &d.unk, err)) ||
        (st = get_opt(g, KEY "add_bos_token", &d.add_bos, err)) ||
        (st = get_opt(g, KEY "add_eos_token", &d.add_eos, err)) ||
        (st = get_opt(g, KEY "add_space_prefix", &d.add_space_prefix, err)))
        goto done;
    if (sdata || tdata) {
        scores = sdata ? malloc(((size_t)d.n_tokens + 1) * sizeof *scores) : NULL;
        types = tdata ? malloc(((size_t)d.n_tokens + 1) * sizeof *types) : NULL;
        if ((sdata && !scores) || (tdata && !types)) {
            st = kv_fail(err, KV_ERR_NOMEM, KEY "scores: %d tokens", d.n_tokens);
            goto done;
        }
        for (int i = 0; i < d.n_tokens; i++) {
            if (scores) scores[i] = (float)kv_gguf_array_num(stype, sdata, (uint64_t)i);
            if (types) types[i] = (int)kv_gguf_array_num(ttype, tdata, (uint64_t)i);
        }
    }
    d.model = model;
    d.pre = pre[0] ? pre : NULL;
    d.tokens = tokens, d.merges = merges, d.scores = scores, d.types = types;
    st = kv_vocab_create(&d, out, err);
done:
    free(tokens);
    free(merges);
    free(scores);
    free(types);
    return st;
}
