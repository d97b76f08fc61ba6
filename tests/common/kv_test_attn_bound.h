/**
 * @file kv_test_attn_bound.h
 * The attention error bound of test_attn_fast.c and test_gpu_decode.c (kv_test_attn_bound())
 * and what it is made of: for query head h at pos (query qh [d], the one the reference is fed),
 * S = max over the retained rows of Σ_j |q_j|·|k_j| / √d (a pair rotated at attention counts
 * with its norm: rotation keeps it) and V = max |v_j|, every element read as the reference
 * reads it (kv_cache_elem()).
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

/* The bound itself (test_attn_fast.c's top comment) for head h of the query qh at pos:
 *   |ô - o| <= 1.01·(expm1(2Δ) + (2N + 5 + 2R + extra)·u)·V,
 *   Δ = u·((⌊d/16⌋ + 30)·S + 4 + R·(2S + 5)),
 * N the retained rows. R = 0, extra = 0 for the CPU's one pass over the keys; a kernel that
 * splits the keys and merges the parts' log-sum-exps adds R merge roundings (each moves a
 * log-weight by u·(2S + 5) and the output by 2u·V) and its own extra roundings of the output
 * (test_gpu_decode.c derives both for the engine's kernel). */
static inline double kv_test_attn_bound(const kv_cache *c, int pos, int h, int H, const float *qh,
                                        double R, double extra)
{
    const int d = c->head_dim;
    const int64_t n = kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    double smax, vmax;
    kv_test_attn_sv(c, pos, h, H, qh, &smax, &vmax);
    const double u = 0x1p-24;
    const double delta = u * ((d / 16 + 30) * smax + 4 + R * (2 * smax + 5));
    return 1.01 * (expm1(2 * delta) + (2.0 * (double)n + 5 + 2 * R + extra) * u) * vmax;
}

#endif
