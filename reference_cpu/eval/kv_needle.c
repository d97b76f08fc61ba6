/* The needle grid (kv_needle.h): spec files, haystacks, running a context through a
 * kv_backend, and the pass rule. */
#include "kv_needle.h"
#include "kv_file.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kv_sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- specs ------------------------------------------------------------------------------ */

void kv_needle_spec_default(kv_needle_spec *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "default");
    s->n_models = 2;
    s->models[0] = KV_MODEL_RECALL_DIRECT;
    s->models[1] = KV_MODEL_RECALL_INDUCTION;
    s->n_lengths = 2;
    s->lengths[0] = 1024;
    s->lengths[1] = 4096;
    s->n_depths = 5;
    for (int i = 0; i < 5; i++) s->depths[i] = 25 * i;
    s->n_variants = 1;
    snprintf(s->variants[0].spec, sizeof s->variants[0].spec, "fp32");
    s->variants[0].rule = KV_EXPECT_ALL;
    s->n_seeds = 1;
    s->seeds[0] = 1;
    s->model_seed = 1;
}

int kv_needle_variant_parse(const char *spec, const char *rule, kv_needle_variant *v, kv_err *err)
{
    memset(v, 0, sizeof *v);
    if (!spec || !*spec || strlen(spec) >= sizeof v->spec)
        return kv_fail(err, KV_ERR_ARG, "cache variant '%s': empty or longer than %d characters",
                       spec ? spec : "", (int)sizeof v->spec - 1);
    snprintf(v->spec, sizeof v->spec, "%s", spec);
    if (!rule || !strcmp(rule, "all")) v->rule = KV_EXPECT_ALL;
    else if (!strcmp(rule, "none")) v->rule = KV_EXPECT_NONE;
    else if (!strcmp(rule, "any")) v->rule = KV_EXPECT_ANY;
    else if (!strncmp(rule, "within:", 7)) {
        v->rule = KV_EXPECT_WITHIN;
        if (kv_parse_count(rule + 7, 0, 1L << 30, &v->arg))
            return kv_fail(err, KV_ERR_ARG, "cache variant '%s': bad distance in '%s'", spec, rule);
    } else if (!strncmp(rule, "kept:", 5) || !strncmp(rule, "atleast:", 8)) {
        /* chapter 09: "kept:E,W" -- before position E or within W tokens of the question */
        const int kept = rule[0] == 'k';
        char a[32], *comma;
        /* a longer value would be cut by the copy and its tail ignored: refuse it whole */
        if (snprintf(a, sizeof a, "%s", rule + (kept ? 5 : 8)) >= (int)sizeof a)
            return kv_fail(err, KV_ERR_ARG, "cache variant '%s': '%.40s' is too long", spec, rule);
        comma = strchr(a, ',');
        if (comma) *comma = 0;
        v->rule = kept ? KV_EXPECT_KEPT : KV_EXPECT_ATLEAST;
        if (!comma || kv_parse_count(a, 0, 1L << 30, &v->arg) ||
            kv_parse_count(comma + 1, 0, 1L << 30, &v->arg2))
            return kv_fail(err, KV_ERR_ARG, "cache variant '%s': '%s' needs two numbers E,W",
                           spec, rule);
    } else if (!strncmp(rule, "from:", 5)) {
        v->rule = KV_EXPECT_FROM;
        if (kv_parse_count(rule + 5, 0, 1L << 30, &v->arg))
            return kv_fail(err, KV_ERR_ARG, "cache variant '%s': bad position in '%s'", spec,
                           rule);
    } else if (!strncmp(rule, "page-split:", 11)) {
        v->rule = KV_EXPECT_PAGE_SPLIT;
        if (kv_parse_count(rule + 11, 1, 1L << 20, &v->arg))
            return kv_fail(err, KV_ERR_ARG, "cache variant '%s': bad page size in '%s'", spec,
                           rule);
    } else
        return kv_fail(err, KV_ERR_ARG, "cache variant '%s': unknown prediction '%s' "
                       "(all, none, any, within:W, kept:E,W, atleast:E,W, page-split:P, "
                       "from:E)", spec, rule);
    return KV_OK;
}

int kv_needle_spec_parse(const char *text, kv_needle_spec *s, kv_err *err)
{
    if (!text || !s) return kv_fail(err, KV_ERR_ARG, "kv_needle_spec_parse: NULL argument");
    int line_no = 0, variants_seen = 0;
    int rc = kv_text_check_lines(text, err); /* CR-only endings would make one long line */
    if (rc) return rc;
    const char *p = text;
    while (*p) {
        char line[1024];
        size_t n = strcspn(p, "\n");
        line_no++;
        if (n >= sizeof line) return kv_fail(err, KV_ERR_FORMAT, "line %d: too long", line_no);
        memcpy(line, p, n);
        line[n] = 0;
        p += n + (p[n] == '\n');
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *words[40];
        int nw = 0;
        for (char *t = strtok(line, " \t\r"); t; t = strtok(NULL, " \t\r")) {
            if (nw == 40) return kv_fail(err, KV_ERR_FORMAT, "line %d: too many words", line_no);
            words[nw++] = t;
        }
        if (nw == 0) continue;
        const char *key = words[0];
        if (nw < 2) return kv_fail(err, KV_ERR_FORMAT, "line %d: '%s' needs a value", line_no, key);
        if (!strcmp(key, "name")) {
            if (nw > 2) /* the rest of the line would be dropped without a word */
                return kv_fail(err, KV_ERR_FORMAT, "line %d: name takes one word, not %d",
                               line_no, nw - 1);
            snprintf(s->name, sizeof s->name, "%s", words[1]);
        } else if (!strcmp(key, "models")) {
            if (nw - 1 > 2) return kv_fail(err, KV_ERR_FORMAT, "line %d: at most 2 models", line_no);
            s->n_models = 0;
            for (int i = 1; i < nw; i++) {
                int k = kv_recall_kind_parse(words[i]);
                if (k < 0)
                    return kv_fail(err, KV_ERR_FORMAT, "line %d: unknown model '%s' (direct, "
                                   "induction)", line_no, words[i]);
                s->models[s->n_models++] = k;
            }
        } else if (!strcmp(key, "lengths") || !strcmp(key, "depths") || !strcmp(key, "seeds")) {
            const int is_len = key[0] == 'l', is_depth = key[0] == 'd';
            const int max = is_len ? KV_NEEDLE_MAX_LENGTHS : is_depth ? KV_NEEDLE_MAX_DEPTHS
                                                                      : KV_NEEDLE_MAX_SEEDS;
            if (nw - 1 > max)
                return kv_fail(err, KV_ERR_FORMAT, "line %d: at most %d %s", line_no, max, key);
            for (int i = 1; i < nw; i++) {
                long v;
                const long lo = is_len ? 16 : 0, hi = is_len ? (1L << 24) : is_depth ? 100 : (1L << 30);
                if (kv_parse_count(words[i], lo, hi, &v))
                    return kv_fail(err, KV_ERR_FORMAT, "line %d: %s: '%s' is not an integer in "
                                   "[%ld, %ld]", line_no, key, words[i], lo, hi);
                if (is_len) s->lengths[i - 1] = (int)v;
                else if (is_depth) s->depths[i - 1] = (int)v;
                else s->seeds[i - 1] = (uint64_t)v;
            }
            if (is_len) s->n_lengths = nw - 1;
            else if (is_depth) s->n_depths = nw - 1;
            else s->n_seeds = nw - 1;
        } else if (!strcmp(key, "model-seed")) {
            long v;
            if (nw > 2)
                return kv_fail(err, KV_ERR_FORMAT, "line %d: model-seed takes one number, not %d "
                               "words", line_no, nw - 1);
            if (kv_parse_count(words[1], 0, 1L << 30, &v))
                return kv_fail(err, KV_ERR_FORMAT, "line %d: bad model-seed '%s'", line_no, words[1]);
            s->model_seed = (uint64_t)v;
        } else if (!strcmp(key, "chunk")) {
            long v;
            if (nw > 2)
                return kv_fail(err, KV_ERR_FORMAT, "line %d: chunk takes one number, not %d words",
                               line_no, nw - 1);
            if (kv_parse_count(words[1], 1, 1L << 24, &v))
                return kv_fail(err, KV_ERR_FORMAT, "line %d: bad chunk '%s' (tokens per "
                               "prefill step, >= 1)", line_no, words[1]);
            s->chunk = (int)v;
        } else if (!strcmp(key, "variant")) {
            if (nw > 3)
                return kv_fail(err, KV_ERR_FORMAT, "line %d: variant SPEC [PREDICTION]", line_no);
            if (!variants_seen) s->n_variants = 0; /* the file's variants replace the default */
            variants_seen = 1;
            if (s->n_variants == KV_NEEDLE_MAX_VARIANTS)
                return kv_fail(err, KV_ERR_FORMAT, "line %d: at most %d variants", line_no,
                               KV_NEEDLE_MAX_VARIANTS);
            kv_err e2;
            if (kv_needle_variant_parse(words[1], nw > 2 ? words[2] : NULL,
                                        &s->variants[s->n_variants], &e2))
                return kv_fail(err, KV_ERR_FORMAT, "line %d: %s", line_no, e2.msg);
            s->n_variants++;
        } else {
            return kv_fail(err, KV_ERR_FORMAT, "line %d: unknown field '%s' (name, models, "
                           "lengths, depths, variant, seeds, model-seed, chunk)", line_no, key);
        }
    }
    return KV_OK;
}

int kv_needle_spec_read(const char *path, kv_needle_spec *s, kv_err *err)
{
    char *buf;
    int rc = kv_file_read_text(path, KV_NEEDLE_MAX_BYTES, &buf, NULL, err);
    if (rc) return rc;
    kv_err e2;
    rc = kv_needle_spec_parse(buf, s, &e2);
    free(buf);
    if (rc) return kv_fail(err, rc, "%s: %s", path, e2.msg);
    return KV_OK;
}

/* ---- haystacks -------------------------------------------------------------------------- */

int kv_needle_build(int kind, int length, const int *depths, int n, uint64_t seed, int *tokens,
                    kv_needle_item *items, kv_err *err)
{
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    int tmp[2];
    const int nt = kv_recall_fact_tokens(&v, kind, 0, 0, tmp);
    if (nt < 0) return kv_fail(err, KV_ERR_ARG, "needle: unknown model kind %d", kind);
    if (n < 1 || n > KV_NEEDLE_MAX_DEPTHS)
        return kv_fail(err, KV_ERR_ARG, "needle: %d depths (1..%d: one key each)", n,
                       KV_NEEDLE_MAX_DEPTHS);
    if (length < 1 + n * nt)
        return kv_fail(err, KV_ERR_ARG, "needle: %d tokens cannot hold BOS and %d needles of "
                       "%d tokens", length, n, nt);
    kv_rng r;
    kv_rng_seed(&r, seed);
    /* distinct keys: the first n of a seeded permutation */
    int keys[KV_RECALL_KEYS];
    for (int i = 0; i < KV_RECALL_KEYS; i++) keys[i] = i;
    for (int i = KV_RECALL_KEYS - 1; i > 0; i--) {
        int j = (int)(kv_rng_u32(&r) % (uint32_t)(i + 1)), t = keys[i];
        keys[i] = keys[j];
        keys[j] = t;
    }
    tokens[0] = v.bos;
    for (int i = 1; i < length; i++) tokens[i] = v.filler0 + (int)(kv_rng_u32(&r) % v.n_fillers);

    /* ideal positions, then placed in order of position without overlap */
    int order[KV_NEEDLE_MAX_DEPTHS];
    const int span = length - 1 - nt; /* first token in [1, 1 + span] */
    for (int i = 0; i < n; i++) {
        if (depths[i] < 0 || depths[i] > 100)
            return kv_fail(err, KV_ERR_ARG, "needle: depth %d%% outside 0..100", depths[i]);
        items[i].depth = depths[i];
        items[i].key = keys[i];
        items[i].value = (int)(kv_rng_u32(&r) % v.n_values);
        items[i].n_tokens = nt;
        items[i].pos = 1 + (int)((double)depths[i] / 100.0 * span + 0.5);
        order[i] = i;
    }
    for (int i = 1; i < n; i++) /* insertion sort by position, stable */
        for (int j = i; j > 0 && items[order[j]].pos < items[order[j - 1]].pos; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 1; i < n; i++) { /* push forward past the previous needle */
        kv_needle_item *a = &items[order[i - 1]], *b = &items[order[i]];
        if (b->pos < a->pos + nt) b->pos = a->pos + nt;
    }
    for (int i = n - 1; i >= 0; i--) { /* and back from the end if that overflowed */
        kv_needle_item *b = &items[order[i]];
        int limit = (i == n - 1) ? 1 + span : items[order[i + 1]].pos - nt;
        if (b->pos > limit) b->pos = limit;
    }
    for (int i = 0; i < n; i++) {
        int ft[2];
        kv_recall_fact_tokens(&v, kind, items[i].key, items[i].value, ft);
        for (int j = 0; j < nt; j++) tokens[items[i].pos + j] = ft[j];
    }
    return KV_OK;
}

/* ---- running ---------------------------------------------------------------------------- */

int kv_needle_run(kv_backend *b, int slot, int kind, const int *tokens, int length,
                  const kv_needle_item *items, int n_items, int chunk, kv_needle_result *res,
                  kv_needle_progress cb, void *user, long done0, long total, kv_err *err)
{
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    const int V = b->config->vocab_size;
    if (V != v.vocab_size)
        return kv_fail(err, KV_ERR_ARG, "needle: model vocabulary %d is not the recall "
                       "vocabulary (%d)", V, v.vocab_size);
    if (b->spec.capacity < length + 2 * n_items)
        return kv_fail(err, KV_ERR_CAPACITY, "needle: %d haystack tokens + %d questions and "
                       "answers exceed the cache capacity %d", length, 2 * n_items,
                       b->spec.capacity);
    if (chunk <= 0) chunk = 512;
    float *logits = malloc(sizeof(float) * (size_t)V); /* [V] */
    if (!logits) return kv_fail(err, KV_ERR_NOMEM, "needle: out of memory");
    char what[96];
    snprintf(what, sizeof what, "%s %s L=%d", b->name, kv_recall_kind_name(kind), length);

    int rc = KV_OK;
    b->reset(b, slot);
    /* the haystack, in chunks (a prefill of chunk tokens per step) */
    for (int done = 0; done < length && !rc; done += chunk) {
        const int nt = length - done < chunk ? length - done : chunk;
        kv_seq s = {slot, done, nt, tokens + done};
        rc = b->forward(b, &s, 1, NULL, NULL, err);
        if (cb) cb(user, what, done0 + done + nt, total);
    }
    /* the questions: one decode step each, then the answer goes into the cache too */
    int pos = length;
    for (int i = 0; i < n_items && !rc; i++) {
        int q[2];
        const int nq = kv_recall_question_tokens(&v, kind, items[i].key, q);
        kv_seq s = {slot, pos, nq, q};
        if ((rc = b->forward(b, &s, 1, logits, NULL, err))) break;
        const int want = v.value0 + items[i].value;
        kv_needle_result *r = &res[i];
        memset(r, 0, sizeof *r);
        r->kind = kind;
        r->length = length;
        r->depth = items[i].depth;
        r->key = items[i].key;
        r->value = items[i].value;
        r->position = items[i].pos;
        r->distance = pos - items[i].pos;
        r->answer = kv_argmax(logits, V);
        r->pass = r->answer == want;
        r->logit_value = logits[want];
        float best = -3.4e38f;
        for (int t = 0; t < V; t++)
            if (t != want && logits[t] > best) best = logits[t];
        r->logit_other = best;
        r->margin = logits[want] - best;
        pos += nq;
        kv_seq a = {slot, pos, 1, &r->answer};
        if ((rc = b->forward(b, &a, 1, NULL, NULL, err))) break;
        pos += 1;
    }
    free(logits);
    return rc;
}

int kv_needle_expect(const kv_needle_variant *v, const kv_needle_result *r)
{
    /* chapter 09: the token attention must read is the fact's last (induction: the value) */
    const int nt = r->kind == KV_MODEL_RECALL_INDUCTION ? 2 : 1;
    const long last = r->position + nt - 1, dist = r->distance - (nt - 1);
    const int kept = last < v->arg || dist <= v->arg2;
    switch (v->rule) {
    case KV_EXPECT_ALL: return 1;
    case KV_EXPECT_NONE: return 0;
    case KV_EXPECT_WITHIN: return r->distance <= v->arg;
    case KV_EXPECT_KEPT: return kept;
    case KV_EXPECT_ATLEAST: return kept ? 1 : -1;
    case KV_EXPECT_PAGE_SPLIT: return !(nt == 2 && last % v->arg == 0);
    case KV_EXPECT_FROM: return last >= v->arg;
    default: return -1;
    }
}

int kv_needle_grid(const kv_needle_spec *s, kv_needle_backend_fn make, void *make_user,
                   kv_needle_progress cb, void *user, kv_needle_result **out, int *n_out,
                   kv_err *err)
{
    *out = NULL;
    *n_out = 0;
    int max_len = 0;
    long total = 0;
    for (int i = 0; i < s->n_lengths; i++) {
        if (s->lengths[i] > max_len) max_len = s->lengths[i];
        total += s->lengths[i];
    }
    total *= (long)s->n_models * s->n_variants * s->n_seeds;
    const int n_res = s->n_models * s->n_variants * s->n_seeds * s->n_lengths * s->n_depths;
    if (n_res <= 0) return kv_fail(err, KV_ERR_ARG, "needle grid '%s' is empty", s->name);
    kv_needle_result *res = calloc((size_t)n_res, sizeof *res);
    int *tokens = malloc(sizeof(int) * (size_t)max_len);
    if (!res || !tokens) {
        free(res);
        free(tokens);
        return kv_fail(err, KV_ERR_NOMEM, "needle grid: out of memory");
    }
    int rc = KV_OK, k = 0;
    long done = 0;
    for (int mi = 0; mi < s->n_models && !rc; mi++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, s->models[mi]);
        o.seed = s->model_seed;
        if (max_len + 2 * s->n_depths > o.seq_len) o.seq_len = max_len + 2 * s->n_depths;
        kv_model m;
        if ((rc = kv_recall_build(&m, &o, err))) break;
        for (int vi = 0; vi < s->n_variants && !rc; vi++) {
            kv_cache_spec cs;
            kv_backend *b = NULL;
            rc = kv_needle_cache_spec(s->variants[vi].spec, 1, max_len + 2 * s->n_depths, &cs, err);
            if (!rc) rc = make(&b, &m, &cs, make_user, err);
            for (int si = 0; si < s->n_seeds && !rc; si++)
                for (int li = 0; li < s->n_lengths && !rc; li++) {
                    kv_needle_item items[KV_NEEDLE_MAX_DEPTHS];
                    const uint64_t seed = s->seeds[si] * 1000003u + (uint64_t)s->lengths[li];
                    rc = kv_needle_build(s->models[mi], s->lengths[li], s->depths, s->n_depths,
                                         seed, tokens, items, err);
                    if (!rc)
                        rc = kv_needle_run(b, 0, s->models[mi], tokens, s->lengths[li], items,
                                           s->n_depths, s->chunk, res + k, cb, user, done,
                                           total, err);
                    for (int di = 0; di < s->n_depths && !rc; di++, k++) {
                        res[k].variant = vi;
                        res[k].seed = s->seeds[si];
                        res[k].expected = kv_needle_expect(&s->variants[vi], &res[k]);
                    }
                    done += s->lengths[li];
                }
            kv_backend_destroy(b);
        }
        kv_model_free(&m);
    }
    free(tokens);
    if (rc) {
        free(res);
        return rc;
    }
    *out = res;
    *n_out = n_res;
    return KV_OK;
}
