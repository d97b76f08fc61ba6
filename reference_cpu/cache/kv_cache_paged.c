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

int kv_cache_check_slot(const char *who, const kv_cache_spec *spec, int paged, int slot,
                        kv_err *err)
{
    if (!spec || !paged) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (slot < 0 || slot >= spec->n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d is outside [0, %d)", who, slot,
                       spec->n_slots);
    return KV_OK;
}

/* Every operation here needs a paged cache and a slot inside it. */
static int paged_slot(const kv_cache *c, const char *who, int slot, kv_err *err)
{
    return kv_cache_check_slot(who, c ? &c->spec : NULL, c && c->tables, slot, err);
}

int kv_cache_check_blocks(const char *who, const kv_cache_spec *spec, int paged, int max_blocks,
                          int len, int slot, const int *blocks, int n, kv_err *err)
{
    int rc = kv_cache_check_slot(who, spec, paged, slot, err);
    if (rc) return rc;
    if (n < 0 || n > max_blocks || (n > 0 && !blocks))
        return kv_fail(err, KV_ERR_ARG, "%s: %d blocks for slot %d (max %d)", who, n, slot,
                       max_blocks);
    if ((int64_t)n * spec->layout.block_size < kv_window_rows(spec->window.size, spec->window.n_sinks, len))
        return kv_fail(err, KV_ERR_ARG, "%s: %d blocks cannot hold the %d tokens slot %d "
                       "caches", who, n, len, slot);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= spec->layout.n_blocks)
            return kv_fail(err, KV_ERR_ARG, "%s: slot %d entry %d is block %d, outside the pool "
                           "[0, %d)", who, slot, i, blocks[i], spec->layout.n_blocks);
    return KV_OK;
}

int kv_cache_check_rows(const char *who, const kv_cache_spec *spec, const int *n_mapped,
                        const kv_seq *seqs, int n_seqs, kv_err *err)
{
    const int B = spec->layout.block_size, W = spec->window.size, S = spec->window.n_sinks;
    for (int i = 0; i < n_seqs; i++) {
        const int64_t end = (int64_t)seqs[i].pos + seqs[i].n_tokens;
        const int64_t mapped = (int64_t)n_mapped[seqs[i].slot] * B;
        if (W == 0 && end > mapped) /* a write past the mapped blocks has nowhere to go */
            return kv_fail(err, KV_ERR_CAPACITY,
                           "%s: sequence %d: positions up to %lld but slot %d has %d blocks "
                           "(%lld tokens) mapped", who, i, (long long)end - 1, seqs[i].slot,
                           n_mapped[seqs[i].slot], (long long)mapped);
        const int64_t rows = kv_window_rows(W, S, end); /* chapter 06: stops growing at S+W */
        if (W > 0 && rows > mapped)
            return kv_fail(err, KV_ERR_CAPACITY, "%s: sequence %d: its window needs %lld rows "
                           "but slot %d has %d blocks (%lld rows) mapped", who, i,
                           (long long)rows, seqs[i].slot, n_mapped[seqs[i].slot],
                           (long long)mapped);
    }
    return KV_OK;
}

int kv_cache_set_blocks(kv_cache *c, int slot, const int *blocks, int n, kv_err *err)
{
    int rc = paged_slot(c, "kv_cache_set_blocks", slot, err);
    if (!rc) /* the CPU's and the GPU's checks, in one place */
        rc = kv_cache_check_blocks("kv_cache_set_blocks", &c->spec, 1, c->max_blocks, c->len[slot], slot,
                                   blocks, n, err);
    if (rc) return rc;
    memcpy(c->tables + (size_t)slot * c->max_blocks, blocks, (size_t)n * sizeof(int));
    c->n_mapped[slot] = n;
    return KV_OK;
}

int kv_cache_fork_slot(kv_cache *c, int dst, int src, kv_err *err)
{
    if (c && c->spec.retain.select) /* chapter 09: the kept sets are per sequence, not per block */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_cache_fork_slot: a cache with %s "
                       "retention keeps per-sequence selection state that a fork would not "
                       "copy", kv_select_method_name(c->spec.retain.select));
    int rc = paged_slot(c, "kv_cache_fork_slot", dst, err);
    if (!rc) rc = paged_slot(c, "kv_cache_fork_slot", src, err);
    if (rc || dst == src) return rc;
    if (c->spec.window.size > 0) /* the ring would overwrite rows the other sequence still reads */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_cache_fork_slot: a sliding-window "
                       "sequence cannot share its blocks (its ring rewrites them in place)");
    const int64_t Hkv = c->n_kv_heads, d = c->head_dim;
    c->len[dst] = c->len[src];
    for (int l = 0; l < c->n_layers; l++) {
        const size_t ns = (size_t)c->spec.n_slots;
        c->qlen[l * ns + dst] = c->qlen[l * ns + src];
        for (int i = 0; i < c->n_planes; i++) {
            kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
            if (p->scale) memcpy(p->scale + dst * Hkv, p->scale + src * Hkv, Hkv * sizeof(float));
            if (p->ring)
                memcpy(p->ring + dst * Hkv * c->window * d, p->ring + src * Hkv * c->window * d,
                       (size_t)(Hkv * c->window * d) * sizeof(float));
        }
    }
    return KV_OK;
}

int kv_cache_check_length(const char *who, const kv_cache_spec *spec, const int *fmt,
                          int n_layers, int slot, int cur_len, int n_mapped, int len,
                          kv_err *err)
{
    if (spec->window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window cache cannot adopt "
                       "another sequence's blocks (its ring rewrites them)", who);
    for (int l = 0; l < n_layers; l++)
        if (kvq_is_fp8(fmt[l]) || kvq_is_kivi(fmt[l]))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose scales or "
                           "window belong to the sequence that wrote the rows: its blocks "
                           "cannot be adopted by another sequence", who, l,
                           kv_quant_name(fmt[l]));
    if (cur_len != 0)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d already holds %d tokens", who, slot,
                       cur_len);
    if (len < 0 || (int64_t)len > (int64_t)n_mapped * spec->layout.block_size)
        return kv_fail(err, KV_ERR_ARG, "%s: %d tokens but slot %d maps %d blocks of %d", who,
                       len, slot, n_mapped, spec->layout.block_size);
    return KV_OK;
}

int kv_cache_set_length(kv_cache *c, int slot, int len, kv_err *err)
{
    if (c && c->spec.retain.select) /* chapter 09: adopted rows were never seen by the selection */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_cache_set_length: a cache with %s "
                       "retention would adopt rows its selection state never saw",
                       kv_select_method_name(c->spec.retain.select));
    int rc = paged_slot(c, "kv_cache_set_length", slot, err);
    if (!rc)
        rc = kv_cache_check_length("kv_cache_set_length", &c->spec, c->fmt, c->n_layers, slot,
                                   c->len[slot], c->n_mapped[slot], len, err);
    if (rc) return rc;
    c->len[slot] = len;
    return KV_OK;
}

int kv_cache_copy_blocks(kv_cache *c, const kv_block_copy *pairs, int n, kv_err *err)
{
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_copy_blocks: the cache is not paged");
    const int B = c->spec.layout.block_size, d = c->head_dim;
    for (int i = 0; i < n; i++)
        if (pairs[i].src < 0 || pairs[i].src >= c->spec.layout.n_blocks || pairs[i].dst < 0 ||
            pairs[i].dst >= c->spec.layout.n_blocks)
            return kv_fail(err, KV_ERR_ARG, "kv_cache_copy_blocks: pair %d (%d -> %d) is "
                           "outside the pool [0, %d)", i, pairs[i].src, pairs[i].dst,
                           c->spec.layout.n_blocks);
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

/* The checks both directions share; dev_is_src: the pool block is pairs[i].src. */
static int check_block_pairs(const kv_cache *c, const kv_block_copy *pairs, int n,
                             const void *host, size_t block_bytes, int dev_is_src,
                             const char *who, kv_err *err)
{
    if (!c || !c->tables) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (n < 0 || (n > 0 && (!pairs || !host)))
        return kv_fail(err, KV_ERR_ARG, "%s: %d pairs", who, n);
    if (block_bytes != kv_cache_block_bytes(c))
        return kv_fail(err, KV_ERR_ARG, "%s: host blocks of %zu bytes but the cache's blocks "
                       "are %zu bytes", who, block_bytes, kv_cache_block_bytes(c));
    for (int i = 0; i < n; i++) {
        const int dev = dev_is_src ? pairs[i].src : pairs[i].dst;
        const int host_blk = dev_is_src ? pairs[i].dst : pairs[i].src;
        if (dev < 0 || dev >= c->spec.layout.n_blocks || host_blk < 0)
            return kv_fail(err, KV_ERR_ARG, "%s: pair %d (%d -> %d): pool block outside "
                           "[0, %d) or negative host block", who, i, pairs[i].src,
                           pairs[i].dst, c->spec.layout.n_blocks);
    }
    return KV_OK;
}

int kv_cache_read_blocks(const kv_cache *c, const kv_block_copy *pairs, int n, uint8_t *host,
                         size_t block_bytes, kv_err *err)
{
    int rc = check_block_pairs(c, pairs, n, host, block_bytes, 1, "kv_cache_read_blocks", err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].src, host + (size_t)pairs[i].dst * block_bytes, NULL);
    return rc;
}

int kv_cache_write_blocks(kv_cache *c, const kv_block_copy *pairs, int n, const uint8_t *host,
                          size_t block_bytes, kv_err *err)
{
    int rc = check_block_pairs(c, pairs, n, host, block_bytes, 0, "kv_cache_write_blocks", err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].dst, NULL, host + (size_t)pairs[i].src * block_bytes);
    return rc;
}

int kv_cache_write_slots(kv_cache *c, int layer, const int64_t *slots, int n, const float *k,
                         const float *v, kv_err *err)
{
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_write_slots: the cache is not paged");
    if (layer < 0 || layer >= c->n_layers || n < 0 || (n > 0 && (!slots || !k || !v)))
        return kv_fail(err, KV_ERR_ARG, "kv_cache_write_slots: layer %d, %d tokens", layer, n);
    const int fmt = c->fmt[layer], d = c->head_dim, Hkv = c->n_kv_heads;
    if (kvq_is_fp8(fmt) || kvq_is_kivi(fmt))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_cache_write_slots: layer %d stores %s, "
                       "whose scales or window belong to a sequence, not to a slot",
                       layer, kv_quant_name(fmt));
    for (int i = 0; i < n; i++)
        if (slots[i] >= c->rows)
            return kv_fail(err, KV_ERR_ARG, "kv_cache_write_slots: token %d goes to slot %lld, "
                           "outside the pool's %d rows", i, (long long)slots[i], c->rows);
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0) continue; /* padding */
        const float *xs[KV_CACHE_KV_PLANES] = {k, v}; /* each plane's rows [n][H_kv][d] */
        for (int pl = 0; pl < c->n_planes; pl++) {
            kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, pl, layer);
            for (int h = 0; h < Hkv; h++) {
                const float *x = xs[pl] + ((size_t)i * Hkv + h) * d;               /* [d] */
                const kv_row_loc at = {h, h, slots[i]}; /* no per-sequence scale to find */
                int rc = kv_cache_row_encode(c, layer, p, at, x, err);
                if (rc) return rc;
            }
        }
    }
    return KV_OK;
}
