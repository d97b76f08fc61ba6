/* Chapter 06's part of the cache (kv_window.h for the arithmetic): a sliding window of W
 * recent tokens plus S sinks per slot.
 *
 * A windowed cache is chapter 02's (or 05's) cache with fewer rows: each slot owns S+W of them
 * and position p is written to its logical row kv_cache_logical_row(p) (kv_cache_internal.h),
 * which the layout then places as any other row; a per-token row carries its own scales, so
 * overwriting a ring row overwrites everything that belonged to it. Here are the spec rules and
 * the one thing a window adds to the cache's state: under KV_POS_CACHE (StreamingLLM) keys are
 * stored before RoPE and attention rotates them by their cache index, with a table of the
 * S+W rotations built once. */
#include "kv_cache_internal.h"
#include "kv_ops.h"
#include "kv_quant.h"

#include <math.h>

/* Chapter 06's rules on a spec's retention fields (kv_window.h). */
int kv_cache_window_check(const char *who, const kv_cache_spec *spec, int caps, kv_err *err)
{
    if (spec->window.size == 0 && spec->window.n_sinks == 0 && spec->window.pos_scheme == KV_POS_ORIGINAL)
        return KV_OK;
    if (spec->window.size < 0 || spec->window.size > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "%s: window %d is outside [0, %d] (0 keeps every "
                       "token)", who, spec->window.size, KV_CACHE_MAX_CAPACITY);
    if (spec->window.n_sinks < 0 || spec->window.n_sinks > KV_CACHE_MAX_CAPACITY - spec->window.size)
        return kv_fail(err, KV_ERR_ARG, "%s: %d sink tokens (need 0 <= S and S + W <= %d)",
                       who, spec->window.n_sinks, KV_CACHE_MAX_CAPACITY);
    if (spec->window.pos_scheme != KV_POS_ORIGINAL && spec->window.pos_scheme != KV_POS_CACHE)
        return kv_fail(err, KV_ERR_ARG, "%s: position scheme %d is neither original (%d) nor "
                       "cache (%d)", who, spec->window.pos_scheme, KV_POS_ORIGINAL, KV_POS_CACHE);
    if (spec->window.size == 0)
        return kv_fail(err, KV_ERR_ARG, "%s: %d sinks or the cache position scheme without a "
                       "window (window 0 keeps every token: nothing to sink or renumber)", who,
                       spec->window.n_sinks);
    if (!(caps & KV_CACHE_CAN_WINDOW))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window cache (window %d, %d "
                       "sinks) is not built on this device yet", who, spec->window.size,
                       spec->window.n_sinks);
    if (kvq_is_kivi(spec->quant.dtype))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s with a sliding window: KIVI quantizes "
                       "32-token groups and keeps an fp32 window of rows that never move, "
                       "which a ring of reused rows breaks (use a per-token format: fp16, "
                       "bf16, int8, int8-gG, fp8)", who, kv_quant_name(spec->quant.dtype));
    return KV_OK;
}

float *kv_cache_rope_table(const kv_config *cfg, const kv_cache_spec *spec, size_t *bytes)
{
    /* cos and sin of every cache index, computed as kv_rope() computes them (in double from
     * the same per-pair frequencies, rounded once to float), so a key rotated at attention
     * time has the bits kv_rope() would have given it */
    const int64_t keep = kv_window_keep(spec->window.size, spec->window.n_sinks), P = cfg->rotary_dim / 2;
    *bytes = (size_t)(keep * P * 2 > 0 ? keep * P * 2 : 1) * sizeof(float);
    float *cs = kv_calloc(*bytes); /* [S+W][P][2] */
    if (!cs) return NULL;
    double freq[KV_ROPE_MAX_PAIRS]; /* [P] */
    kv_rope_freqs(cfg, freq);
    for (int64_t p = 0; p < keep; p++)
        for (int64_t i = 0; i < P; i++) {
            const double angle = (double)p * freq[i];
            cs[(p * P + i) * 2] = (float)cos(angle);
            cs[(p * P + i) * 2 + 1] = (float)sin(angle);
        }
    return cs;
}

int kv_cache_window_create(kv_cache *c, const char *who, const kv_config *cfg, kv_err *err)
{
    if (c->spec.window.size == 0 || c->spec.window.pos_scheme != KV_POS_CACHE) return KV_OK;
    size_t bytes = 0;
    c->rope_cs = kv_cache_rope_table(cfg, &c->spec, &bytes);
    if (!c->rope_cs)
        return kv_fail(err, KV_ERR_NOMEM, "%s: RoPE table of %lld positions", who,
                       (long long)kv_window_keep(c->spec.window.size, c->spec.window.n_sinks));
    return KV_OK;
}
