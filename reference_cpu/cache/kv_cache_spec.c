/* What a cache is built from (kv_cache_spec.h): the formats' names and sizes, the checks both
 * devices' caches run on a spec, and the spec strings of the CLI and the workload files.
 *
 * The checks are written once and shared: kv_cache_create() and the CUDA cache call
 * kv_cache_spec_check_caps() with their own name as @p who, so a spec one device refuses the
 * other refuses in the same words. Each chapter's rules are a block of their own: layout
 * (02, 05), format (04), retention by window (06, kv_cache_window.c) and by selection (09). */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- formats -------------------------------------------------------------------------------- */

size_t kv_dtype_bytes(int dtype)
{
    switch (dtype) {
    case KV_QF_F32: return 4;
    case KV_QF_F16: case KV_QF_BF16: return 2;
    default: return 0;
    }
}

double kv_dtype_bytes_d(int dtype, int d) { return kv_quant_bytes_per_element(dtype, d); }

const char *kv_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < KV_QF_COUNT ? kv_quant_name(dtype) : "unknown";
}

int kv_cache_spec_layer_dtype(const kv_cache_spec *spec, int layer)
{
    if (!spec->quant.dtype_layers) return spec->quant.dtype;
    return layer < 64 && ((spec->quant.dtype_layers >> layer) & 1u) ? spec->quant.dtype : KV_QF_F16;
}

double kv_cache_spec_bytes_per_element(const kv_cache_spec *spec, int n_layers, int d)
{
    double b = 0.0;
    for (int l = 0; l < n_layers; l++) b += kv_quant_bytes_per_element(kv_cache_spec_layer_dtype(spec, l), d);
    return n_layers > 0 ? b / n_layers : 0.0;
}

kv_cache_spec kv_cache_spec_default(int n_slots, int capacity)
{
    kv_cache_spec s;
    memset(&s, 0, sizeof s);
    s.layout.kind = KV_LAYOUT_CONTIGUOUS;
    s.quant.dtype = KV_DTYPE_F32;
    s.n_slots = n_slots;
    s.capacity = capacity;
    return s;
}

int kv_cache_spec_check(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                        kv_err *err)
{
    return kv_cache_spec_check_caps(who, cfg, spec, 0, err);
}

int kv_cache_spec_check_caps(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                             int caps, kv_err *err)
{
    if (!cfg || !spec) return kv_fail(err, KV_ERR_ARG, "%s: NULL argument", who);
    if (spec->layout.kind != KV_LAYOUT_CONTIGUOUS && spec->layout.kind != KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "%s: cache layout %d is not supported (contiguous = %d, paged = %d)",
                       who, spec->layout.kind, KV_LAYOUT_CONTIGUOUS, KV_LAYOUT_PAGED);
    if (spec->layout.kind == KV_LAYOUT_PAGED) {
        if (spec->layout.block_size < 1 || spec->layout.block_size > 4096)
            return kv_fail(err, KV_ERR_ARG, "%s: block size %d is outside [1, 4096]", who,
                           spec->layout.block_size);
        if (spec->layout.n_blocks < 1 ||
            (int64_t)spec->layout.n_blocks * spec->layout.block_size > KV_CACHE_MAX_CAPACITY)
            return kv_fail(err, KV_ERR_ARG, "%s: %d blocks of %d tokens: the pool must hold "
                           "1 .. %d tokens", who, spec->layout.n_blocks, spec->layout.block_size,
                           KV_CACHE_MAX_CAPACITY);
        if (kvq_is_kivi(spec->quant.dtype) && spec->layout.block_size % KV_KIVI_GROUP)
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a paged %s cache needs the block size "
                           "(%d) to be a multiple of %d, the tokens one key scale covers", who,
                           kv_quant_name(spec->quant.dtype), spec->layout.block_size, KV_KIVI_GROUP);
    }
    if (spec->quant.dtype < 0 || spec->quant.dtype >= KV_QF_COUNT)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "%s: cache dtype %d is not supported (known: 0 fp32 .. %d %s)", who,
                       spec->quant.dtype, KV_QF_COUNT - 1, kv_quant_name(KV_QF_COUNT - 1));
    if (spec->n_slots < 1 || spec->n_slots > KV_CACHE_MAX_SLOTS)
        return kv_fail(err, KV_ERR_ARG, "%s: n_slots %d is outside [1, %d]", who,
                       spec->n_slots, KV_CACHE_MAX_SLOTS);
    if (spec->capacity < 1 || spec->capacity > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "%s: capacity %d is outside [1, %d]", who,
                       spec->capacity, KV_CACHE_MAX_CAPACITY);
    if (cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->dim < cfg->n_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: bad model shape (L %d, H %d, H_kv %d, dim %d)",
                       who, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->dim);
    if (spec->quant.dtype_layers && (cfg->n_layers > 64 || (cfg->n_layers < 64 &&
                                                      spec->quant.dtype_layers >> cfg->n_layers)))
        return kv_fail(err, KV_ERR_ARG,
                       "%s: quant.dtype_layers 0x%llx names layers the model (L %d) does not have",
                       who, (unsigned long long)spec->quant.dtype_layers, cfg->n_layers);
    const int d = kv_config_head_dim(cfg), f = spec->quant.dtype;
    const int g = kvq_row_group(f, KV_QROLE_VALUE, d);
    if (g && d % g)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s needs the head dim (%d) to be a "
                       "multiple of its group %d", who, kv_quant_name(f), d, g);
    if (kvq_is_kivi(f)) {
        const int R = spec->quant.kivi_window ? spec->quant.kivi_window : KV_KIVI_WINDOW;
        if (R < KV_KIVI_GROUP || R % KV_KIVI_GROUP)
            return kv_fail(err, KV_ERR_ARG, "%s: %s window %d is not a positive multiple of %d",
                           who, kv_quant_name(f), R, KV_KIVI_GROUP);
    }
    const int rc = kv_retain_spec_check(who, spec, cfg->n_layers, err); /* chapter 09 */
    return rc ? rc : kv_cache_window_check(who, spec, caps, err);
}

/* ---- chapter 09: the selection fields ------------------------------------------------------- */

static const char *method_names[] = {"none", "l2-large", "l2-small", "h2o",
                                     "snapkv", "quest", "topk"};

const char *kv_select_method_name(int method)
{
    return method >= 0 && method <= KV_SELECT_TOPK ? method_names[method] : "unknown";
}

int kv_select_method_parse(const char *name)
{
    for (int i = 0; name && i <= KV_SELECT_TOPK; i++)
        if (!strcmp(name, method_names[i])) return i;
    return -1;
}

int kv_select_method_evicts(int method)
{
    return method == KV_SELECT_L2_LARGE || method == KV_SELECT_L2_SMALL ||
           method == KV_SELECT_H2O || method == KV_SELECT_SNAPKV;
}

int kv_retain_spec_check(const char *who, const kv_cache_spec *spec, int n_layers, kv_err *err)
{
    (void)n_layers;
    const int m = spec->retain.select;
    if (m == KV_SELECT_NONE) {
        if (spec->retain.budget || spec->retain.ratio != 0.0 || spec->retain.window ||
            spec->retain.sinks || spec->retain.dense_layers)
            return kv_fail(err, KV_ERR_ARG, "%s: selection fields set (budget %d, ratio %g, "
                           "window %d, sinks %d, dense layers %d) without a selection method",
                           who, spec->retain.budget, spec->retain.ratio, spec->retain.window,
                           spec->retain.sinks, spec->retain.dense_layers);
        return KV_OK;
    }
    if (m < 0 || m > KV_SELECT_TOPK)
        return kv_fail(err, KV_ERR_ARG, "%s: selection method %d is unknown (1 l2-large .. "
                       "%d topk)", who, m, KV_SELECT_TOPK);
    const char *name = kv_select_method_name(m);
    if (spec->layout.kind != KV_LAYOUT_CONTIGUOUS)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s retention on a paged cache: the kept "
                       "set is per (layer, KV head), a block table per sequence (use the "
                       "contiguous layout)", who, name);
    if (spec->window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s retention with a sliding window "
                       "(window %d): the ring overwrites rows the selection may keep (use "
                       "retain.window and retain.sinks instead)", who, name, spec->window.size);
    if (kvq_is_kivi(spec->quant.dtype))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s retention with %s: KIVI groups 32 rows "
                       "that never move, a kept set evicts rows from the middle (use a "
                       "per-token format)", who, name, kv_quant_name(spec->quant.dtype));
    if ((spec->retain.budget > 0) == (spec->retain.ratio != 0.0) || spec->retain.budget < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: %s needs one budget: retain.budget >= 1 tokens "
                       "or 0 < retain.ratio <= 1 (got %d and %g)", who, name,
                       spec->retain.budget, spec->retain.ratio);
    if (spec->retain.budget == 0 && !(spec->retain.ratio > 0.0 && spec->retain.ratio <= 1.0))
        return kv_fail(err, KV_ERR_ARG, "%s: %s ratio %g is outside (0, 1]", who, name,
                       spec->retain.ratio);
    if (spec->retain.window < 0 || spec->retain.sinks < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: %s window %d and sinks %d must be >= 0", who,
                       name, spec->retain.window, spec->retain.sinks);
    if (spec->retain.budget > 0 &&
        (int64_t)spec->retain.window + spec->retain.sinks > spec->retain.budget)
        return kv_fail(err, KV_ERR_ARG, "%s: %s keeps %d sinks + %d recent positions, more "
                       "than its budget of %d", who, name, spec->retain.sinks,
                       spec->retain.window, spec->retain.budget);
    if (spec->retain.dense_layers < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: %s dense layers %d must be >= 0", who, name,
                       spec->retain.dense_layers);
    if (spec->retain.dense_layers > 0 && kv_select_method_evicts(m))
        return kv_fail(err, KV_ERR_ARG, "%s: %s evicts; dense layers (%d) apply to the "
                       "query-aware methods only (quest, topk)", who, name,
                       spec->retain.dense_layers);
    if (m == KV_SELECT_SNAPKV && spec->retain.window < 1)
        return kv_fail(err, KV_ERR_ARG, "%s: snapkv needs an observation window "
                       "(retain.window >= 1): its last queries vote", who);
    return KV_OK;
}

/* ---- spec strings ---------------------------------------------------------------------------- */

int kv_parse_count(const char *w, long lo, long hi, long *out)
{
    char *end;
    /* digits only: strtol also takes " 32", "+32" and "-0" */
    if (!(w[0] >= '0' && w[0] <= '9')) return -1;
    errno = 0;
    long v = strtol(w, &end, 10);
    if (errno || end == w || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Chapter 09: the options after a method name (strtok_r state @p save over a copy of
 * @p variant): the budget in tokens or as a ratio, window, sinks, dense layers, a format. */
static int select_spec(const char *variant, int method, char *save, int n_slots, int capacity,
                       kv_cache_spec *out, kv_err *err)
{
    kv_cache_spec s = kv_cache_spec_default(n_slots, capacity);
    s.retain.select = method;
    int have_fmt = 0;
    char *part;
    while ((part = strtok_r(NULL, "/", &save))) {
        char *end = NULL;
        long v = 0;
        const int fmt = kv_quant_parse(part);
        if (part[0] == 'r' && part[1]) {
            errno = 0;
            const double x = strtod(part + 1, &end);
            /* plain decimals only: strtod also reads " 0.5", "0x1p-1" and "nan" */
            if (errno || *end || !strchr("0123456789.", part[1]) || strpbrk(part + 1, "xX") ||
                !(x > 0.0 && x <= 1.0))
                return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': ratio '%s' must be "
                               "a number in (0, 1]", variant, part + 1);
            s.retain.ratio = x;
        } else if (strchr("bwsd", part[0]) && part[1] && fmt < 0) {
            if (kv_parse_count(part + 1, 0, 1L << 30, &v))
                return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': option '%s' needs "
                               "a count after '%c'", variant, part, part[0]);
            if (part[0] == 'b') s.retain.budget = (int)v;
            else if (part[0] == 'w') s.retain.window = (int)v;
            else if (part[0] == 's') s.retain.sinks = (int)v;
            else s.retain.dense_layers = (int)v;
        } else if (fmt >= 0 && !have_fmt) {
            s.quant.dtype = fmt; /* the per-token storage format of the kept rows */
            have_fmt = 1;
        } else {
            return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': option '%s' is not "
                           "known for %s (bN or rX budget, wN window, sN sinks, dN dense layers, "
                           "one storage format such as int8)", variant, part,
                           kv_select_method_name(method));
        }
    }
    if (!s.retain.budget && s.retain.ratio == 0.0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': %s needs a budget, bN "
                       "(tokens) or rX (ratio)", variant, kv_select_method_name(method));
    kv_err e2;
    const int rc = kv_retain_spec_check("cache variant", &s, 0, &e2);
    if (rc) return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': %s", variant, e2.msg);
    *out = s;
    return KV_OK;
}

/* Chapter 06: the options after "window": the window wN (required), sinks sN, the position
 * scheme (cache or original, kv_window_scheme_parse()) and at most one per-token format. */
static int window_spec(const char *variant, char *save, int n_slots, int capacity,
                       kv_cache_spec *out, kv_err *err)
{
    kv_cache_spec s = kv_cache_spec_default(n_slots, capacity);
    int have_fmt = 0, have_scheme = 0, have_w = 0, have_s = 0;
    char *part;
    while ((part = strtok_r(NULL, "/", &save))) {
        long v = 0;
        const int fmt = kv_quant_parse(part), scheme = kv_window_scheme_parse(part);
        if ((part[0] == 'w' || part[0] == 's') && part[1] && fmt < 0 && scheme < 0) {
            if (kv_parse_count(part + 1, 0, KV_CACHE_MAX_CAPACITY, &v))
                return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': option '%s' needs "
                               "a count after '%c'", variant, part, part[0]);
            /* "window/w16/w32" is refused rather than read as the last of the two */
            int *seen = part[0] == 'w' ? &have_w : &have_s;
            if (*seen)
                return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': '%c' is given "
                               "twice (one window size wN, one sink count sN)", variant, part[0]);
            *seen = 1;
            if (part[0] == 'w') s.window.size = (int)v;
            else s.window.n_sinks = (int)v;
        } else if (scheme >= 0 && !have_scheme) {
            s.window.pos_scheme = scheme;
            have_scheme = 1;
        } else if (fmt >= 0 && !have_fmt) {
            s.quant.dtype = fmt;
            have_fmt = 1;
        } else {
            return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': option '%s' is not "
                           "known for window (wN window, sN sinks, cache or original positions, "
                           "one per-token storage format such as int8)", variant, part);
        }
    }
    if (s.window.size < 1)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': window needs its size, wN "
                       "(N >= 1 recent tokens)", variant);
    kv_err e2;
    if (kv_cache_window_check("cache variant", &s, KV_CACHE_CAN_WINDOW, &e2))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': %s", variant, e2.msg);
    *out = s;
    return KV_OK;
}

int kv_needle_cache_spec(const char *variant, int n_slots, int capacity, kv_cache_spec *out,
                         kv_err *err)
{
    /* the exact cache of chapter 02; chapters add their variants here */
    if (!strcmp(variant, "fp32") || !strcmp(variant, "exact")) {
        *out = kv_cache_spec_default(n_slots, capacity);
        return KV_OK;
    }
    char buf[192]; /* a layer list of 30 layers runs to some 90 characters */
    if (strlen(variant) >= sizeof buf)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%.40s...' is too long", variant);
    /* strtok_r() skips empty parts: "int8/", "int8//head" and "/int8" are refused, not read as
     * if the empty part were not there */
    const size_t n = strlen(variant);
    if (n == 0 || variant[0] == '/' || variant[n - 1] == '/' || strstr(variant, "//"))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s' has an empty part (nothing "
                       "before, between or after a '/')", variant);
    strcpy(buf, variant);
    char *save = NULL, *part = strtok_r(buf, "/", &save);
    /* chapter 06: window/wN[/sN][/cache|original][/FORMAT] */
    if (part && !strcmp(part, "window"))
        return window_spec(variant, save, n_slots, capacity, out, err);
    /* chapter 09: METHOD/bN|rX[/wN][/sN][/dN][/FORMAT] */
    const int method = part ? kv_select_method_parse(part) : -1;
    if (method > KV_SELECT_NONE)
        return select_spec(variant, method, save, n_slots, capacity, out, err);
    /* chapter 04: FORMAT[/head][/wR][/lA,B,...] (kv_cache_spec.h) */
    const int fmt = part ? kv_quant_parse(part) : -1;
    if (fmt < 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "cache variant '%s' is not known (known: fp32, or a format fp16 bf16 int8 "
                       "int8-g32 int8-g64 int8-g128 fp8-e4m3 fp8-e5m2 int4-g32 int4 int2, with options "
                       "/head /wR /lA,B; or window with /wN /sN /cache; or a method l2-large "
                       "l2-small h2o snapkv quest topk with /bN or /rX, /wN /sN /dN)", variant);
    kv_cache_spec s = kv_cache_spec_default(n_slots, capacity);
    s.quant.dtype = fmt;
    while ((part = strtok_r(NULL, "/", &save))) {
        if (!strcmp(part, "head") && kvq_is_fp8(fmt)) {
            s.quant.fp8_per_head = 1;
        } else if (part[0] == 'w' && kvq_is_kivi(fmt)) {
            long w = 0;
            if (kv_parse_count(part + 1, 32, 1L << 20, &w) || w % 32)
                return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': window '%s' must "
                               "be a multiple of 32", variant, part + 1);
            s.quant.kivi_window = (int)w;
        } else if (part[0] == 'l') {
            /* one number per comma-separated item: "l" (no layer) and "l0," (an empty item)
             * are refused, not read as "every layer" or "layer 0" */
            const char *p = part + 1;
            do {
                char item[8];
                const size_t k = strcspn(p, ",");
                long l = -1;
                if (k < sizeof item) {
                    memcpy(item, p, k);
                    item[k] = 0;
                }
                if (k >= sizeof item || kv_parse_count(item, 0, 63, &l))
                    return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': layer list "
                                   "'%s' (numbers 0..63 separated by commas)", variant, part + 1);
                s.quant.dtype_layers |= (uint64_t)1 << l;
                p += k + (p[k] == ',');
                if (p[-1] == ',' && !*p) /* a trailing comma: an empty last item */
                    return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': layer list "
                                   "'%s' ends in a comma", variant, part + 1);
            } while (*p);
        } else {
            return kv_fail(err, KV_ERR_UNSUPPORTED, "cache variant '%s': option '%s' is not "
                           "known for %s (/head for fp8, /wR for int4/int2, /lA,B for any)",
                           variant, part, kv_quant_name(fmt));
        }
    }
    *out = s;
    return KV_OK;
}

