/* Chapter 04's part of the cache: the row codec, one token row in the layer's storage format.
 *
 * A row is where kv_cache_locate() says (kv_cache_internal.h): codes at row · row_bytes of its
 * head's codes, and, for the formats that keep scales per row (int8, int8-gG, int4/int2 per
 * token), its metadata entries at kvq_meta_index(row). Encoding is kv_quant_encode()'s, so the
 * bytes are the ones every other path (the CUDA write kernels, kv_quant's own tests) produces;
 * reading is the other direction, kv_cache_elem() in kv_cache.h, fused into attention.
 *
 * fp8 is per-token too, but its scale belongs to the sequence: a slot's scales are calibrated
 * from the chunk written at position 0 (the prefill), amax / max per KV head
 * (spec.quant.fp8_per_head) or over all heads of the layer's plane (its K, and its V). */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <math.h>
#include <string.h>

/* fp8 calibration from a slot's first chunk: amax of each head's finite values over the n
 * rows x [n][H_kv][d]; per tensor, the max over heads. Scales [H_kv] out. */
static void fp8_calibrate_chunk(int fmt, const float *x, int n, int n_kv_heads, int d,
                                int per_head, float *scales)
{
    float all = 0.0f;
    for (int h = 0; h < n_kv_heads; h++) {
        float amax = 0.0f;
        for (int t = 0; t < n; t++) {
            const float *r = x + ((size_t)t * n_kv_heads + h) * d;
            for (int j = 0; j < d; j++)
                if (!kvq_nonfinite(r[j])) amax = fmaxf(amax, fabsf(r[j]));
        }
        scales[h] = amax;
        all = fmaxf(all, amax);
    }
    for (int h = 0; h < n_kv_heads; h++)
        scales[h] = kv_quant_fp8_scale(fmt, per_head ? scales[h] : all);
}

void kv_cache_codec_begin(kv_cache *c, int layer, int slot, int pos, int n,
                          const float *const *x)
{
    const int fmt = c->fmt[layer];
    if (!kvq_is_fp8(fmt) || pos != 0) return;
    const int64_t head0 = (int64_t)slot * c->n_kv_heads;
    for (int i = 0; i < c->n_planes; i++)
        fp8_calibrate_chunk(fmt, x[i], n, c->n_kv_heads, c->head_dim, c->spec.quant.fp8_per_head,
                            kv_cache_plane_of(c->planes, c->n_layers, i, layer)->scale + head0);
}

int kv_cache_row_encode(kv_cache *c, int layer, kv_cache_plane *p, kv_row_loc at,
                        const float *x, kv_err *err)
{
    const int fmt = c->fmt[layer], d = c->head_dim, role = p->role;
    uint8_t *codes = p->codes + (at.rhead * c->rows + at.row) * p->row_bytes; /* [row_bytes] */
    if (fmt == KV_QF_F32) { /* chapter 02's copy */
        memcpy(codes, x, (size_t)d * sizeof(float));
        return KV_OK;
    }
    uint8_t *meta = p->meta ? (uint8_t *)p->meta + (at.rhead * p->meta_entries +
                                                    kvq_meta_index(fmt, role, at.row, 0, d)) * 4
                            : NULL;
    return kv_quant_encode(fmt, role, x, 1, d, p->scale ? p->scale[at.head] : 1.0f, codes,
                           meta, err);
}
