/* What kv_swap.c and kv_swap_partial.c share (private: not installed). */
#ifndef KV_SWAP_INTERNAL_H
#define KV_SWAP_INTERNAL_H

#include "kv_swap.h"

/* Account one batched copy of n blocks in direction dir (and sleep for it if asked). */
void kv_swap_link_account(kv_swap *sw, int dir, int n, size_t block_bytes);

/* What this version can swap: a host tier shaped as m's blocks, a slot of m, per-token
 * formats, no window, no prefix cache. */
int kv_swap_check(const kv_swap *sw, kv_cache_mem *m, int slot, const char *who, kv_err *err);

#endif
