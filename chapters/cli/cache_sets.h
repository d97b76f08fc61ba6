/*
 * Lists of cache variants for the real-model tests (kvlab passkey --caches, kvlab dialogue
 * --caches): spec strings (kv_needle_cache_spec()) separated by spaces or ';' (a spec has
 * commas of its own: "int4/l2,3,4"), and the named sets that stand for each chapter's list.
 *
 *   ch04  fp32 fp16 bf16 int8 int8-g32 fp8-e4m3 int4-g32, KIVI's int4-kivi and int2-kivi, and
 *         selective layers both ways for int4-kivi and int2-kivi: fp16 in the first and last k layers with the
 *         format in the middle, and the format in those 2k layers with fp16 in the middle
 *         (k = L/8 of the model's L layers, at least 1)
 *   ch06  fp32, a window of W = C/4 and C/2 (C the shortest context asked, rounded down to a
 *         multiple of 32), each with 4 sinks and without
 *   ch09  fp32, then at budgets 10, 25 and 50 % of the positions seen: l2-large, l2-small,
 *         h2o with a 16-token recent window, snapkv with a 16-token observation window, quest
 *         and exact top-k
 */
#ifndef KV_CLI_CACHE_SETS_H
#define KV_CLI_CACHE_SETS_H

#define KV_CLI_SPEC_MAX 192 /* the longest spec string, NUL included */
#define KV_CLI_SETS_MAX 48  /* variants in one list */

/** Expand @p list into specs [cap][KV_CLI_SPEC_MAX] (*n of them) for a model of @p n_layers
 * layers and contexts of at least @p min_context tokens. 0, or KV_EXIT_USAGE after a message
 * naming @p cmd and @p opt (an empty list, too many variants, a spec too long, a name given
 * twice). The specs themselves are checked by the caller (kv_needle_cache_spec()). */
int kv_cli_cache_list(const char *cmd, const char *opt, const char *list, int n_layers,
                      int min_context, char (*specs)[KV_CLI_SPEC_MAX], int cap, int *n);

#endif
