/**
 * @file kv_test_attn_bound.h
 * What the attention error bounds of test_attn_fast.c and test_gpu_decode.c are made of: for
 * query head h at pos (query qh [d], the one the reference is fed), S = max over the retained
 * rows of Σ_j |q_j|·|k_j| / √d (a pair rotated at attention counts with its norm: rotation keeps
 * it) and V = max |v_j|, every element read as the reference reads it (kv_cache_elem()).
 */
#ifndef KV_TEST_ATTN_BOUND_H
#define KV_TEST_ATTN_BOUND_H

#include <math.h>

#include "kv_attention.h"
#include "kv_cache.h"
#include "kv_heads.h"
#include "kv_window.h"

static inline void kv_test_attn_sv(const kv_cache *c, int pos, int h, int H, const float *qh,
                                   double *s_max, double *v_max)
{
    const int d = c->head_dim, W = c->spec.window.size, S = c->spec.window.n_sinks;
    const int kvh = kv_attn_kv_head(h, H, c->n_kv_heads);
    const int rd = c->rope_cs ? c->rotary_dim / 2 * 2 : 0; /* dims rotated at attention */
    const kv_head_view kh = kv_cache_view(c, 0, 0, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(c, 0, 0, kvh, KV_QROLE_VALUE);
    const int64_t n = kv_window_count(W, S, pos);
    double smax = 0.0, vmax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = kv_window_row(W, S, kv_window_pos(W, S, pos, i));
        double sq = 0.0;
        for (int j = 0; j < d; j++) {
            double a = fabs(kv_cache_elem(&kh, row, j));
            if (j < rd) a = hypot(kv_cache_elem(&kh, row, j & ~1), kv_cache_elem(&kh, row, j | 1));
            sq += fabs(qh[j]) * a;
            vmax = fmax(vmax, fabs(kv_cache_elem(&vh, row, j)));
        }
        smax = fmax(smax, sq / sqrt((double)d));
    }
    *s_max = smax;
    *v_max = vmax;
}

#endif
