/**
 * @file kv_cache_spec.h
 * What a cache is built from: ::kv_cache_spec, the checks every device's cache runs on it, and
 * the spec strings of the CLI and the workload files ("int8", "fp8-e4m3/head", "int4/w64",
 * "window/w256/s4/cache", "h2o/b128/w16") that kv_needle_cache_spec() turns into one.
 *
 * The spec names what each chapter chooses: layout (02, 05), storage format and selective
 * layers (04), sliding window and sinks (06), selected-set retention (09). The cache builds the
 * storage it describes (kv_cache.h); the chapter-09 fields only describe what the engine's
 * retention state (kv_retain.h) will do, so the cache checks them (both devices refuse the same
 * specs with the same words) and otherwise leaves them to the engine.
 */
#ifndef KV_CACHE_SPEC_H
#define KV_CACHE_SPEC_H

#include <stdint.h>

#include "kv_config.h"
#include "kv_quant_math.h"
#include "kv_window.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where a sequence's K/V rows live. */
typedef enum {
    KV_LAYOUT_CONTIGUOUS = 0, /**< one [capacity][d] row block per (layer, slot, kv head) */
    KV_LAYOUT_PAGED = 1       /**< chapter 05: rows in a pool of blocks, found by block tables */
} kv_layout;
/** How a cached element is stored: the values are the ::kv_qformat formats of kv_quant.h. */
typedef enum {
    KV_DTYPE_F32 = KV_QF_F32 /**< fp32, b = 4; any other ::kv_qformat value is a quantized cache */
} kv_dtype;

/** Chapter 04: how each cached element is stored. */
typedef struct {
    int dtype; /**< ::kv_qformat (KV_DTYPE_F32 = fp32) */
    /** Selective layers: bit l set = layer l stores @c dtype, the others fp16;
     * 0 = every layer stores @c dtype. Models with more than 64 layers need 0. */
    uint64_t dtype_layers;
    int fp8_per_head; /**< fp8: 1 = one scale per kv head, 0 = one per tensor (layer's K or V) */
    int kivi_window;  /**< KIVI: fp32 window of newest tokens, a multiple of 32; 0 = 128 */
} kv_spec_quant;

/** Chapters 02 and 05: where a sequence's rows live. */
typedef struct {
    int kind;       /**< ::kv_layout */
    int block_size; /**< paged: tokens per block B (KIVI needs a multiple of 32) */
    int n_blocks;   /**< paged: blocks in the pool N */
} kv_spec_layout;

/** Chapter 06: retention by position (kv_window.h). size 0 keeps every token (chapters 02-05). */
typedef struct {
    int size;       /**< W: recent tokens kept per sequence; 0 = keep all */
    int n_sinks;    /**< S: first tokens kept forever (attention sinks); needs size > 0 */
    int pos_scheme; /**< ::kv_pos_scheme: RoPE by original position (0) or cache index (1) */
} kv_spec_window;

/** Chapter 09: selected-set retention (kv_retain.h). select 0 keeps and reads every token. */
typedef struct {
    int select;       /**< ::kv_select_method */
    int budget;       /**< B in tokens per (layer, KV head), or 0 to use ratio */
    double ratio;     /**< B = ceil(ratio · n) of the n positions seen, when budget is 0 */
    int window;       /**< W: recent positions always kept (SnapKV: observation window) */
    int sinks;        /**< S: first positions always kept */
    int dense_layers; /**< Quest, top-k: layers 0 .. this-1 read every position */
} kv_spec_retain;

/** How a cache is built: chosen by the caller, checked by kv_cache_create(). */
typedef struct {
    int n_slots;  /**< sequences the cache holds at once (the batch) */
    int capacity; /**< tokens per sequence slot (N max); with a window, positions per slot
                   *   (the stream's length bound), storage being min(capacity, S+W) rows */
    kv_spec_quant quant;   /**< chapter 04 */
    kv_spec_layout layout; /**< chapters 02, 05 */
    kv_spec_window window; /**< chapter 06 */
    kv_spec_retain retain; /**< chapter 09: only described here; the engine runs it */
} kv_cache_spec;

/** Bytes one stored element takes (b), metadata included, at head dim @p d
 * (kv_quant_bytes_per_element()); 4 for fp32. */
double kv_dtype_bytes_d(int dtype, int d);
/** Whole bytes of one stored fp element (4 fp32, 2 fp16/bf16); 0 for the quantized formats,
 * whose b is fractional (use kv_dtype_bytes_d()). */
size_t kv_dtype_bytes(int dtype);
/** Name of a dtype ("fp32", "int8", "int4-kivi", ...). */
const char *kv_dtype_name(int dtype);
/** The format layer @p layer of a cache built from @p spec stores. */
int kv_cache_spec_layer_dtype(const kv_cache_spec *spec, int layer);
/** Average bytes per cached element over the @p n_layers layers of @p spec (selective layers
 * mix formats), metadata included: b of the memory formula. */
double kv_cache_spec_bytes_per_element(const kv_cache_spec *spec, int n_layers, int d);
/**
 * Why @p spec cannot be built for @p cfg: KV_ERR_UNSUPPORTED (layout, dtype, or a dtype's
 * shape rule such as KIVI's 32 | d, named) or KV_ERR_ARG; KV_OK when it can. Shared by the
 * CPU and CUDA caches so both refuse the same specs with the same words (@p who prefixes).
 * A cache that does not implement retention yet calls this one: a windowed spec
 * (window.size > 0) is refused with KV_ERR_UNSUPPORTED. kv_cache_spec_check_caps() with
 * KV_CACHE_CAN_WINDOW accepts it.
 */
int kv_cache_spec_check(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                        kv_err *err);

/** Capabilities a cache implementation declares to kv_cache_spec_check_caps(). */
#define KV_CACHE_CAN_WINDOW 1 /**< sliding window + sinks, both position schemes (chapter 06) */

/**
 * kv_cache_spec_check() for a cache that implements the capabilities @p caps (a mask of
 * KV_CACHE_CAN_*): the CPU cache passes KV_CACHE_CAN_WINDOW. Window rules: window.size >= 0,
 * 0 <= n_sinks, sinks and the cache scheme need a window, S+W within the capacity limit;
 * KIVI with a window is KV_ERR_UNSUPPORTED.
 */
int kv_cache_spec_check_caps(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                             int caps, kv_err *err);


/** A spec for @p n_slots sequences of @p capacity tokens, contiguous fp32. */
kv_cache_spec kv_cache_spec_default(int n_slots, int capacity);

/** Selection methods of a cache spec (kv_cache_spec.retain.select, chapter 09; kv_retain.h runs
 * them). */
typedef enum {
    KV_SELECT_NONE = 0,     /**< keep and read every position (chapters 02-08) */
    KV_SELECT_L2_LARGE = 1, /**< keep the largest key norms */
    KV_SELECT_L2_SMALL = 2, /**< keep the smallest key norms */
    KV_SELECT_H2O = 3,      /**< heavy hitters: accumulated attention mass */
    KV_SELECT_SNAPKV = 4,   /**< prefill selection by the prompt's last queries */
    KV_SELECT_QUEST = 5,    /**< query-aware pages: nothing evicted, few pages read */
    KV_SELECT_TOPK = 6      /**< exact top-k keys per query: the reference for Quest */
} kv_select_method;

/** "l2-large", "l2-small", "h2o", "snapkv", "quest", "topk", "none". */
const char *kv_select_method_name(int method);
/** The method a name means, or -1. */
int kv_select_method_parse(const char *name);
/** 1 for the methods that evict (L2, H2O, SnapKV), 0 for the query-aware ones and none. */
int kv_select_method_evicts(int method);

/**
 * Chapter 09's rules on a spec (called by kv_cache_spec_check_caps(), so the CPU and CUDA
 * caches refuse the same specs with the same words): a known method; a budget, retain.budget
 * >= 1 or 0 < retain.ratio <= 1 (not both); S, W >= 0 with S + W <= retain.budget when the
 * budget is in tokens; retain.dense_layers >= 0 and 0 for the evicting methods (it is a
 * query-aware option); for SnapKV W >= 1 (the observation window);
 * contiguous layout, no window, no KIVI (KV_ERR_UNSUPPORTED, named). With retain.select 0 the
 * other retain fields must be 0. KV_OK, KV_ERR_ARG or KV_ERR_UNSUPPORTED.
 */
int kv_retain_spec_check(const char *who, const kv_cache_spec *spec, int n_layers, kv_err *err);

/** A count in a spec string: decimal digits only (no sign, no space), in [lo, hi], into *out.
 * 0, or -1 when @p w is not such a number. */
int kv_parse_count(const char *w, long lo, long hi, long *out);

/**
 * The cache a variant spec string means, for @p n_slots sequences of @p capacity tokens.
 * "fp32" (alias "exact"): contiguous fp32. Chapter 04: a storage format as kv_quant_parse()
 * reads it ("fp16", "int8", "int8-g32", "fp8-e4m3", "fp8", "int4", "int2", ...), then options
 * separated by '/': "head" (fp8: per-head scales; default per tensor), "wR" (KIVI: fp32
 * window of R tokens, a multiple of 32; default 128), "lA,B,..." (selective layers: only
 * layers A, B, ... use the format, the others fp16). E.g. "int4/w64", "fp8-e5m2/head",
 * "int8/l0". Chapter 06: "window" with "wN" (the window W, required), "sN" (S sinks), "cache"
 * or "original" (the position scheme, kv_window_scheme_parse(); default original) and at most
 * one per-token storage format, e.g. "window/w256/s4/cache", "window/w512/int8"; checked by the
 * window rules (KIVI refused).
 * Chapter 09: a selection method (kv_select_method_parse(): l2-large, l2-small,
 * h2o, snapkv, quest, topk) with a budget "bN" (N tokens per layer and KV head) or "rX" (a
 * ratio 0 < X <= 1 of the positions seen), then options "wN" (recent window: always kept;
 * SnapKV's observation window), "sN" (sinks: the first N positions always kept), "dN" (Quest,
 * top-k: layers 0 .. N-1 read everything) and at most one per-token storage format (fp16,
 * int8, fp8-e4m3, ...), e.g. "h2o/b128/w16", "snapkv/r0.1/w16/int8", "quest/b64/d2". The
 * spec is checked by kv_retain_spec_check(). Unknown -> KV_ERR_UNSUPPORTED naming the known
 * ones (an unknown option is named in the message). The needle grids' variant lines
 * (kv_needle.h), the CLI's --cache and the workload files all read specs through it.
 */
int kv_needle_cache_spec(const char *variant, int n_slots, int capacity, kv_cache_spec *out,
                         kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
