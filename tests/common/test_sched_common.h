/*
 * Pieces the scheduler tests share (test_sched, test_sched_swap, test_gpu_sched_swap): a trace
 * from a table of requests, and "the same tokens" between a scheduled and a solo result.
 */
#ifndef TEST_SCHED_COMMON_H
#define TEST_SCHED_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "kv_sched.h"

/* A trace of @p n requests copied from @p reqs, with two shared prefixes (16 tokens: four
 * whole blocks of 4; and 10). */
static inline void make_trace(kv_trace *t, const kv_request *reqs, int n)
{
    memset(t, 0, sizeof *t);
    t->req = malloc((size_t)n * sizeof(kv_request));
    memcpy(t->req, reqs, (size_t)n * sizeof(kv_request));
    t->n = n;
    t->n_prefixes = 2;
    t->prefix_len[0] = 16;
    t->prefix_len[1] = 10;
}

/* Both served, and every returned sequence has the same tokens. */
static inline int same_result(const kv_sched_result *a, const kv_sched_result *b)
{
    if (a->status || b->status || a->n_out != b->n_out || a->output_len != b->output_len) return 0;
    return memcmp(a->tokens, b->tokens, (size_t)a->n_out * a->output_len * sizeof(int)) == 0;
}

#endif
