/* Chapter 05's part of the cache (kv_cache.h, KV_LAYOUT_PAGED): rows in a pool of blocks.
 *
 * The pool's planes are laid out by kv_cache_layout() (kv_cache.c), head-major; a slot owns no
 * rows, only its block table, and kv_cache_paged_row() is the layout's row locator: logical row
 * r of a slot is pool row tables[r / B]·B + r % B. Every write goes through it
 * (kv_cache_locate()), so each storage format, window and undo log works on pages unchanged.
 * The rest is what the block manager asks of the cache itself:
 *
 *   kv_cache_set_blocks   map a slot's logical blocks to pool blocks (its block table)
 *   kv_cache_fork_slot    a second slot that reads the same blocks (parallel samples, beams)
 *   kv_cache_set_length   adopt blocks another sequence wrote (prefix cache hits)
 *   kv_cache_copy_blocks  copy-on-write: duplicate blocks before a shared one is written
 *   kv_cache_write_slots  write new tokens through a flat slot mapping (-1 = padding)
 *   kv_cache_read_blocks  chapter 07: blocks' bytes out to a host tier, and back in
 *   kv_cache_write_blocks
 *
 * A block is B rows of every (layer, K/V, head) plane, so each operation is per-slot metadata
 * or, for the copy, B rows of codes and their metadata per plane. Read kv_cache.c first. */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <string.h>

int64_t kv_cache_paged_row(const kv_cache *c, int slot, int64_t r)
{
    const int B = c->spec.layout.block_size;
    return (int64_t)c->tables[(size_t)slot * c->max_blocks + r / B] * B + r % B;
}

int kv_cache_set_blocks(kv_cache *c, int slot, const int *blocks, int n, kv_err *err)
{
    return kv_cache_state_set_blocks(c, "kv_cache_set_blocks", slot, blocks, n, err);
}

int kv_cache_fork_slot(kv_cache *c, int dst, int src, kv_err *err)
{
    return kv_cache_state_fork(c, "kv_cache_fork_slot", dst, src, err);
}

int kv_cache_set_length(kv_cache *c, int slot, int len, kv_err *err)
{
    return kv_cache_state_set_length(c, "kv_cache_set_length", slot, len, err);
}

int kv_cache_copy_blocks(kv_cache *c, const kv_block_copy *pairs, int n, kv_err *err)
{
    int rc = kv_cache_check_pairs("kv_cache_copy_blocks", c, pairs, n, err);
    if (rc) return rc;
    const int B = c->spec.layout.block_size, d = c->head_dim;
    for (int i = 0; i < n; i++) {
        const int64_t s0 = (int64_t)pairs[i].src * B, d0 = (int64_t)pairs[i].dst * B;
        for (int l = 0; l < c->n_layers; l++)
            for (int i = 0; i < c->n_planes; i++) {
                kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
                const int r = p->role, f = c->fmt[l];
                /* a block's metadata entries are contiguous too: meta index is linear in the
                 * row (per token) or in the 32-row group (KIVI keys), and 32 | B there */
                const int64_t m0 = kvq_meta_index(f, r, s0, 0, d);
                const int64_t m1 = kvq_meta_index(f, r, d0, 0, d);
                const int64_t mn = kvq_meta_index(f, r, s0 + B, 0, d) - m0;
                for (int h = 0; h < c->n_kv_heads; h++) {
                    uint8_t *codes = p->codes + (int64_t)h * c->rows * p->row_bytes;
                    memcpy(codes + d0 * p->row_bytes, codes + s0 * p->row_bytes,
                           (size_t)(B * p->row_bytes));
                    if (p->meta && mn > 0) {
                        uint8_t *meta = (uint8_t *)p->meta + (int64_t)h * p->meta_entries * 4;
                        memcpy(meta + m1 * 4, meta + m0 * 4, (size_t)mn * 4);
                    }
                }
            }
    }
    return KV_OK;
}

/* ---- chapter 07: a block's bytes in the host tier's order ------------------------------------ */

/* Metadata entries of one block's B rows in a plane of format fmt: contiguous, as in
 * kv_cache_copy_blocks(); 0 for a plane without metadata. */
static int64_t block_meta_entries(const kv_cache *c, const kv_cache_plane *p, int fmt)
{
    if (!p->meta) return 0;
    return kvq_meta_index(fmt, p->role, c->spec.layout.block_size, 0, c->head_dim) -
           kvq_meta_index(fmt, p->role, 0, 0, c->head_dim);
}

size_t kv_cache_block_bytes(const kv_cache *c)
{
    if (!c || !c->tables) return 0;
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < c->n_planes; i++) {
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
            const int64_t meta = block_meta_entries(c, p, c->fmt[l]) * 4;
            n += (size_t)c->n_kv_heads * (size_t)(c->spec.layout.block_size * p->row_bytes + meta);
        }
    return n;
}

/* Copy pool block dev of c and one host block, in the host order [L][planes: K, V][H_kv]
 * (codes, meta):
 * into @p out when it is not NULL, else from @p in. */
static void block_move(const kv_cache *c, int dev, uint8_t *out, const uint8_t *in)
{
    size_t at = 0; /* bytes of the host block done */
    const int64_t B = c->spec.layout.block_size, r0 = (int64_t)dev * B;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < c->n_planes; i++) {
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
            const int r = p->role, f = c->fmt[l];
            const int64_t mn = block_meta_entries(c, p, f);
            const int64_t m0 = kvq_meta_index(f, r, r0, 0, c->head_dim);
            const size_t code_bytes = (size_t)(B * p->row_bytes);
            for (int h = 0; h < c->n_kv_heads; h++) {
                uint8_t *codes = p->codes + ((int64_t)h * c->rows + r0) * p->row_bytes;
                if (out) memcpy(out + at, codes, code_bytes);
                else memcpy(codes, in + at, code_bytes);
                at += code_bytes;
                if (mn > 0) {
                    uint8_t *meta = (uint8_t *)p->meta + ((int64_t)h * p->meta_entries + m0) * 4;
                    if (out) memcpy(out + at, meta, (size_t)mn * 4);
                    else memcpy(meta, in + at, (size_t)mn * 4);
                    at += (size_t)mn * 4;
                }
            }
        }
}

int kv_cache_read_blocks(const kv_cache *c, const kv_block_copy *pairs, int n, uint8_t *host,
                         size_t block_bytes, kv_err *err)
{
    int rc = kv_cache_check_block_io("kv_cache_read_blocks", c, pairs, n, host, block_bytes, 1, err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].src, host + (size_t)pairs[i].dst * block_bytes, NULL);
    return rc;
}

int kv_cache_write_blocks(kv_cache *c, const kv_block_copy *pairs, int n, const uint8_t *host,
                          size_t block_bytes, kv_err *err)
{
    int rc = kv_cache_check_block_io("kv_cache_write_blocks", c, pairs, n, host, block_bytes, 0, err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].dst, NULL, host + (size_t)pairs[i].src * block_bytes);
    return rc;
}

int kv_cache_write_slots(kv_cache *c, int layer, const int64_t *slots, int n, const float *k,
                         const float *v, kv_err *err)
{
    int rc = kv_cache_check_slots("kv_cache_write_slots", c, layer, slots, n, k, v, err);
    if (rc) return rc;
    const int d = c->head_dim, Hkv = c->n_kv_heads;
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0) continue; /* padding */
        const float *xs[KV_CACHE_KV_PLANES] = {k, v}; /* each plane's rows [n][H_kv][d] */
        for (int pl = 0; pl < c->n_planes; pl++) {
            kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, pl, layer);
            for (int h = 0; h < Hkv; h++) {
                const float *x = xs[pl] + ((size_t)i * Hkv + h) * d;               /* [d] */
                const kv_row_loc at = {h, h, slots[i]}; /* no per-sequence scale to find */
                rc = kv_cache_row_encode(c, layer, p, at, x, err);
                if (rc) return rc;
            }
        }
    }
    return KV_OK;
}
