/*
 * Fuzz target: cache-spec strings (kv_needle_cache_spec in kv_cache_spec.c, what --cache and the needle grids'
 * `variant` lines take: "fp32", "int8-g32", "fp8-e4m3/head", "int4/w64", "int8/l0,1",
 * "h2o/b64/w16", "snapkv/r0.1/w16/int8", "quest/b64/d2", ...), and beside it the other small
 * text parsers of reference_cpu/ no other target reaches on their own: a needle variant's
 * prediction rule (kv_needle_variant_parse) and the name lookups kv_quant_parse,
 * kv_select_method_parse, kv_window_scheme_parse and kv_recall_kind_parse.
 *
 * Input: the cache string (the bytes up to the first NUL, at most MAX_INPUT bytes looked at),
 * then optionally a NUL and a prediction rule ("all", "within:5", "kept:10,4", ...).
 *
 * Properties:
 *  - the parser returns KV_OK, or KV_ERR_UNSUPPORTED with a message; the same status for
 *    every (slots, capacity) it is asked for, and on KV_OK the same spec but for those two;
 *  - an accepted "window/..." spec has a window of at least one token, S + W within a slot's
 *    largest capacity, a known scheme and one per-token format, nothing else;
 *  - any other accepted spec is contiguous, has no chapter 06 window, a known format,
 *    per-head fp8 scales only on fp8, a KIVI window (a multiple of 32 in [32, 2^20]) only on KIVI,
 *    selective layers only without a selection method, and selection fields that pass
 *    kv_retain_spec_check() (one budget, S + W within it, dense layers only for quest/top-k,
 *    no KIVI) or are all 0 without a method;
 *  - kv_cache_spec_check() against two small models (d 64, L 2 and d 16, L 64) returns KV_OK
 *    or an error with a message; kv_cache_spec_check_caps(KV_CACHE_CAN_WINDOW), what the CPU
 *    cache builds, gives the same status for a spec without a window, and kv_cache_spec_check()
 *    (a device without windows) refuses every spec with one; when the CPU check is OK,
 *    kv_retain_cache_create() builds the cache for a tiny capacity (its memory bounded: a
 *    KIVI window of 2^20 rows is only checked) with the rows a window keeps, with the engine's
 *    retention state exactly when the spec selects, and kv_retain_cache_free() releases both
 *    (LeakSanitizer sees the rest);
 *  - the rule parser returns KV_OK with the spec copied and a known rule, or KV_ERR_ARG with
 *    a message; a name lookup returns -1 or a value whose name parses back to it.
 */
#include "fuzz_common.h"
#include "kv_cache.h"
#include "kv_needle.h"
#include "kv_quant.h"
#include "kv_recall.h"
#include "kv_retain.h"
#include "kv_window.h"

#define MAX_INPUT 256
#define MAX_CAPACITY (1 << 24) /* kv_cache.c: KV_CACHE_MAX_CAPACITY, tokens per slot */

/* Fields of two parses of one string, slots and capacity aside, agree. */
static int same_spec(const kv_cache_spec *a, const kv_cache_spec *b)
{
    return a->layout.kind == b->layout.kind && a->quant.dtype == b->quant.dtype &&
           a->quant.dtype_layers == b->quant.dtype_layers &&
           a->quant.fp8_per_head == b->quant.fp8_per_head &&
           a->quant.kivi_window == b->quant.kivi_window &&
           a->layout.block_size == b->layout.block_size && a->layout.n_blocks == b->layout.n_blocks &&
           a->window.size == b->window.size && a->window.n_sinks == b->window.n_sinks &&
           a->window.pos_scheme == b->window.pos_scheme &&
           a->retain.select == b->retain.select && a->retain.budget == b->retain.budget &&
           a->retain.ratio == b->retain.ratio && a->retain.window == b->retain.window &&
           a->retain.sinks == b->retain.sinks && a->retain.dense_layers == b->retain.dense_layers;
}

static void check_ranges(const char *v, const kv_cache_spec *s, int n_slots, int capacity)
{
    FUZZ_REQUIRE(s->n_slots == n_slots && s->capacity == capacity, "'%s': %d slots of %d", v,
                 s->n_slots, s->capacity);
    FUZZ_REQUIRE(s->layout.kind == KV_LAYOUT_CONTIGUOUS && !s->layout.block_size &&
                     !s->layout.n_blocks,
                 "'%s': layout %d, blocks %d x %d", v, s->layout.kind, s->layout.n_blocks,
                 s->layout.block_size);
    /* chapter 06's "window/wN[/sN][/cache|original][/FORMAT]": a window of at least one token,
     * S + W within a slot's largest capacity, one per-token format and nothing of chapter 09;
     * every other variant has no window at all */
    if (!strncmp(v, "window/", 7)) {
        FUZZ_REQUIRE(s->window.size >= 1 && s->window.n_sinks >= 0 &&
                         (int64_t)s->window.size + s->window.n_sinks <= MAX_CAPACITY &&
                         (s->window.pos_scheme == KV_POS_ORIGINAL ||
                          s->window.pos_scheme == KV_POS_CACHE),
                     "'%s': window %d, sinks %d, scheme %d", v, s->window.size, s->window.n_sinks,
                     s->window.pos_scheme);
        FUZZ_REQUIRE(s->quant.dtype >= 0 && s->quant.dtype < KV_QF_COUNT &&
                         !kvq_is_kivi(s->quant.dtype) && !s->quant.dtype_layers &&
                         !s->quant.fp8_per_head && !s->quant.kivi_window &&
                         s->retain.select == KV_SELECT_NONE,
                     "'%s': %s (layers 0x%llx, per-head %d, KIVI %d, method %d) beside a window",
                     v, kv_quant_name(s->quant.dtype), (unsigned long long)s->quant.dtype_layers,
                     s->quant.fp8_per_head, s->quant.kivi_window, s->retain.select);
        return;
    }
    FUZZ_REQUIRE(!s->window.size && !s->window.n_sinks && s->window.pos_scheme == KV_POS_ORIGINAL,
                 "'%s': window %d, sinks %d, scheme %d", v, s->window.size, s->window.n_sinks,
                 s->window.pos_scheme);
    FUZZ_REQUIRE(s->quant.dtype >= 0 && s->quant.dtype < KV_QF_COUNT, "'%s': dtype %d", v, s->quant.dtype);
    FUZZ_REQUIRE(s->quant.fp8_per_head == 0 ||
                     (s->quant.fp8_per_head == 1 && kvq_is_fp8(s->quant.dtype)),
                 "'%s': fp8_per_head %d on %s", v, s->quant.fp8_per_head, kv_quant_name(s->quant.dtype));
    FUZZ_REQUIRE(s->quant.kivi_window == 0 ||
                     (kvq_is_kivi(s->quant.dtype) && s->quant.kivi_window >= 32 &&
                      s->quant.kivi_window <= (1 << 20) && s->quant.kivi_window % 32 == 0),
                 "'%s': KIVI window %d on %s", v, s->quant.kivi_window,
                 kv_quant_name(s->quant.dtype));
    FUZZ_REQUIRE(s->retain.select >= KV_SELECT_NONE && s->retain.select <= KV_SELECT_TOPK,
                 "'%s': method %d", v, s->retain.select);
    if (s->retain.select == KV_SELECT_NONE) {
        FUZZ_REQUIRE(!s->retain.budget && s->retain.ratio == 0.0 && !s->retain.window &&
                         !s->retain.sinks && !s->retain.dense_layers,
                     "'%s': selection fields without a method", v);
        return;
    }
    FUZZ_REQUIRE(!s->quant.dtype_layers && !s->quant.fp8_per_head && !s->quant.kivi_window &&
                     !kvq_is_kivi(s->quant.dtype),
                 "'%s': format options (layers 0x%llx, per-head %d, KIVI %d, %s) on %s", v,
                 (unsigned long long)s->quant.dtype_layers, s->quant.fp8_per_head, s->quant.kivi_window,
                 kv_quant_name(s->quant.dtype), kv_select_method_name(s->retain.select));
    FUZZ_REQUIRE((s->retain.budget >= 1 && s->retain.budget <= (1 << 30) && s->retain.ratio == 0.0) ||
                     (s->retain.budget == 0 && s->retain.ratio > 0.0 && s->retain.ratio <= 1.0),
                 "'%s': budget %d, ratio %g", v, s->retain.budget, s->retain.ratio);
    FUZZ_REQUIRE(s->retain.window >= 0 && s->retain.window <= (1 << 30) && s->retain.sinks >= 0 &&
                     s->retain.sinks <= (1 << 30) && s->retain.dense_layers >= 0 &&
                     s->retain.dense_layers <= (1 << 30),
                 "'%s': window %d, sinks %d, dense %d", v, s->retain.window, s->retain.sinks,
                 s->retain.dense_layers);
    FUZZ_REQUIRE(!s->retain.budget ||
                     (int64_t)s->retain.window + s->retain.sinks <= s->retain.budget,
                 "'%s': S %d + W %d over the budget %d", v, s->retain.sinks, s->retain.window,
                 s->retain.budget);
    FUZZ_REQUIRE(!s->retain.dense_layers || !kv_select_method_evicts(s->retain.select),
                 "'%s': dense layers on %s", v, kv_select_method_name(s->retain.select));
    FUZZ_REQUIRE(s->retain.select != KV_SELECT_SNAPKV || s->retain.window >= 1,
                 "'%s': SnapKV without an observation window", v);
    kv_err e = {{0}};
    FUZZ_REQUIRE(kv_retain_spec_check("fuzz", s, 0, &e) == KV_OK, "'%s': %s", v, e.msg);
}

/* A model of dim = H·d with L layers and one KV head (nothing but the shape is read). */
static kv_config model(int d, int heads, int layers)
{
    kv_config c = {d * heads, 4 * d * heads, layers, heads, 1, 32, 64, 0, 0, 0, 0, 0, 0, {0}};
    kv_config_set_defaults(&c);
    return c;
}

static void check_build(const char *v, const kv_cache_spec *s, const kv_config *cfg)
{
    kv_err e = {{0}}, e2 = {{0}};
    const int windowed = s->window.size > 0;
    const int rc0 = kv_cache_spec_check("fuzz", cfg, s, &e2);
    const int rc = kv_cache_spec_check_caps("fuzz", cfg, s, KV_CACHE_CAN_WINDOW, &e);
    /* a device that builds no window refuses every window spec, and only those */
    FUZZ_REQUIRE(windowed ? rc0 != KV_OK && (rc != KV_OK || rc0 == KV_ERR_UNSUPPORTED)
                          : rc0 == rc,
                 "'%s': check %d, check with windows %d", v, rc0, rc);
    if (rc != KV_OK) {
        FUZZ_REQUIRE((rc == KV_ERR_UNSUPPORTED || rc == KV_ERR_ARG) && e.msg[0] &&
                         memchr(e.msg, '\0', sizeof e.msg),
                     "'%s' on d %d, L %d: status %d, message '%s'", v,
                     kv_config_head_dim(cfg), cfg->n_layers, rc, e.msg);
        return;
    }
    /* the KIVI fp32 ring is window·d floats per (layer, K/V, slot, head) whatever the
     * capacity: build it only when that stays small */
    const int64_t ring = kvq_is_kivi(s->quant.dtype)
                             ? (int64_t)cfg->n_layers * 2 * s->n_slots * cfg->n_kv_heads *
                                   (s->quant.kivi_window ? s->quant.kivi_window : KV_KIVI_WINDOW) *
                                   kv_config_head_dim(cfg) * 4
                             : 0;
    if (ring > (1 << 21)) return;
    kv_cache c;
    memset(&c, 0, sizeof c);
    const int cr = kv_retain_cache_create(&c, cfg, s, &e); /* the cache, and the engine's state */
    FUZZ_REQUIRE(cr == KV_OK, "'%s' passed the check but kv_retain_cache_create says %d: %s", v, cr,
                 e.msg);
    FUZZ_REQUIRE(c.n_layers == cfg->n_layers && c.head_dim == kv_config_head_dim(cfg) &&
                     c.rows == kv_window_rows(s->window.size, s->window.n_sinks, s->capacity) && c.spec.quant.dtype == s->quant.dtype && c.fmt && c.len,
                 "'%s': cache of %d layers, d %d, %d rows", v, c.n_layers, c.head_dim, c.rows);
    for (int l = 0; l < c.n_layers; l++)
        FUZZ_REQUIRE(c.fmt[l] == kv_cache_spec_layer_dtype(s, l), "'%s': layer %d stores %d", v,
                     l, c.fmt[l]);
    FUZZ_REQUIRE((s->retain.select != KV_SELECT_NONE) == (c.retain != NULL), "'%s': retain state %p", v,
                 (void *)c.retain);
    kv_retain_cache_free(&c);
}

static void check_rule(const char *spec, const char *rule)
{
    kv_needle_variant nv;
    kv_err e = {{0}};
    const int rc = kv_needle_variant_parse(spec, rule, &nv, &e);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_ARG && e.msg[0], "rule '%s': status %d, message '%s'", rule, rc,
                     e.msg);
        return;
    }
    FUZZ_REQUIRE(spec[0] && !strcmp(nv.spec, spec), "rule '%s': spec '%s' kept as '%s'", rule,
                 spec, nv.spec);
    FUZZ_REQUIRE(nv.rule >= KV_EXPECT_ALL && nv.rule <= KV_EXPECT_FROM, "rule '%s': %d", rule,
                 nv.rule);
    FUZZ_REQUIRE(nv.arg >= 0 && nv.arg <= (1L << 30) && nv.arg2 >= 0 && nv.arg2 <= (1L << 30),
                 "rule '%s': arguments %ld, %ld", rule, nv.arg, nv.arg2);
    FUZZ_REQUIRE(nv.rule != KV_EXPECT_PAGE_SPLIT || nv.arg >= 1, "rule '%s': page 0", rule);
}

static void check_names(const char *w)
{
    int k = kv_quant_parse(w);
    FUZZ_REQUIRE(k == -1 || (k >= 0 && k < KV_QF_COUNT && kv_quant_parse(kv_quant_name(k)) == k),
                 "format '%s' -> %d", w, k);
    k = kv_select_method_parse(w);
    FUZZ_REQUIRE(k == -1 || (k >= KV_SELECT_NONE && k <= KV_SELECT_TOPK &&
                             kv_select_method_parse(kv_select_method_name(k)) == k),
                 "method '%s' -> %d", w, k);
    k = kv_window_scheme_parse(w);
    FUZZ_REQUIRE(k == -1 || ((k == KV_POS_ORIGINAL || k == KV_POS_CACHE) &&
                             kv_window_scheme_parse(kv_window_scheme_name(k)) == k),
                 "scheme '%s' -> %d", w, k);
    k = kv_recall_kind_parse(w);
    FUZZ_REQUIRE(k == -1 || ((k == KV_MODEL_RECALL_DIRECT || k == KV_MODEL_RECALL_INDUCTION) &&
                             kv_recall_kind_parse(kv_recall_kind_name(k)) == k),
                 "model kind '%s' -> %d", w, k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size > MAX_INPUT ? MAX_INPUT : size);
    const size_t n = size > MAX_INPUT ? MAX_INPUT : size, len = strlen(text);
    const char *variant = text, *rule = len + 1 < n ? text + len + 1 : NULL;

    /* the string for a few (slots, capacity): the tiny one is the one built below */
    static const int slots[3] = {1, 2, 1}, caps[3] = {1, 40, MAX_CAPACITY};
    kv_cache_spec s[3];
    int rc[3];
    for (int i = 0; i < 3; i++) {
        kv_err e = {{0}};
        rc[i] = kv_needle_cache_spec(variant, slots[i], caps[i], &s[i], &e);
        if (rc[i] != KV_OK)
            FUZZ_REQUIRE(rc[i] == KV_ERR_UNSUPPORTED && e.msg[0] && memchr(e.msg, '\0', sizeof e.msg),
                         "'%s': status %d, message '%s'", variant, rc[i], e.msg);
        else
            check_ranges(variant, &s[i], slots[i], caps[i]);
        FUZZ_REQUIRE(rc[i] == rc[0], "'%s': status %d at capacity %d, %d at %d", variant, rc[i],
                     caps[i], rc[0], caps[0]);
        FUZZ_REQUIRE(rc[i] != KV_OK || same_spec(&s[i], &s[0]),
                     "'%s': the spec depends on the capacity", variant);
    }
    if (rc[0] == KV_OK) {
        const kv_config a = model(64, 1, 2), b = model(16, 2, 64);
        check_build(variant, &s[1], &a);
        check_build(variant, &s[1], &b);
    }
    check_rule(variant, rule);
    check_names(variant);
    free(text);
    return 0;
}
