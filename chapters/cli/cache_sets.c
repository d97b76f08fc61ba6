/*
 * The variant lists of the real-model tests (cache_sets.h): each chapter's set written out
 * once, so kvlab passkey and kvlab dialogue run the same variants under the same names.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cache_sets.h"
#include "cli.h"

/* "l" + the layers in [a, b) and [c, d), comma-separated, after @p fmt */
static void layer_spec(char *out, const char *fmt, int a, int b, int c, int d)
{
    int k = snprintf(out, KV_CLI_SPEC_MAX, "%s/l", fmt);
    for (int l = 0; l < (b > d ? b : d) && k < KV_CLI_SPEC_MAX; l++)
        if ((l >= a && l < b) || (l >= c && l < d))
            k += snprintf(out + k, (size_t)(KV_CLI_SPEC_MAX - k), "%s%d",
                          out[k - 1] == 'l' ? "" : ",", l);
}

/* One named set into tmp [KV_CLI_SETS_MAX]: its size, or 0 when @p name is not a set's name. */
static int expand_set(const char *name, int n_layers, int min_context,
                      char (*tmp)[KV_CLI_SPEC_MAX])
{
    int m = 0;
#define ADD(...) snprintf(tmp[m++], KV_CLI_SPEC_MAX, __VA_ARGS__)
    if (!strcmp(name, "ch04")) {
        static const char *const fmts[] = {"fp32",     "fp16",     "bf16",      "int8",
                                           "int8-g32", "fp8-e4m3", "int4-g32",  "int4-kivi",
                                           "int2-kivi"};
        for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) ADD("%s", fmts[i]);
        const int k = n_layers / 8 > 0 ? n_layers / 8 : 1;
        for (int bits = 4; bits >= 2; bits -= 2) {
            const char *f = bits == 4 ? "int4-kivi" : "int2-kivi";
            layer_spec(tmp[m++], f, k, n_layers - k, 0, 0);            /* fp16 at the ends */
            layer_spec(tmp[m++], f, 0, k, n_layers - k, n_layers);     /* fp16 in the middle */
        }
    } else if (!strcmp(name, "ch06")) {
        ADD("fp32");
        for (int q = 4; q >= 2; q /= 2) {
            const int w = min_context / q / 32 * 32 > 32 ? min_context / q / 32 * 32 : 32;
            ADD("window/w%d/s4", w);
            ADD("window/w%d", w);
        }
    } else if (!strcmp(name, "ch09")) {
        static const char *const sel[] = {"l2-large/r%s", "l2-small/r%s", "h2o/r%s/w16",
                                          "snapkv/r%s/w16", "quest/r%s", "topk/r%s"};
        static const char *const budgets[] = {"0.1", "0.25", "0.5"};
        ADD("fp32");
        for (int b = 0; b < 3; b++)
            for (size_t s = 0; s < sizeof sel / sizeof sel[0]; s++) ADD(sel[s], budgets[b]);
    } else {
        return 0;
    }
#undef ADD
    return m;
}

int kv_cli_cache_list(const char *cmd, const char *opt, const char *list, int n_layers,
                      int min_context, char (*specs)[KV_CLI_SPEC_MAX], int cap, int *n)
{
    *n = 0;
    const char *p = list;
    while (*p) {
        p += strspn(p, " ;");
        const size_t len = strcspn(p, " ;");
        if (!len) break;
        char word[KV_CLI_SPEC_MAX];
        if (len >= sizeof word)
            return kv_args_bad(cmd, opt, "a variant of %zu characters: at most %d", len,
                               KV_CLI_SPEC_MAX - 1);
        memcpy(word, p, len);
        word[len] = '\0';
        p += len;
        char set[KV_CLI_SETS_MAX][KV_CLI_SPEC_MAX];
        int m = expand_set(word, n_layers, min_context, set);
        if (!m) memcpy(set[m++], word, sizeof word);
        for (int i = 0; i < m; i++) { /* a variant already listed (fp32 in two sets) runs once */
            int seen = 0;
            for (int j = 0; j < *n; j++) seen |= !strcmp(specs[j], set[i]);
            if (seen) continue;
            if (*n == cap) return kv_args_bad(cmd, opt, "more than %d variants in '%s'", cap, list);
            memcpy(specs[(*n)++], set[i], KV_CLI_SPEC_MAX);
        }
    }
    if (!*n) return kv_args_bad(cmd, opt, "no variant in '%s'", list);
    return 0;
}
