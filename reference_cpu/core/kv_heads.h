/**
 * @file kv_heads.h
 * The grouping of query heads onto KV heads (chapter 03), written once for the CPU and the
 * CUDA kernels.
 *
 * H query heads share H_kv KV heads in groups of G = H / H_kv consecutive heads: query head h
 * reads KV head h / G, and KV head kvh serves query heads kvh·G .. kvh·G + G - 1. G = 1 is
 * multi-head attention (MHA), 1 < G < H grouped-query attention (GQA), G = H multi-query
 * attention (MQA, H_kv = 1). Every attention path, CPU and CUDA, maps heads through these
 * functions; a checkpoint's Wk/Wv rows must be ordered the same way (llama2.c and Llama-2/3
 * checkpoints are). Callers have checked that H_kv divides H.
 *
 * The functions are `static inline` and marked KV_HD (`__host__ __device__` under nvcc,
 * nothing in C or in the emulation build), so kernels call the very lines the CPU runs.
 */
#ifndef KV_HEADS_H
#define KV_HEADS_H

#ifndef KV_HD
#if defined(__CUDACC__)
#define KV_HD __host__ __device__
#else
#define KV_HD
#endif
#endif

/** G: the query heads that share one KV head, H / H_kv. */
static inline KV_HD int kv_heads_group(int n_heads, int n_kv_heads)
{
    return n_heads / n_kv_heads;
}

/** The KV head query head @p h reads: h / G. */
static inline KV_HD int kv_attn_kv_head(int h, int n_heads, int n_kv_heads)
{
    return h / kv_heads_group(n_heads, n_kv_heads);
}

#endif
