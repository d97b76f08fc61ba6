/* Sliding window and attention sinks (kv_window.h): the parts that are not one-liners. */
#include "kv_window.h"

#include <string.h>

double kv_window_attended(int window, int n_sinks, int64_t p0, int64_t n)
{
    /* sum over p = p0 .. p0+n-1 of min(p+1, K), K = S+W (infinite for W = 0): the queries
     * still filling the cache see p+1 positions (an arithmetic series), the rest K each */
    if (n <= 0) return 0.0;
    const int64_t keep = kv_window_keep(window, n_sinks);
    const int64_t p1 = p0 + n;                                       /* one past the last */
    const int64_t fill_end = keep == 0 || p1 < keep ? p1 : (p0 > keep ? p0 : keep);
    const double a = (double)p0, b = (double)fill_end;              /* p in [p0, fill_end) */
    const double series = fill_end > p0 ? (a + 1.0 + b) * (b - a) / 2.0 : 0.0;
    return series + (double)(p1 - fill_end) * (double)keep;
}

int kv_window_scheme_parse(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "original") || !strcmp(name, "mistral")) return KV_POS_ORIGINAL;
    if (!strcmp(name, "cache") || !strcmp(name, "streaming")) return KV_POS_CACHE;
    return -1;
}

const char *kv_window_scheme_name(int scheme)
{
    return scheme == KV_POS_CACHE ? "cache" : scheme == KV_POS_ORIGINAL ? "original" : "?";
}
