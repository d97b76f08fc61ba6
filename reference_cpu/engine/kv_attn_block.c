/* The attention blocks by model kind (kv_attn_block.h): one row per ::kv_attn_kind. A new kind
 * is a new file with its block and a row here; the forward pass does not change. */
#include "kv_attn_block.h"

static const kv_attn_block *const kv_attn_blocks[KV_ATTN_COUNT] = {
    [KV_ATTN_GQA] = &kv_attn_gqa, /* kv_forward_gqa.c: MHA, GQA, MQA */
    [KV_ATTN_MLA] = &kv_attn_mla, /* kv_forward_mla.c: multi-head latent attention */
};

const kv_attn_block *kv_attn_block_of(const kv_config *c)
{
    return c && c->attn >= 0 && c->attn < KV_ATTN_COUNT ? kv_attn_blocks[c->attn] : NULL;
}

void kv_attn_step_end(kv_attn_step *a)
{
    kv_free(a->scratch);
    a->scratch = NULL;
}
