/**
 * @file kv_window.h
 * Chapter 06: sliding-window retention and attention sinks, as arithmetic on positions.
 *
 * A windowed cache keeps, per sequence, the first S tokens (the sinks) and the W most recent
 * tokens (the window) and forgets everything between. Three maps say everything the cache,
 * the attention and the forward pass need (symbols: S sinks, W window, t the query's position):
 *
 *  - retention: which positions a query at t sees, in position order. The sinks 0 .. S-1 and
 *    the window max(S, t-W+1) .. t: min(t+1, S+W) positions. As a mask over full attention:
 *    key s is visible to query t iff s <= t and (s < S or s > t - W)  (kv_window_visible()).
 *  - storage: the logical row a position lives in. Sinks own rows 0 .. S-1; the window is a
 *    ring of rows S .. S+W-1 reused cyclically: position p >= S goes to row S + (p-S) mod W,
 *    overwriting p - W, which no later query can see. A slot never needs more than S+W rows,
 *    however long the stream. The layout then maps a logical row to storage (contiguous rows,
 *    or a paged slot's block table: kv_view_row()).
 *  - positions (::kv_pos_scheme): what RoPE rotates by. KV_POS_ORIGINAL (Mistral-style): the
 *    token's position in the stream, keys rotated once when written. KV_POS_CACHE
 *    (StreamingLLM-style): the key's index in the retained list (sinks 0 .. S-1, then the
 *    window in order), and the query's own index, min(t, S+W-1). Those indices shift by one
 *    every step, so keys are cached before RoPE and rotated at attention time (kv_attention.c).
 *
 * Why rotate at attention time rather than re-rotate the cache: under KV_POS_CACHE every
 * retained key's position drops by one each step once the window slides. Re-rotating in place
 * would rewrite the W window rows per step (the sinks' indices do not move: nearly a full
 * cache write per token) and, worse, re-round them every time: fp32 rounding accumulates over a million steps, and a quantized
 * row would be decoded and re-encoded each step, its error compounding. Storing the key
 * before RoPE keeps every row written once and never touched again; the price is one rotation
 * of rotary_dim/2 pairs per key read (cos/sin from a table of the S+W indices, no
 * transcendental in the loop), and a key's bits at index i are exactly kv_rope()'s, so a
 * long stream cannot drift (tests/test_window.c checks 1M tokens against a fresh cache).
 * KV_POS_ORIGINAL needs none of this: a key's position never changes, it is rotated once.
 *
 * Equivalence: attention visits the retained positions in position order, so a windowed
 * cache gives the bits of full attention under the mask above (a masked key adds exp(-inf) = 0
 * to the softmax sum and 0·v to the output). A prefill chunk is written and attended in waves
 * (kv_window_chunk()) so no row is overwritten before the queries that read it have run.
 *
 * W = 0 keeps everything (the chapter 02 cache) and every map is the identity. All functions
 * are inline and KV_HD, so the CUDA kernels can share them.
 */
#ifndef KV_WINDOW_H
#define KV_WINDOW_H

#include <stdint.h>

#include "kv_quant_math.h" /* KV_HD */

#ifdef __cplusplus
extern "C" {
#endif

/** What RoPE rotates a windowed cache's keys and queries by. */
typedef enum {
    KV_POS_ORIGINAL = 0, /**< the position in the stream (Mistral sliding window) */
    KV_POS_CACHE = 1     /**< the index in the cache (StreamingLLM: sinks + recent window) */
} kv_pos_scheme;

/** Sinks StreamingLLM keeps by default (the first four tokens). */
#define KV_WINDOW_DEFAULT_SINKS 4

/** Rows a slot keeps at most: S + W, or 0 when nothing is forgotten (W = 0). */
static inline KV_HD int64_t kv_window_keep(int window, int n_sinks)
{
    return window > 0 ? (int64_t)n_sinks + window : 0;
}

/** Logical row of position @p pos: itself in the sinks (and for W = 0), else its ring row. */
static inline KV_HD int64_t kv_window_row(int window, int n_sinks, int64_t pos)
{
    if (window <= 0 || pos < n_sinks) return pos;
    return n_sinks + (pos - n_sinks) % window;
}

/** Rows a slot that has seen @p len tokens occupies: min(len, S+W) (len for W = 0). */
static inline KV_HD int64_t kv_window_rows(int window, int n_sinks, int64_t len)
{
    const int64_t keep = kv_window_keep(window, n_sinks);
    return keep > 0 && len > keep ? keep : len;
}

/** Positions a query at @p t attends to: min(t+1, S+W) (t+1 for W = 0). */
static inline KV_HD int64_t kv_window_count(int window, int n_sinks, int64_t t)
{
    return kv_window_rows(window, n_sinks, t + 1);
}

/** The @p i-th position (0 <= i < kv_window_count()) a query at @p t sees, in position order:
 * the sinks first, then the window. */
static inline KV_HD int64_t kv_window_pos(int window, int n_sinks, int64_t t, int64_t i)
{
    if (window <= 0) return i;
    const int64_t ns = t + 1 < n_sinks ? t + 1 : n_sinks;   /* sinks that exist yet */
    if (i < ns) return i;
    const int64_t w0 = t - window + 1 > n_sinks ? t - window + 1 : n_sinks; /* oldest kept */
    return w0 + (i - ns);
}

/**
 * The retained positions of a query at t and their rows, walked in order without a division
 * per step (what attention loops over): kv_window_walk_start(), then kv_window_walk_next()
 * kv_window_count() - 1 times. pos and row are kv_window_pos() and kv_window_row() of the step.
 */
typedef struct {
    int window, n_sinks;
    int64_t ns, w0; /* sinks visited first (all t+1 positions for W = 0), oldest window position */
    int64_t pos, row;
} kv_window_walk;

static inline KV_HD void kv_window_walk_start(kv_window_walk *k, int window, int n_sinks,
                                              int64_t t)
{
    k->window = window;
    k->n_sinks = n_sinks;
    k->ns = window <= 0 ? t + 1 : (t + 1 < n_sinks ? t + 1 : n_sinks);
    k->w0 = window <= 0 ? t + 1 : (t - window + 1 > n_sinks ? t - window + 1 : n_sinks);
    k->pos = k->ns > 0 ? 0 : k->w0;
    k->row = kv_window_row(window, n_sinks, k->pos);
}

static inline KV_HD void kv_window_walk_next(kv_window_walk *k)
{
    k->pos++;
    if (k->pos < k->ns) { /* still in the sinks (or no window): row = position */
        k->row = k->pos;
    } else if (k->pos == k->ns) { /* past the sinks: jump to the window's oldest position */
        k->pos = k->w0;
        k->row = kv_window_row(k->window, k->n_sinks, k->pos);
    } else if (++k->row == (int64_t)k->n_sinks + k->window) { /* the ring wraps */
        k->row = k->n_sinks;
    }
}

/** 1 when key position @p s is visible to a query at @p t: the mask equivalent to the window. */
static inline KV_HD int kv_window_visible(int window, int n_sinks, int64_t t, int64_t s)
{
    if (s > t || s < 0) return 0;
    return window <= 0 || s < n_sinks || s > t - window;
}

/** The position RoPE rotates the query at @p t by: t (original), or min(t, S+W-1) (cache). */
static inline KV_HD int64_t kv_window_query_pos(int window, int n_sinks, int scheme, int64_t t)
{
    if (scheme != KV_POS_CACHE || window <= 0) return t;
    return kv_window_count(window, n_sinks, t) - 1;
}

/**
 * How many of @p n new tokens at positions pos .. pos+n-1 can be written before any of them
 * attends without overwriting a row one of them still reads. A chunk that stays inside the
 * first S+W rows is written whole (nothing is overwritten yet); after that each new token's
 * ring row holds position p - W, which every earlier token of the chunk still sees, so the
 * rest goes one token at a time. W = 0: all n.
 */
static inline KV_HD int kv_window_chunk(int window, int n_sinks, int64_t pos, int n)
{
    const int64_t keep = kv_window_keep(window, n_sinks);
    if (keep == 0 || pos + n <= keep) return n;
    if (pos < keep) return (int)(keep - pos);
    return n > 0 ? 1 : 0;
}

/**
 * Query-key pairs (attended positions) summed over the queries at positions p0 .. p0+n-1:
 * sum of kv_window_count(), in closed form. What the FLOP and byte counters use.
 */
double kv_window_attended(int window, int n_sinks, int64_t p0, int64_t n);

/** "original" / "cache" (also "mistral" / "streaming") -> ::kv_pos_scheme, or -1. */
int kv_window_scheme_parse(const char *name);
/** ::kv_pos_scheme -> "original" / "cache". */
const char *kv_window_scheme_name(int scheme);

#ifdef __cplusplus
}
#endif
#endif
