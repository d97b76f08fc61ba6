/*
 * A Llama model from a GGUF file (kv_gguf_model.h): the llama.* keys into a kv_config, every
 * tensor's shape checked against it, then every tensor dequantized to fp32 into kv_model's
 * one allocation.
 *
 * Names and shapes. A GGUF tensor's ne[0] is its row length, so a matrix of ne = [in, out] is
 * out rows of in weights: kvlab's row-major W [out][in], byte for byte after dequantization.
 *
 *   GGUF tensor               ne              kv_weights
 *   token_embd.weight         [dim, vocab]    token_embedding [vocab][dim]
 *   blk.N.attn_norm.weight    [dim]           rms_att   [L][dim]
 *   blk.N.attn_q.weight       [dim, H*d]      wq        [L][H*d][dim]
 *   blk.N.attn_k.weight       [dim, H_kv*d]   wk        [L][H_kv*d][dim]
 *   blk.N.attn_v.weight       [dim, H_kv*d]   wv        [L][H_kv*d][dim]
 *   blk.N.attn_output.weight  [H*d, dim]      wo        [L][dim][H*d]
 *   blk.N.ffn_norm.weight     [dim]           rms_ffn   [L][dim]
 *   blk.N.ffn_gate.weight     [dim, hidden]   w1        [L][hidden][dim]
 *   blk.N.ffn_down.weight     [hidden, dim]   w2        [L][dim][hidden]
 *   blk.N.ffn_up.weight       [dim, hidden]   w3        [L][hidden][dim]
 *   output_norm.weight        [dim]           rms_final [dim]
 *   output.weight             [dim, vocab]    wcls      [vocab][dim] (absent: tied)
 *
 * The rows of Q and K, and RoPE's pairs. A Hugging Face Llama checkpoint rotates each head's
 * dimension i with dimension i + d/2 (rotate_half: the "NeoX" pairing). llama.cpp's
 * convert_hf_to_gguf.py permutes the rows of q_proj and k_proj, within each head, so that
 * those partners become neighbours: after it, GGUF's arch "llama" rotates adjacent pairs
 * (2i, 2i+1) by the angle pos * theta^(-2i/d) (llama.cpp's "normal" RoPE). kvlab's kv_rope()
 * (kv_ops.c) rotates exactly those pairs, (x[i], x[i+1]) for even i, by pos * theta^(-i/d):
 * the same pairs and the same angles, so GGUF's rows go into wq and wk as they are, with no
 * permutation back. (A checkpoint exported from Hugging Face straight to kvlab's format would
 * need the permutation; a GGUF file has had it.) tests/test_gguf_realmodel.c checks the
 * consequence on SmolLM2: a known prompt's next token.
 *
 * Llama 3.x's longer context. Its files carry rope_freqs.weight, one factor f_i per pair:
 * pair i turns at theta^(-2i/d) / f_i (llama.cpp's freq_factors; kv_rope_freqs()), and an
 * older linear scaling (rope.scaling.type linear, rope.scaling.factor s) turns every pair
 * s times slower. Both become the config's rope_factors, which every RoPE in kvlab reads;
 * other scalings (YaRN, LongRoPE) are refused by name. tests/test_gguf_llama3.c holds a
 * synthetic Llama 3.1 file to llama.cpp's logits.
 */
#include "kv_gguf_model.h"
#include "kv_gguf_internal.h"
#include "kv_gguf_quant.h"

#include "kv_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "llama"

/* an integer key, prefixed "llama.", in [lo, hi] */
static int get_dim(const kv_gguf *g, const char *name, int64_t lo, int64_t hi, int *out,
                   kv_err *err)
{
    char key[96];
    snprintf(key, sizeof key, ARCH ".%s", name);
    int64_t v;
    int rc = kv_gguf_get_int(g, key, &v, err);
    if (rc) return rc;
    if (v < lo || v > hi)
        return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' = %lld is not in %lld..%lld", key,
                       (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return KV_OK;
}

/* a float key, prefixed "llama.", positive and finite; @p def when the key is absent
 * (def < 0: the key is required) */
static int get_pos(const kv_gguf *g, const char *name, double def, float *out, kv_err *err)
{
    char key[96];
    snprintf(key, sizeof key, ARCH ".%s", name);
    double v = def;
    if (def < 0 || kv_gguf_has(g, key)) {
        int rc = kv_gguf_get_float(g, key, &v, err);
        if (rc) return rc;
    }
    if (!(v > 0 && v < 1e30))
        return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' = %g must be positive and finite", key,
                       v);
    *out = (float)v;
    return KV_OK;
}

/* What kvlab's forward pass cannot run, refused by name before any weight is read. */
static int check_supported(const kv_gguf *g, kv_err *err)
{
    kv_gguf_str arch;
    int rc = kv_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc) return rc;
    if (!kv_gguf_str_eq(arch, ARCH))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "architecture '%.*s' is not supported (kvlab "
                       "runs '" ARCH "')", (int)(arch.n < 64 ? arch.n : 64), arch.s);
    kv_gguf_str scaling;
    if (kv_gguf_has(g, ARCH ".rope.scaling.type")) {
        if ((rc = kv_gguf_get_str(g, ARCH ".rope.scaling.type", &scaling, err))) return rc;
        if (!kv_gguf_str_eq(scaling, "none") && !kv_gguf_str_eq(scaling, "linear"))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "RoPE scaling '%.*s' (" ARCH
                           ".rope.scaling.type) is not supported: kvlab's RoPE divides each "
                           "pair's frequency by a fixed factor (none, linear, Llama 3's "
                           "rope_freqs) and nothing else", (int)(scaling.n < 64 ? scaling.n : 64),
                           scaling.s);
    }
    /* YaRN's magnitude scale: cos and sin times a factor, which kvlab's rotation has not */
    double attn = 1.0;
    if (kv_gguf_has(g, ARCH ".rope.scaling.attn_factor") &&
        (rc = kv_gguf_get_float(g, ARCH ".rope.scaling.attn_factor", &attn, err)))
        return rc;
    if (attn != 1.0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "GGUF key '" ARCH ".rope.scaling.attn_factor' = "
                       "%g is not supported (kvlab's RoPE is a pure rotation)", attn);
    return KV_OK;
}

/* A linear position scaling's factor s (angle pos/s · theta^(-2i/d)), as llama.cpp reads it:
 * rope.scaling.factor, else the older rope.scale_linear; absent or 0 is 1, and scaling type
 * "none" ignores it (the type's default is linear). */
static int linear_scale(const kv_gguf *g, double *s, kv_err *err)
{
    *s = 1.0;
    kv_gguf_str type;
    if (kv_gguf_has(g, ARCH ".rope.scaling.type") &&
        !kv_gguf_get_str(g, ARCH ".rope.scaling.type", &type, NULL) &&
        kv_gguf_str_eq(type, "none"))
        return KV_OK;
    static const char *const keys[] = {ARCH ".rope.scaling.factor", ARCH ".rope.scale_linear"};
    for (int k = 0; k < 2; k++) {
        if (!kv_gguf_has(g, keys[k])) continue;
        double v;
        int rc = kv_gguf_get_float(g, keys[k], &v, err);
        if (rc) return rc;
        if (v == 0.0) return KV_OK;
        if (!(v > 0 && v < 1e30))
            return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' = %g must be positive and finite",
                           keys[k], v);
        *s = v;
        return KV_OK;
    }
    return KV_OK;
}

/* RoPE's per-pair factors (kv_config.rope_factors): Llama 3.x's tensor rope_freqs.weight,
 * F32 [rotary_dim/2], by which llama.cpp divides each pair's frequency (its freq_factors),
 * times a linear scaling's factor, which divides every pair's. Neither: no factors, and the
 * frequencies stay theta^(-2i/d) bit for bit. */
static int rope_factors(const kv_gguf *g, kv_config *c, kv_err *err)
{
    double s;
    int rc = linear_scale(g, &s, err);
    if (rc) return rc;
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t && s == 1.0) return KV_OK;
    const int P = c->rotary_dim / 2;
    if (P > KV_ROPE_MAX_PAIRS)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "RoPE factors for %d pairs: kvlab holds at most "
                       "%d", P, KV_ROPE_MAX_PAIRS);
    if (t && (t->type != 0 || t->n_dims != 1 || t->ne[0] != P))
        return kv_fail(err, KV_ERR_FORMAT, "tensor 'rope_freqs.weight' must be F32 [%d] (one "
                       "factor per rotated pair), not %s of %d dims, ne[0] %lld", P,
                       kv_ggml_type_name(t->type), t->n_dims, (long long)t->ne[0]);
    for (int i = 0; i < P; i++) {
        float f = 1.0f;
        if (t) memcpy(&f, (const unsigned char *)t->data + 4 * (size_t)i, 4); /* may be unaligned */
        if (!(f > 0.0f && f < 1e30f))
            return kv_fail(err, KV_ERR_FORMAT, "tensor 'rope_freqs.weight'[%d] = %g must be "
                           "positive and finite", i, (double)f);
        c->rope_factors[i] = (float)(f * s);
    }
    c->n_rope_factors = P;
    return KV_OK;
}

int kv_gguf_model_config(const kv_gguf *g, kv_config *c, kv_err *err)
{
    memset(c, 0, sizeof *c);
    int rc = check_supported(g, err);
    if (rc) return rc;
    if ((rc = get_dim(g, "block_count", 1, 1024, &c->n_layers, err)) ||
        (rc = get_dim(g, "embedding_length", 1, 65536, &c->dim, err)) ||
        (rc = get_dim(g, "feed_forward_length", 1, 1 << 20, &c->hidden_dim, err)) ||
        (rc = get_dim(g, "attention.head_count", 1, 65536, &c->n_heads, err)) ||
        (rc = get_dim(g, "context_length", 1, 1 << 24, &c->seq_len, err)))
        return rc;
    c->n_kv_heads = c->n_heads; /* the key is optional: absent means MHA */
    if (kv_gguf_has(g, ARCH ".attention.head_count_kv") &&
        (rc = get_dim(g, "attention.head_count_kv", 1, 65536, &c->n_kv_heads, err)))
        return rc;
    /* the vocabulary: llama.vocab_size, else the tokenizer's token count */
    if (kv_gguf_has(g, ARCH ".vocab_size")) {
        if ((rc = get_dim(g, "vocab_size", 1, 1 << 24, &c->vocab_size, err))) return rc;
    } else {
        const kv_gguf_str *tokens;
        uint64_t n;
        if ((rc = kv_gguf_get_strings(g, "tokenizer.ggml.tokens", &tokens, &n, err))) return rc;
        if (n < 1 || n > (1 << 24))
            return kv_fail(err, KV_ERR_FORMAT, "tokenizer.ggml.tokens has %llu tokens (1..2^24)",
                           (unsigned long long)n);
        c->vocab_size = (int)n;
    }
    kv_config_set_defaults(c); /* rotary_dim = d, tied, generic, MHA/GQA */
    if (c->dim % c->n_heads)
        return kv_fail(err, KV_ERR_FORMAT, "llama.attention.head_count (%d) does not divide "
                       "llama.embedding_length (%d)", c->n_heads, c->dim);
    const int d = c->dim / c->n_heads;
    /* kvlab's heads are dim / H wide: a file whose heads are not is refused by name */
    static const char *const widths[] = {"attention.key_length", "attention.value_length"};
    for (int k = 0; k < 2; k++) {
        char key[96];
        snprintf(key, sizeof key, ARCH ".%s", widths[k]);
        if (!kv_gguf_has(g, key)) continue;
        int w = 0;
        if ((rc = get_dim(g, widths[k], 1, 65536, &w, err))) return rc;
        if (w != d)
            return kv_fail(err, KV_ERR_UNSUPPORTED, "GGUF key '%s' = %d: kvlab's heads are "
                           "embedding_length / head_count = %d wide", key, w, d);
    }
    if (kv_gguf_has(g, ARCH ".rope.dimension_count") &&
        (rc = get_dim(g, "rope.dimension_count", 0, d, &c->rotary_dim, err)))
        return rc;
    if ((rc = get_pos(g, "rope.freq_base", 10000.0, &c->rope_theta, err)) ||
        (rc = get_pos(g, "attention.layer_norm_rms_epsilon", -1.0, &c->norm_eps, err)) ||
        (rc = rope_factors(g, c, err)))
        return rc;
    c->tied_classifier = kv_gguf_find_tensor(g, "output.weight") == NULL;
    kv_err why;
    if (kv_config_validate(c, &why))
        return kv_fail(err, KV_ERR_FORMAT, "the " ARCH ".* keys make an invalid model: %s",
                       why.msg);
    return KV_OK;
}

/* A tensor the model needs: present, of the shape expected, of a type kvlab dequantizes. */
static int need_tensor(const kv_gguf *g, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                       const kv_gguf_tensor **out, kv_err *err)
{
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    if (!t) return kv_fail(err, KV_ERR_FORMAT, "tensor '%s' is missing", name);
    if (t->n_dims != n_dims || t->ne[0] != ne0 || t->ne[1] != ne1) {
        char want[64], got[96];
        if (n_dims == 1) snprintf(want, sizeof want, "[%lld]", (long long)ne0);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)ne0, (long long)ne1);
        int k = snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->n_dims; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i ? ", " : "",
                          (long long)t->ne[i]);
        snprintf(got + k, sizeof got - (size_t)k, "]");
        return kv_fail(err, KV_ERR_FORMAT, "tensor '%s': shape %s expected, found %s", name,
                       want, got);
    }
    if (!kv_ggml_type(t->type))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "tensor '%s' is of ggml type %s (%d), which "
                       "kvlab does not dequantize", name, kv_ggml_type_name(t->type), t->type);
    *out = t;
    return KV_OK;
}

/* one tensor's destination: its name, shape and where its fp32 rows go, as a field of
 * kv_weights and an offset into it, so the plan (and every check) can be made before the
 * weights are allocated */
typedef struct {
    char name[64];
    int n_dims;
    int64_t ne0, ne1;
    float *const *field; /* &m->w.wq ... */
    int64_t off;         /* rows go to *field + off: [ne1][ne0] */
    const kv_gguf_tensor *t;
} plan_row;

static void plan(plan_row *r, const char *name, int layer, int n_dims, int64_t ne0, int64_t ne1,
                 float *const *field, int64_t off)
{
    if (layer >= 0) snprintf(r->name, sizeof r->name, "blk.%d.%s.weight", layer, name);
    else snprintf(r->name, sizeof r->name, "%s.weight", name);
    r->n_dims = n_dims;
    r->ne0 = ne0;
    r->ne1 = ne1;
    r->field = field;
    r->off = off;
}

/* Every tensor the config implies, with its place in @p m's weights; returns the count. */
static int make_plan(const kv_model *m, plan_row *rows)
{
    const kv_config *c = &m->config;
    const kv_weights *w = &m->w;
    const int64_t dim = c->dim, hid = c->hidden_dim, kvd = kv_config_kv_dim(c);
    int n = 0;
    plan(&rows[n++], "token_embd", -1, 2, dim, c->vocab_size, &w->token_embedding, 0);
    for (int l = 0; l < c->n_layers; l++) {
        plan(&rows[n++], "attn_norm", l, 1, dim, 1, &w->rms_att, l * dim);
        plan(&rows[n++], "attn_q", l, 2, dim, dim, &w->wq, l * dim * dim);
        plan(&rows[n++], "attn_k", l, 2, dim, kvd, &w->wk, l * kvd * dim);
        plan(&rows[n++], "attn_v", l, 2, dim, kvd, &w->wv, l * kvd * dim);
        plan(&rows[n++], "attn_output", l, 2, dim, dim, &w->wo, l * dim * dim);
        plan(&rows[n++], "ffn_norm", l, 1, dim, 1, &w->rms_ffn, l * dim);
        plan(&rows[n++], "ffn_gate", l, 2, dim, hid, &w->w1, l * hid * dim);
        plan(&rows[n++], "ffn_down", l, 2, hid, dim, &w->w2, l * dim * hid);
        plan(&rows[n++], "ffn_up", l, 2, dim, hid, &w->w3, l * hid * dim);
    }
    plan(&rows[n++], "output_norm", -1, 1, dim, 1, &w->rms_final, 0);
    if (!c->tied_classifier) plan(&rows[n++], "output", -1, 2, dim, c->vocab_size, &w->wcls, 0);
    return n;
}

/* Dequantize one tensor, row by row: ne1 rows of ne0 weights, each row_bytes in the file. */
static void dequant_tensor(const plan_row *r)
{
    uint64_t row_bytes = 0;
    kv_ggml_row_bytes(r->t->type, r->ne0, &row_bytes, NULL); /* checked at open */
    const unsigned char *src = r->t->data;
    float *dst = *r->field + r->off;
    #pragma omp parallel for schedule(static) if (r->ne1 > 64)
    for (int64_t i = 0; i < r->ne1; i++)
        kv_ggml_dequant_row(r->t->type, src + (size_t)i * row_bytes, dst + i * r->ne0, r->ne0);
}

int kv_gguf_model_load_progress(const kv_gguf *g, kv_model *m, kv_gguf_progress progress,
                                void *ctx, kv_err *err)
{
    return kv_gguf_model_load_as(g, m, KV_WEIGHTS_F32, progress, ctx, err);
}

int kv_gguf_model_load_as(const kv_gguf *g, kv_model *m, int storage,
                          kv_gguf_progress progress, void *ctx, kv_err *err)
{
    if (!m) return kv_fail(err, KV_ERR_ARG, "model is NULL");
    memset(m, 0, sizeof *m);
    if (!g) return kv_fail(err, KV_ERR_ARG, "GGUF file is NULL");
    int rc = kv_gguf_model_config(g, &m->config, err);
    if (rc) return rc;
    const int n_rows = 2 + 9 * m->config.n_layers + !m->config.tied_classifier;
    plan_row *rows = calloc((size_t)n_rows, sizeof *rows);
    if (!rows) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    const int n = make_plan(m, rows);
    /* every shape and type checked before the weights are allocated: a file's tensors bound
     * what it can ask for */
    for (int k = 0; k < n && !rc; k++)
        rc = need_tensor(g, rows[k].name, rows[k].n_dims, rows[k].ne0, rows[k].ne1, &rows[k].t,
                         err);
    if (!rc && storage != KV_WEIGHTS_F32) { /* the matrices kept as blocks */
        const kv_gguf_tensor **ts = calloc((size_t)n, sizeof *ts);
        if (!ts) rc = kv_fail(err, KV_ERR_NOMEM, "out of memory");
        for (int k = 0; k < n && !rc; k++) ts[k] = rows[k].t;
        if (!rc) rc = kv_gguf_store_model(m, ts, n, storage, err);
        free(ts);
        int64_t all = 0; /* every weight read */
        for (int k = 0; k < n; k++) all += rows[k].ne0 * rows[k].ne1;
        free(rows);
        if (!rc && progress) progress(ctx, all, all);
        if (rc) kv_model_free(m);
        return rc;
    }
    const kv_config c = m->config;
    if (!rc) rc = kv_model_alloc(m, &c, err); /* fills the fields the plan points at */
    int64_t done = 0;
    for (int k = 0; k < n && !rc; k++) {
        dequant_tensor(&rows[k]);
        done += rows[k].ne0 * rows[k].ne1;
        if (progress) progress(ctx, done, m->n_floats);
    }
    free(rows);
    if (!rc) rc = kv_model_check_finite(m, err);
    if (rc) kv_model_free(m); /* zeroes it, config included */
    return rc;
}

int kv_gguf_model_load(const kv_gguf *g, kv_model *m, kv_err *err)
{
    return kv_gguf_model_load_progress(g, m, NULL, NULL, err);
}

static const char *const storage_names[] = {"f32", "native", "q8_0", "f16"};

const char *kv_weights_storage_name(int storage)
{
    return storage >= 0 && storage < 4 ? storage_names[storage] : NULL;
}

int kv_weights_storage_parse(const char *name)
{
    if (name && !strcmp(name, "fp32")) return KV_WEIGHTS_F32;
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, storage_names[i])) return i;
    return -1;
}

int kv_model_path_is_gguf(const char *path)
{
    FILE *f;
    if (kv_file_open_read(path, 0, &f, NULL, NULL)) return 0; /* regular files only */
    char magic[4];
    const int ok = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    fclose(f);
    return ok;
}
