/*
 * What kv_gguf.c (the parser) and kv_gguf_meta.c (lookups, getters, sizes) share; private to
 * model/.
 */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include "kv_gguf.h"
#include "kv_model.h"

/* a metadata entry and, for an array of strings, where its elements start in kv_gguf.strs */
typedef struct {
    kv_gguf_kv kv;
    uint64_t str_first; /* UINT64_MAX unless an array of strings */
} kv_gguf_entry;

/* a name and the index it belongs to: the sorted tables that lookups search */
typedef struct {
    kv_gguf_str name;
    int64_t i;
} kv_gguf_name_ix;

struct kv_gguf {
    const unsigned char *map; /* [size] the file, mapped read-only */
    uint64_t size;
    int version;
    uint64_t alignment;
    uint64_t data_off;        /* where the data section starts in the file */
    kv_gguf_entry *kvs;       /* [n_kv] in file order */
    int64_t n_kv;
    kv_gguf_name_ix *kv_sorted; /* [n_kv] by key */
    kv_gguf_tensor *tensors;  /* [n_tensors] in file order */
    int64_t n_tensors;
    kv_gguf_name_ix *t_sorted;  /* [n_tensors] by name */
    kv_gguf_str *strs;        /* [n_strs] the elements of every top-level string array */
    uint64_t n_strs, cap_strs;
};

/* Sort the keys (tensor names) for lookup; KV_ERR_FORMAT naming a duplicate. */
int kv_gguf_index_keys(kv_gguf *g, const char *path, kv_err *err);
int kv_gguf_index_tensors(kv_gguf *g, const char *path, kv_err *err);
/* The entry of @p key, or NULL. */
const kv_gguf_kv *kv_gguf_lookup(const kv_gguf *g, const char *key);
/* [n_tensors] tensor indices in order of offset (malloc'd; NULL when out of memory). */
int64_t *kv_gguf_tensors_by_offset(const kv_gguf *g);

/* kv_gguf_model_store.c: a model whose matrices stay in @p storage (kv_weights_storage, not
 * F32) from the checked tensors @p t [n] in the loader's plan order (token_embd; per layer
 * attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up;
 * output_norm; output when untied). @p m holds its config; on failure the caller frees it. */
int kv_gguf_store_model(kv_model *m, const kv_gguf_tensor *const *t, int n, int storage,
                        kv_err *err);

#endif
