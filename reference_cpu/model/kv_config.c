/* Model configuration: defaults, validation, parameter count, embedded defaults, presets. */
#define _POSIX_C_SOURCE 200809L /* strcasecmp */
#include "kv_config.h"
#include "kv_mla.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ----------------------------------------------------------------------------
 * Limits. A config comes from a file someone handed us, so every field is checked
 * against a bound before any size is computed from it. The bounds are far above any
 * published model (Llama-3-405B: dim 16384, hidden 53248, 126 layers) and keep every
 * product below 2^63, so the size arithmetic further down cannot overflow.
 */
#define KV_MAX_DIM 65536
#define KV_MAX_HIDDEN (1 << 20)
#define KV_MAX_LAYERS 1024
#define KV_MAX_VOCAB (1 << 24)
#define KV_MAX_SEQ (1 << 24)
/* shapes up to 2^40 parameters validate, so kvlab calc can describe any published model;
 * kv_model_alloc refuses more than 2^34 (64 GiB of fp32) for weights actually held */
#define KV_MAX_CONFIG_PARAMS ((int64_t)1 << 40)

void kv_config_set_defaults(kv_config *c)
{
    c->rope_theta = 10000.0f; /* llama2.c hard-codes this base */
    c->rotary_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0; /* rotate the whole head */
    c->norm_eps = 1e-5f;
    c->tied_classifier = 1;
    c->kind = KV_MODEL_GENERIC;
    c->attn = KV_ATTN_GQA; /* an MLA model sets attn and mla after this */
    memset(&c->mla, 0, sizeof c->mla);
    c->n_rope_factors = 0; /* every pair at theta^(-2i/rotary_dim) */
    memset(c->rope_factors, 0, sizeof c->rope_factors);
}

/* check lo <= v <= hi, naming the field when it is not */
static int range(const char *name, int v, int lo, int hi, kv_err *err)
{
    if (v < lo || v > hi)
        return kv_fail(err, KV_ERR_ARG, "%s (%d) must be in %d..%d", name, v, lo, hi);
    return KV_OK;
}

/* rope_theta, norm_eps, the tied flag and RoPE's factors: the same rules for every attention
 * kind */
static int numbers(const kv_config *c, kv_err *err)
{
    if (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
        return kv_fail(err, KV_ERR_ARG, "rope_theta (%g) must be positive and finite",
                       (double)c->rope_theta);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps) || c->norm_eps > 1.0f)
        return kv_fail(err, KV_ERR_ARG, "norm_eps (%g) must be in (0, 1]", (double)c->norm_eps);
    if (c->tied_classifier != 0 && c->tied_classifier != 1)
        return kv_fail(err, KV_ERR_ARG, "tied_classifier (%d) must be 0 or 1", c->tied_classifier);
    /* the per-pair tables (kv_rope_freqs()) hold KV_ROPE_MAX_PAIRS pairs */
    if (c->rotary_dim > 2 * KV_ROPE_MAX_PAIRS)
        return kv_fail(err, KV_ERR_ARG, "rotary_dim (%d) must be at most %d", c->rotary_dim,
                       2 * KV_ROPE_MAX_PAIRS);
    if (c->n_rope_factors != 0 && c->n_rope_factors != c->rotary_dim / 2)
        return kv_fail(err, KV_ERR_ARG, "n_rope_factors (%d) must be 0 or rotary_dim / 2 (%d)",
                       c->n_rope_factors, c->rotary_dim / 2);
    for (int i = 0; i < c->n_rope_factors; i++)
        if (!(c->rope_factors[i] > 0.0f) || !isfinite(c->rope_factors[i]))
            return kv_fail(err, KV_ERR_ARG, "rope_factors[%d] (%g) must be positive and finite",
                           i, (double)c->rope_factors[i]);
    return KV_OK;
}

/* An MLA model (kv_mla.h): no head dim d = dim / H to divide or rotate; one latent row per
 * token, so one KV head; only q_R and k_R rotate, all of their d_R dims. The sizes, theta,
 * eps and flags are checked as for any model. */
static int validate_mla(const kv_config *c, kv_err *err)
{
    int rc;
    if ((rc = range("dim", c->dim, 1, KV_MAX_DIM, err))) return rc;
    if ((rc = range("hidden_dim", c->hidden_dim, 1, KV_MAX_HIDDEN, err))) return rc;
    if ((rc = range("n_layers", c->n_layers, 1, KV_MAX_LAYERS, err))) return rc;
    if ((rc = range("n_heads", c->n_heads, 1, 1024, err))) return rc;
    if (c->n_kv_heads != 1)
        return kv_fail(err, KV_ERR_ARG, "n_kv_heads (%d) must be 1 for an MLA model: its cache "
                       "holds one latent row per token, shared by every head", c->n_kv_heads);
    if ((rc = range("vocab_size", c->vocab_size, 1, KV_MAX_VOCAB, err))) return rc;
    if ((rc = range("seq_len", c->seq_len, 1, KV_MAX_SEQ, err))) return rc;
    if ((rc = kv_mla_dims_check(&c->mla, err))) return rc;
    if (c->rotary_dim != c->mla.d_rope)
        return kv_fail(err, KV_ERR_ARG, "rotary_dim (%d) must equal d_R (%d) for an MLA model: "
                       "only q_R and k_R rotate", c->rotary_dim, c->mla.d_rope);
    if ((rc = numbers(c, err))) return rc;
    if (c->kind != KV_MODEL_GENERIC)
        return kv_fail(err, KV_ERR_ARG, "kind (%d) must be 0 (generic) for an MLA model: the "
                       "recall models are constructed over K/V heads", c->kind);
    int64_t p = kv_config_param_count(c);
    if (p > KV_MAX_CONFIG_PARAMS)
        return kv_fail(err, KV_ERR_ARG, "parameter count (%lld) exceeds the limit 2^40",
                       (long long)p);
    return KV_OK;
}

int kv_config_validate(const kv_config *c, kv_err *err)
{
    if (!c) return kv_fail(err, KV_ERR_ARG, "config is NULL");
    if (c->attn == KV_ATTN_MLA) return validate_mla(c, err);
    if (c->attn != KV_ATTN_GQA)
        return kv_fail(err, KV_ERR_ARG, "attn (%d) is not a known attention kind (0 MHA/GQA, "
                       "1 MLA)", c->attn);
    int rc;
    if ((rc = range("dim", c->dim, 1, KV_MAX_DIM, err))) return rc;
    if ((rc = range("hidden_dim", c->hidden_dim, 1, KV_MAX_HIDDEN, err))) return rc;
    if ((rc = range("n_layers", c->n_layers, 1, KV_MAX_LAYERS, err))) return rc;
    if ((rc = range("n_heads", c->n_heads, 1, c->dim, err))) return rc;
    if (c->dim % c->n_heads)
        return kv_fail(err, KV_ERR_ARG, "n_heads (%d) must divide dim (%d)", c->n_heads, c->dim);
    if ((rc = range("n_kv_heads", c->n_kv_heads, 1, c->n_heads, err))) return rc;
    if ((rc = range("vocab_size", c->vocab_size, 1, KV_MAX_VOCAB, err))) return rc;
    if ((rc = range("seq_len", c->seq_len, 1, KV_MAX_SEQ, err))) return rc;
    if (c->n_heads % c->n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "n_kv_heads (%d) must divide n_heads (%d)",
                       c->n_kv_heads, c->n_heads);
    const int d = c->dim / c->n_heads;
    /* RoPE rotates pairs of dimensions (2i, 2i+1), so a head needs an even width */
    if (d % 2)
        return kv_fail(err, KV_ERR_ARG, "head_dim (dim %d / n_heads %d = %d) must be even for RoPE",
                       c->dim, c->n_heads, d);
    if (c->rotary_dim < 0 || c->rotary_dim > d || c->rotary_dim % 2)
        return kv_fail(err, KV_ERR_ARG, "rotary_dim (%d) must be even and in 0..head_dim (%d)",
                       c->rotary_dim, d);
    if ((rc = numbers(c, err))) return rc;
    if (c->kind < KV_MODEL_GENERIC || c->kind > KV_MODEL_RECALL_INDUCTION)
        return kv_fail(err, KV_ERR_ARG, "kind (%d) is not a known model kind (0..2)", c->kind);
    int64_t p = kv_config_param_count(c);
    if (p > KV_MAX_CONFIG_PARAMS)
        return kv_fail(err, KV_ERR_ARG, "parameter count (%lld) exceeds the limit 2^40",
                       (long long)p);
    return KV_OK;
}

int64_t kv_config_param_count(const kv_config *c)
{
    const int64_t dim = c->dim, hidden = c->hidden_dim, L = c->n_layers, vocab = c->vocab_size;
    const int64_t q_dim = dim;                 /* H * d */
    const int64_t kv_dim = c->n_heads > 0 ? (int64_t)c->n_kv_heads * (dim / c->n_heads) : 0;
    const int64_t attn = c->attn == KV_ATTN_MLA                 /* kv_mla.h's layer */
                             ? kv_mla_layer_floats(&c->mla, c->dim, c->n_heads)
                             : q_dim * dim                      /* wq */
                                   + 2 * kv_dim * dim           /* wk, wv */
                                   + dim * q_dim;               /* wo */
    int64_t per_layer = 2 * dim              /* rms_att, rms_ffn */
                        + attn
                        + 3 * hidden * dim;  /* w1, w2, w3 */
    int64_t n = vocab * dim + L * per_layer + dim; /* embedding, layers, rms_final */
    if (!c->tied_classifier) n += vocab * dim;     /* wcls */
    return n;
}

void kv_config_describe(const kv_config *c, char *buf, size_t n)
{
    const int d = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    const kv_mla_dims *m = &c->mla;
    int k = c->attn == KV_ATTN_MLA
                ? snprintf(buf, n, "dim %d, L %d, H %d, MLA d_c %d, d_R %d, d_nope %d, d_v %d, "
                           "q_rank %d, hidden %d, vocab %d, seq %d", c->dim, c->n_layers,
                           c->n_heads, m->d_c, m->d_rope, m->d_nope, m->d_v, m->q_rank,
                           c->hidden_dim, c->vocab_size, c->seq_len)
                : snprintf(buf, n, "dim %d, L %d, H %d, H_kv %d, d %d, hidden %d, vocab %d, "
                           "seq %d", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, d,
                           c->hidden_dim, c->vocab_size, c->seq_len);
    /* only what differs from llama2.c's assumptions, so a llama2.c model reads as above */
    if (k >= 0 && (size_t)k < n && c->rope_theta != 10000.0f)
        k += snprintf(buf + k, n - k, ", theta %g", (double)c->rope_theta);
    if (k >= 0 && (size_t)k < n && c->rotary_dim != d && c->attn != KV_ATTN_MLA)
        k += snprintf(buf + k, n - k, ", rotary %d", c->rotary_dim);
    if (k >= 0 && (size_t)k < n && c->n_rope_factors)
        k += snprintf(buf + k, n - k, ", RoPE factors %g..%g", (double)c->rope_factors[0],
                      (double)c->rope_factors[c->n_rope_factors - 1]);
    if (k >= 0 && (size_t)k < n && !c->tied_classifier)
        k += snprintf(buf + k, n - k, ", untied");
    if (k >= 0 && (size_t)k < n && c->kind == KV_MODEL_RECALL_DIRECT)
        k += snprintf(buf + k, n - k, ", recall-direct");
    if (k >= 0 && (size_t)k < n && c->kind == KV_MODEL_RECALL_INDUCTION)
        snprintf(buf + k, n - k, ", recall-induction");
}

int kv_config_require_gqa(const kv_config *c, const char *who, kv_err *err)
{
    if (!c || c->attn == KV_ATTN_GQA) return KV_OK;
    return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: the model's attention is MLA (chapter 11), "
                   "which only the CPU forward pass runs (engine/kv_forward_mla.c)", who);
}

/* ----------------------------------------------------------------------------
 * Embedded defaults: random-weight models the program creates itself from a seed.
 *
 * tiny      d = 16, 2 layers: a forward step costs ~0.1 M multiply-adds, so a test can run
 *           thousands of tokens (and chapter 01's quadratic recompute) in well under a second.
 *           vocab 512 holds the embedded byte tokenizer (259 byte/special ids, 95 printable
 *           characters, 158 merged pairs) and seq 512 lets caches fill and wrap quickly.
 * tiny-gqa  the same with H_kv = 2 (G = 2), so chapter 03 compares like with like.
 * tiny-mla  tiny's sizes with multi-head latent attention (chapter 11): a latent of d_c 48
 *           and a RoPE key of d_R 16 cached per token and layer (64 floats, half of tiny's
 *           2·4·16 = 128; 64 so that every group size of chapter 04 divides the row), heads of
 *           d_nope 16 + d_R 16, values of d_v 16, queries from x directly (q_rank 0, as
 *           DeepSeek-V2-Lite).
 * small     llama2.c's stories15M shape (dim 288, 6 layers, 6 heads, hidden 768, seq 256)
 *           but vocab 4096 instead of 32000: with random weights the vocabulary carries no
 *           language, and a 32000 x 288 classifier would be 9.2 M of the model's 15 M weights,
 *           so per-token time would be mostly classifier rather than the attention and cache
 *           work the chapters measure. 4096 keeps the tour's timing runs to seconds.
 */
typedef struct {
    const char *name;
    kv_config config;
    uint64_t seed;
} kv_default_entry;

/*                    dim hidden L  H  H_kv vocab seq   theta   rot  eps  tied kind
 *                    attention, MLA dims {d_c, d_R, d_nope, d_v, q_rank} */
static const kv_default_entry kv_defaults[KV_DEFAULT_COUNT] = {
    {"tiny",     {64,  172, 2, 4, 4, 512,  512, 10000.0f, 16, 1e-5f, 1, KV_MODEL_GENERIC,
                  KV_ATTN_GQA, {0}}, 1001},
    {"tiny-gqa", {64,  172, 2, 4, 2, 512,  512, 10000.0f, 16, 1e-5f, 1, KV_MODEL_GENERIC,
                  KV_ATTN_GQA, {0}}, 1002},
    {"small",    {288, 768, 6, 6, 6, 4096, 256, 10000.0f, 48, 1e-5f, 1, KV_MODEL_GENERIC,
                  KV_ATTN_GQA, {0}}, 1003},
    {"tiny-mla", {64,  172, 2, 4, 1, 512,  512, 10000.0f, 16, 1e-5f, 1, KV_MODEL_GENERIC,
                  KV_ATTN_MLA, {48, 16, 16, 16, 0}}, 1004},
};

const char *kv_config_default_name(kv_default_model which)
{
    if ((int)which < 0 || which >= KV_DEFAULT_COUNT) return NULL;
    return kv_defaults[which].name;
}

int kv_config_default(kv_default_model which, kv_config *out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "output config is NULL");
    if ((int)which < 0 || which >= KV_DEFAULT_COUNT)
        return kv_fail(err, KV_ERR_ARG, "no embedded default model number %d (0..%d)",
                       (int)which, KV_DEFAULT_COUNT - 1);
    *out = kv_defaults[which].config;
    return KV_OK;
}

int kv_config_default_by_name(const char *name, kv_config *out, uint64_t *seed, kv_err *err)
{
    if (!name) return kv_fail(err, KV_ERR_ARG, "default model name is NULL");
    for (int i = 0; i < KV_DEFAULT_COUNT; i++) {
        if (strcmp(name, kv_defaults[i].name) == 0) {
            if (out) *out = kv_defaults[i].config;
            if (seed) *seed = kv_defaults[i].seed;
            return KV_OK;
        }
    }
    return kv_fail(err, KV_ERR_ARG, "no embedded default model named '%s' (tiny, tiny-gqa, "
                   "small, tiny-mla)", name);
}

/* ----------------------------------------------------------------------------
 * Presets: the shapes of published models, from their config.json files
 * (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, vocab_size, max_position_embeddings, rope_theta, rms_norm_eps).
 * None ties its classifier to the embedding. Only shapes: kvlab calc does arithmetic with them.
 */
#define PRESET(nm, dim, hid, L, H, Hkv, V, S, theta, win)                                    \
    {nm, {dim, hid, L, H, Hkv, V, S, theta, (dim) / (H), 1e-5f, 0, KV_MODEL_GENERIC,        \
          KV_ATTN_GQA, {0}}, win}

static const kv_preset kv_preset_table[] = {
    PRESET("llama-2-7b",  4096, 11008, 32, 32, 32, 32000,  4096,  10000.0f,  0),
    PRESET("llama-2-13b", 5120, 13824, 40, 40, 40, 32000,  4096,  10000.0f,  0),
    PRESET("llama-2-70b", 8192, 28672, 80, 64,  8, 32000,  4096,  10000.0f,  0),
    PRESET("llama-3-8b",  4096, 14336, 32, 32,  8, 128256, 8192,  500000.0f, 0),
    PRESET("llama-3-70b", 8192, 28672, 80, 64,  8, 128256, 8192,  500000.0f, 0),
    PRESET("mistral-7b",  4096, 14336, 32, 32,  8, 32000,  32768, 10000.0f,  4096),
};

const kv_preset *kv_presets(int *n)
{
    if (n) *n = (int)(sizeof kv_preset_table / sizeof kv_preset_table[0]);
    return kv_preset_table;
}

const kv_preset *kv_preset_find(const char *name)
{
    if (!name) return NULL;
    int n;
    const kv_preset *p = kv_presets(&n);
    for (int i = 0; i < n; i++)
        if (strcasecmp(name, p[i].name) == 0) return &p[i];
    return NULL;
}
