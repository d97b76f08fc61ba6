/*
 * Probes of a trained model's cache (kv_probe.h): key magnitudes per channel, attention mass
 * per position, and KIVI's key grouping emulated on an fp32 cache.
 */
#include "kv_probe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_needle.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_retain.h"

#define PROBE_CHUNK 64

/* Every probe here reads per-head keys (and values) out of the cache; an MLA model caches one
 * latent row c_KV ‖ k_R per token instead (chapter 11), which is no key of any head. */
static int per_head_keys(const kv_config *c, const char *who, kv_err *err)
{
    if (!c) return kv_fail(err, KV_ERR_ARG, "%s: NULL model", who);
    if (c->attn == KV_ATTN_MLA)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: the model has no per-head keys (multi-head "
                       "latent attention caches one latent row per token)", who);
    return KV_OK;
}

/* tokens [n] through a CPU backend of @p spec from position 0, in chunks; the backend is
 * left holding them */
static int prefill(kv_backend **b, const kv_model *m, const kv_cache_spec *spec,
                   const int *tokens, int n, kv_err *err)
{
    if (n < 1) return kv_fail(err, KV_ERR_ARG, "probe: n = %d, need at least one token", n);
    float *logits = malloc(sizeof(float) * (size_t)m->config.vocab_size); /* [vocab] */
    if (!logits) return kv_fail(err, KV_ERR_NOMEM, "probe: out of memory");
    int st = kv_backend_cpu(b, m, spec, err);
    for (int pos = 0; !st && pos < n; pos += PROBE_CHUNK) {
        kv_seq s = {0, pos, n - pos < PROBE_CHUNK ? n - pos : PROBE_CHUNK, tokens + pos, NULL};
        st = (*b)->forward(*b, &s, 1, logits, NULL, err);
    }
    free(logits);
    return st;
}

int kv_probe_key_channels(const kv_model *m, const int *tokens, int n, double *pre,
                          double *post, kv_err *err)
{
    int st = per_head_keys(m ? &m->config : NULL, "probe: key channels", err);
    if (st) return st;
    const kv_config *cfg = &m->config;
    const int L = cfg->n_layers, Hkv = cfg->n_kv_heads, d = kv_config_head_dim(cfg);
    kv_backend *b = NULL;
    kv_cache_spec spec = kv_cache_spec_default(1, n > 0 ? n : 1);
    st = prefill(&b, m, &spec, tokens, n, err);
    float *row = malloc(sizeof(float) * (size_t)d); /* [d] one key, rotated back */
    if (!st && !row) st = kv_fail(err, KV_ERR_NOMEM, "probe: out of memory");
    const kv_cache *c = st ? NULL : kv_backend_cpu_cache(b);
    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] */
    kv_rope_freqs(cfg, freq);
    for (int l = 0; c && l < L; l++)
        for (int h = 0; h < Hkv; h++) {
            const float *k = kv_cache_k(c, l, 0, h); /* [capacity][d], RoPE applied */
            double *a = pre + ((size_t)l * Hkv + h) * d, *z = post + ((size_t)l * Hkv + h) * d;
            memset(a, 0, sizeof(double) * (size_t)d);
            memset(z, 0, sizeof(double) * (size_t)d);
            for (int t = 0; t < n; t++) {
                /* rotating by -t undoes the rotation by t (cos even, sin odd) */
                const int back = -t;
                memcpy(row, k + (size_t)t * d, sizeof(float) * (size_t)d);
                kv_rope(row, &back, 1, 1, d, cfg->rotary_dim, freq);
                for (int j = 0; j < d; j++) {
                    z[j] += fabs((double)k[(size_t)t * d + j]) / n;
                    a[j] += fabs((double)row[j]) / n;
                }
            }
        }
    free(row);
    kv_backend_destroy(b);
    return st;
}

int kv_probe_attention_mass_heads(const kv_model *m, const int *tokens, int n, double *mass,
                                  kv_err *err)
{
    int st = per_head_keys(m ? &m->config : NULL, "probe: attention mass", err);
    if (st) return st;
    const kv_config *cfg = &m->config;
    const int L = cfg->n_layers, Hkv = cfg->n_kv_heads;
    const int G = cfg->n_heads / Hkv; /* query heads reading each KV head */
    if (n < 1) return kv_fail(err, KV_ERR_ARG, "probe: n = %d, need at least one token", n);
    /* H2O at a budget of every position: its scores are the summed probabilities, per KV
     * head over the G query heads of its group */
    char variant[32];
    snprintf(variant, sizeof variant, "h2o/b%d", n);
    kv_cache_spec spec;
    kv_backend *b = NULL;
    st = kv_needle_cache_spec(variant, 1, n, &spec, err);
    if (!st) st = prefill(&b, m, &spec, tokens, n, err);
    const kv_cache *c = st ? NULL : kv_backend_cpu_cache(b);
    for (int l = 0; c && l < L; l++)
        for (int h = 0; h < Hkv; h++) {
            double *row = mass + ((size_t)l * Hkv + h) * n;
            memset(row, 0, sizeof(double) * (size_t)n);
            const kv_retain_head *rh = kv_retain_at(c->retain, 0, l, h);
            for (int i = 0; i < rh->kept.n; i++) row[rh->kept.pos[i]] += rh->score[i];
            for (int p = 0; p < n; p++) row[p] /= (double)n * G;
        }
    kv_backend_destroy(b);
    return st;
}

int kv_probe_attention_mass(const kv_model *m, const int *tokens, int n, double *mass,
                            kv_err *err)
{
    int st = per_head_keys(m ? &m->config : NULL, "probe: attention mass", err);
    if (st) return st;
    const int L = m->config.n_layers, Hkv = m->config.n_kv_heads;
    if (n < 1) return kv_fail(err, KV_ERR_ARG, "probe: n = %d, need at least one token", n);
    double *heads = malloc(sizeof(double) * (size_t)L * Hkv * n); /* [L][H_kv][n] */
    if (!heads) return kv_fail(err, KV_ERR_NOMEM, "probe: out of memory");
    st = kv_probe_attention_mass_heads(m, tokens, n, heads, err);
    /* the layer's distribution: the mean of its KV heads' (each of G query heads) */
    for (int l = 0; !st && l < L; l++)
        for (int p = 0; p < n; p++) {
            double sum = 0.0;
            for (int h = 0; h < Hkv; h++) sum += heads[((size_t)l * Hkv + h) * n + p];
            mass[(size_t)l * n + p] = sum / Hkv;
        }
    free(heads);
    return st;
}

int kv_probe_kivi_init(kv_probe_kivi *k, int fmt, int keys_per_token, int window, kv_err *err)
{
    memset(k, 0, sizeof *k);
    if (!kvq_is_kivi(fmt)) return kv_fail(err, KV_ERR_ARG, "KIVI emulation: %s is not a KIVI format", kv_quant_name(fmt));
    if (window < KV_KIVI_GROUP || window % KV_KIVI_GROUP)
        return kv_fail(err, KV_ERR_ARG, "KIVI emulation: window %d must be a positive multiple of %d",
                       window, KV_KIVI_GROUP);
    k->fmt = fmt;
    k->key_role = keys_per_token ? KV_QROLE_VALUE : KV_QROLE_KEY;
    k->window = window;
    return KV_OK;
}

/* rows [32][d] replaced by their round trip through fmt in role */
static int round_trip(int fmt, int role, float *rows, int d, uint8_t *codes, void *meta, kv_err *err)
{
    int st = kv_quant_encode(fmt, role, rows, KV_KIVI_GROUP, d, 1.0f, codes, meta, err);
    return st ? st : kv_quant_decode(fmt, role, codes, meta, KV_KIVI_GROUP, d, 1.0f, rows, err);
}

int kv_probe_kivi_step(void *hook, kv_backend *b, int pos, int n, kv_err *err)
{
    kv_probe_kivi *k = hook;
    int st = per_head_keys(b ? b->config : NULL, "KIVI emulation", err);
    if (st) return st;
    const kv_cache *c = kv_backend_cpu_cache(b);
    if (!c || !c->k || !c->v || c->spec.layout.kind != KV_LAYOUT_CONTIGUOUS)
        return kv_fail(err, KV_ERR_ARG, "KIVI emulation needs an fp32 contiguous CPU cache");
    /* a step inside one group (a decode step) is fine too: the step that opened the group
     * spilled enough for the whole group */
    if (n < 1 || n > KV_KIVI_GROUP ||
        (pos % KV_KIVI_GROUP && pos / KV_KIVI_GROUP != (pos + n - 1) / KV_KIVI_GROUP))
        return kv_fail(err, KV_ERR_ARG, "KIVI emulation: steps of at most %d tokens at multiples "
                       "of %d, or inside one group of %d (pos %d, n %d)", KV_KIVI_GROUP,
                       KV_KIVI_GROUP, KV_KIVI_GROUP, pos, n);
    if (pos == 0) k->quantized = 0; /* a new window */
    const int d = c->head_dim;
    uint8_t *codes = malloc(kv_quant_code_bytes(k->fmt, KV_KIVI_GROUP, d)); /* [32][row bytes] */
    void *meta = malloc(kv_quant_meta_bytes(k->fmt, KV_QROLE_VALUE, KV_KIVI_GROUP, d) +
                        kv_quant_meta_bytes(k->fmt, KV_QROLE_KEY, KV_KIVI_GROUP, d));
    st = codes && meta ? KV_OK : kv_fail(err, KV_ERR_NOMEM, "KIVI emulation: out of memory");
    /* the cache's rule: the step's tokens must fit in the window beside the unquantized rows */
    while (!st && pos + n - k->quantized > k->window) {
        const int q = k->quantized;
        for (int l = 0; !st && l < c->n_layers; l++)
            for (int h = 0; !st && h < c->n_kv_heads; h++) {
                st = round_trip(k->fmt, k->key_role, kv_cache_k(c, l, 0, h) + (size_t)q * d, d,
                                codes, meta, err);
                if (!st)
                    st = round_trip(k->fmt, KV_QROLE_VALUE, kv_cache_v(c, l, 0, h) + (size_t)q * d,
                                    d, codes, meta, err);
                k->rows_round_tripped += 2 * KV_KIVI_GROUP;
            }
        k->quantized += KV_KIVI_GROUP;
    }
    free(codes);
    free(meta);
    return st;
}
