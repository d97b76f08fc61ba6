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
 * A cache variant is a spec string ("fp32", a chapter 04 storage format such as "int8",
 * "int4/w64", "fp8-e5m2/head", or a chapter 09 selection method such as "h2o/b64/w16":
 * kv_needle_cache_spec()) with the outcome the chapter predicts for it, e.g. "all" (every cell
 * passes), "within:W" (passes iff the needle is at most W tokens before its question) or
 * "kept:E,W" (chapter 09: the fact token attention reads lies before position E or within W
 * tokens of the question). Later chapters add variants to kv_needle_cache_spec() and
 * predictions to ::kv_needle_rule.
 *
 * Steps matter for chapter 09: a retention method evicts at the end of a forward step, never
 * inside one, so the haystack is prefilled in chunks ("chunk N" in a spec; default 512) and
 * every question is a step of its own: eviction always falls between the haystack and the
 * question, as it would between two turns of a conversation.
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
#define KV_NEEDLE_MAX_VARIANTS 24
#define KV_NEEDLE_MAX_SEEDS 8

/** The outcome a variant predicts for a cell. */
typedef enum {
    KV_EXPECT_ALL = 0,   /**< every cell passes (exact caches) */
    KV_EXPECT_NONE = 1,  /**< every cell fails */
    KV_EXPECT_ANY = 2,   /**< measured, not asserted */
    KV_EXPECT_WITHIN = 3, /**< passes iff distance (question - needle) <= arg */
    /** chapter 09, "kept:E,W": passes iff the fact's last token (the one attention reads:
     * direct the fact, induction the value) is at a position < arg (sinks, or the first
     * positions a heavy-hitter method never lets go) or at most arg2 tokens before the
     * question (the recent window) */
    KV_EXPECT_KEPT = 4,
    /** chapter 09, "atleast:E,W": cells KEPT says pass must pass; the others are measured,
     * not asserted (a method that may also keep older needles, by chance of its scores) */
    KV_EXPECT_ATLEAST = 5,
    /** chapter 09, "page-split:P": fails iff the fact's two tokens straddle a page boundary
     * (the value token starts a page of P positions: a page-selecting method's previous-token
     * head misses the key on the page before); passes otherwise (every direct cell) */
    KV_EXPECT_PAGE_SPLIT = 6,
    /** chapter 09, "from:E": passes iff the fact's last token is at a position >= E (a ratio
     * budget still below its window evicts everything older than the window at first) */
    KV_EXPECT_FROM = 7
} kv_needle_rule;

typedef struct {
    char spec[64]; /**< cache variant, e.g. "fp32" */
    int rule;      /**< ::kv_needle_rule */
    long arg;      /**< the rule's number (WITHIN: tokens; KEPT, ATLEAST, FROM: E; PAGE_SPLIT: P) */
    long arg2;     /**< KEPT, ATLEAST: W */
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
    int chunk; /**< haystack tokens per prefill step ("chunk N"; 0: 512). Chapter 09 evicts
                * between steps, so this sets how often a retention method chooses. */
} kv_needle_spec;

/** Both models, lengths 1024 4096, depths 0 25 50 75 100, variant "fp32 all", seed 1. */
void kv_needle_spec_default(kv_needle_spec *s);

/**
 * Parse a spec from text (the datasets/needle/ format, described in datasets/needle/README.md):
 * lines "name N", "models direct induction", "lengths 1024 4096", "depths 0 50 100",
 * "variant fp32 all", "seeds 1 2", "model-seed 1", "chunk 64"; '#' starts a comment. Errors
 * name the line.
 * Fields not given keep the values @p s already holds (call kv_needle_spec_default() first).
 */
int kv_needle_spec_parse(const char *text, kv_needle_spec *s, kv_err *err);
/** kv_needle_spec_parse() on a file. */
int kv_needle_spec_read(const char *path, kv_needle_spec *s, kv_err *err);
/** Parse one variant word + rule ("fp32", "all" | "none" | "any" | "within:W" | "kept:E,W" |
 * "atleast:E,W" | "page-split:P" | "from:E"). */
int kv_needle_variant_parse(const char *spec, const char *rule, kv_needle_variant *v, kv_err *err);

/* The cache a variant's spec string means: kv_needle_cache_spec() (kv_cache_spec.h). */

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
