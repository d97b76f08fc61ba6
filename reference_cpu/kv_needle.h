/**
 * @file kv_needle.h
 * The needle-in-a-haystack grid over the recall models (kv_recall.h): context lengths ×
 * needle depths × cache variants, each cell passing when the greedy answer is the planted
 * value. Written once over ::kv_backend, so the CPU and the CUDA engine run the same cells.
 *
 * One context per (model, length, variant, seed) holds a needle at every depth (distinct
 * keys); after the haystack the questions follow one by one, each answer appended before the
 * next question, so one prefill serves every depth.
 *
 * A cache variant is a spec string ("fp32", or a chapter 04 storage format such as "int8",
 * "int4/w64", "fp8-e5m2/head": kv_needle_cache_spec()) with the outcome the chapter predicts for
 * it, e.g. "all" (every cell passes) or "within:W" (passes iff the needle is at most W tokens
 * before its question). Later chapters add variants to kv_needle_cache_spec() and predictions
 * to ::kv_needle_rule.
 */
#ifndef KV_NEEDLE_H
#define KV_NEEDLE_H

#include "kv_backend.h"
#include "kv_recall.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_NEEDLE_MAX_LENGTHS 16
#define KV_NEEDLE_MAX_DEPTHS KV_RECALL_KEYS /* one key per needle in a context */
#define KV_NEEDLE_MAX_VARIANTS 8
#define KV_NEEDLE_MAX_SEEDS 8

/** The outcome a variant predicts for a cell. */
typedef enum {
    KV_EXPECT_ALL = 0,   /**< every cell passes (exact caches) */
    KV_EXPECT_NONE = 1,  /**< every cell fails */
    KV_EXPECT_ANY = 2,   /**< measured, not asserted */
    KV_EXPECT_WITHIN = 3 /**< passes iff distance (question - needle) <= arg */
} kv_needle_rule;

typedef struct {
    char spec[64]; /**< cache variant, e.g. "fp32" */
    int rule;      /**< ::kv_needle_rule */
    long arg;      /**< the rule's number (WITHIN: tokens) */
} kv_needle_variant;

/** A grid: what datasets/needle/ files describe. */
typedef struct {
    char name[64];
    int n_models, models[2];                  /**< KV_MODEL_RECALL_* */
    int n_lengths, lengths[KV_NEEDLE_MAX_LENGTHS]; /**< haystack tokens (BOS and needles included) */
    int n_depths, depths[KV_NEEDLE_MAX_DEPTHS];    /**< percent, 0..100 */
    int n_variants;
    kv_needle_variant variants[KV_NEEDLE_MAX_VARIANTS];
    int n_seeds;
    uint64_t seeds[KV_NEEDLE_MAX_SEEDS]; /**< haystack seeds (filler, keys, values) */
    uint64_t model_seed;                 /**< recall model seed (default 1) */
} kv_needle_spec;

/** Both models, lengths 1024 4096, depths 0 25 50 75 100, variant "fp32 all", seed 1. */
void kv_needle_spec_default(kv_needle_spec *s);

/**
 * Parse a spec from text (the datasets/needle/ format, described in datasets/needle/README.md):
 * lines "name N", "models direct induction", "lengths 1024 4096", "depths 0 50 100",
 * "variant fp32 all", "seeds 1 2", "model-seed 1"; '#' starts a comment. Errors name the line.
 * Fields not given keep the values @p s already holds (call kv_needle_spec_default() first).
 */
int kv_needle_spec_parse(const char *text, kv_needle_spec *s, kv_err *err);
/** kv_needle_spec_parse() on a file. */
int kv_needle_spec_read(const char *path, kv_needle_spec *s, kv_err *err);
/** Parse one variant word + rule ("fp32", "all" | "none" | "any" | "within:W"). */
int kv_needle_variant_parse(const char *spec, const char *rule, kv_needle_variant *v, kv_err *err);

/**
 * The cache a variant spec string means, for @p n_slots sequences of @p capacity tokens.
 * "fp32" (alias "exact"): contiguous fp32. Chapter 04: a storage format as kv_quant_parse()
 * reads it ("fp16", "int8", "int8-g32", "fp8-e4m3", "fp8", "int4", "int2", ...), then options
 * separated by '/': "head" (fp8: per-head scales; default per tensor), "wR" (KIVI: fp32
 * window of R tokens, a multiple of 32; default 128), "lA,B,..." (selective layers: only
 * layers A, B, ... use the format, the others fp16). E.g. "int4/w64", "fp8-e5m2/head",
 * "int8/l0". Unknown -> KV_ERR_UNSUPPORTED naming the known ones.
 */
int kv_needle_cache_spec(const char *variant, int n_slots, int capacity, kv_cache_spec *out,
                         kv_err *err);

/** One needle in a haystack. */
typedef struct {
    int depth;    /**< percent */
    int key, value;
    int pos;      /**< position of the fact's first token */
    int n_tokens; /**< fact tokens (1 direct, 2 induction) */
} kv_needle_item;

/**
 * Build a haystack of @p length tokens: BOS, seeded filler, and one needle per depth at
 * position 1 + round(depth/100 · (length - 1 - fact tokens)), moved just enough that needles
 * never overlap. Keys are distinct (a seeded permutation), values seeded.
 * tokens [length], items [n_depths] (in the order of @p depths).
 */
int kv_needle_build(int kind, int length, const int *depths, int n_depths, uint64_t seed,
                    int *tokens, kv_needle_item *items, kv_err *err);

/** What one cell measured. */
typedef struct {
    int kind, length, depth, variant; /**< variant: index into the spec */
    uint64_t seed;
    int key, value, position;
    long distance;      /**< question position - needle position */
    int answer;         /**< greedy token after the question */
    int pass;           /**< answer == the planted value token */
    int expected;       /**< 1 predicted pass, 0 predicted fail, -1 not asserted */
    float logit_value;  /**< logit of the planted value */
    float logit_other;  /**< best logit of any other token */
    float margin;       /**< logit_value - logit_other (> 0 iff pass, ties aside) */
} kv_needle_result;

/** Progress: @p done of @p total tokens processed; @p what names the current context. */
typedef void (*kv_needle_progress)(void *user, const char *what, long done, long total);

/**
 * Run one context on @p b (slot @p slot is reset first): prefill the haystack in chunks of
 * @p chunk tokens (<= 0: 512), then ask each item's question and append the greedy answer.
 * Needs capacity >= length + 2·n_items. Fills res [n_items] (variant, seed, expected left 0).
 * @p cb (may be NULL) is told done0 + tokens done so far, of @p total, after every chunk.
 */
int kv_needle_run(kv_backend *b, int slot, int kind, const int *tokens, int length,
                  const kv_needle_item *items, int n_items, int chunk, kv_needle_result *res,
                  kv_needle_progress cb, void *user, long done0, long total, kv_err *err);

/** The outcome @p v predicts for @p r: 1 pass, 0 fail, -1 not asserted. */
int kv_needle_expect(const kv_needle_variant *v, const kv_needle_result *r);

/** Makes a backend for a model and cache spec (CPU: kv_backend_cpu; GPU: kvcu_backend_create). */
typedef int (*kv_needle_backend_fn)(kv_backend **out, const kv_model *m, const kv_cache_spec *spec,
                                    void *user, kv_err *err);

/**
 * Run a whole grid: for each model, variant, seed and length one context with a needle per
 * depth. *out is allocated (free()) with n_models·n_variants·n_seeds·n_lengths·n_depths
 * results in that nesting order, each with its prediction filled.
 */
int kv_needle_grid(const kv_needle_spec *s, kv_needle_backend_fn make, void *make_user,
                   kv_needle_progress cb, void *user, kv_needle_result **out, int *n_out,
                   kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
