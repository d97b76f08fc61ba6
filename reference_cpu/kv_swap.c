/* Swap (kv_swap.h): a host tier of blocks, the link model, and a whole sequence swapped out of
 * a paged backend and back. The paging state (pool, tables, token record) is the backend's
 * kv_paged; the bytes move through a kv_swap_io. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep, for the optional throttle */
#endif
#include "kv_swap.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the link ------------------------------------------------------------------------------ */

kv_link kv_link_default(void)
{
    kv_link l = {KV_LINK_DEFAULT_BANDWIDTH, KV_LINK_DEFAULT_LATENCY, 0};
    return l;
}

double kv_link_seconds(const kv_link *l, int64_t bytes)
{
    if (bytes <= 0) return 0.0;
    return l->latency + (double)bytes / l->bandwidth;
}

/* Account one batched copy of n blocks in direction dir (and sleep for it if asked). */
static void link_account(kv_swap *sw, int dir, int n, size_t block_bytes)
{
    if (n <= 0) return;
    const int64_t bytes = (int64_t)n * (int64_t)block_bytes;
    const double s = kv_link_seconds(&sw->link, bytes);
    sw->stats.copies[dir]++;
    sw->stats.blocks[dir] += n;
    sw->stats.bytes[dir] += bytes;
    sw->stats.seconds[dir] += s;
    if (sw->link.throttle) {
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* ---- block bytes of a CPU cache ------------------------------------------------------------ */

/* Metadata entries of one block's B rows in layer plane (fmt, role): a block's entries are
 * contiguous (kv_cache_copy_blocks() relies on the same fact). */
static int64_t block_meta_entries(const kv_cache *c, const kv_cache_plane *p, int fmt, int role)
{
    if (!p->meta) return 0;
    const int64_t B = c->spec.block_size;
    return kvq_meta_index(fmt, role, B, 0, c->head_dim) -
           kvq_meta_index(fmt, role, 0, 0, c->head_dim);
}

size_t kv_swap_block_bytes(const kv_cache *c)
{
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int role = 0; role < 2; role++) {
            const kv_cache_plane *p = role ? &c->vp[l] : &c->kp[l];
            const int r = role ? KV_QROLE_VALUE : KV_QROLE_KEY;
            const int64_t meta = block_meta_entries(c, p, c->fmt[l], r) * 4;
            n += (size_t)c->n_kv_heads * (size_t)(c->spec.block_size * p->row_bytes + meta);
        }
    return n;
}

/* Copy one block between the pool of cache c and a host block, in the host block's order
 * [L][K, V][H_kv](codes, meta): into @p out when it is not NULL, else from @p in. */
static void block_move(kv_cache *c, int dev, uint8_t *out, const uint8_t *in)
{
    size_t at = 0; /* bytes of the host block done */
    const int64_t B = c->spec.block_size, r0 = (int64_t)dev * B;
    for (int l = 0; l < c->n_layers; l++)
        for (int role = 0; role < 2; role++) {
            kv_cache_plane *p = role ? &c->vp[l] : &c->kp[l];
            const int r = role ? KV_QROLE_VALUE : KV_QROLE_KEY, f = c->fmt[l];
            const int64_t mn = block_meta_entries(c, p, f, r);
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

static int check_pairs(const kv_cache *c, const kv_block_copy *pairs, int n, int dev_is_src,
                       const char *who, kv_err *err)
{
    for (int i = 0; i < n; i++) {
        const int dev = dev_is_src ? pairs[i].src : pairs[i].dst;
        const int host = dev_is_src ? pairs[i].dst : pairs[i].src;
        if (dev < 0 || dev >= c->spec.n_blocks || host < 0)
            return kv_fail(err, KV_ERR_ARG, "%s: pair %d (%d -> %d): device block outside "
                           "[0, %d) or negative host block", who, i, pairs[i].src,
                           pairs[i].dst, c->spec.n_blocks);
    }
    return KV_OK;
}

static int cache_copy_out(void *ctx, const kv_block_copy *pairs, int n, uint8_t *host,
                          kv_err *err)
{
    kv_cache *c = ctx;
    const size_t bb = kv_swap_block_bytes(c);
    int rc = check_pairs(c, pairs, n, 1, "swap copy out", err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].src, host + (size_t)pairs[i].dst * bb, NULL);
    return rc;
}

static int cache_copy_in(void *ctx, const kv_block_copy *pairs, int n, const uint8_t *host,
                         kv_err *err)
{
    kv_cache *c = ctx;
    const size_t bb = kv_swap_block_bytes(c);
    int rc = check_pairs(c, pairs, n, 0, "swap copy in", err);
    for (int i = 0; i < n && !rc; i++)
        block_move(c, pairs[i].dst, NULL, host + (size_t)pairs[i].src * bb);
    return rc;
}

int kv_swap_io_cache(kv_swap_io *io, kv_cache *c, kv_err *err)
{
    memset(io, 0, sizeof *io);
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_io_cache: the cache is not paged");
    io->ctx = c;
    io->block_bytes = kv_swap_block_bytes(c);
    io->copy_out = cache_copy_out;
    io->copy_in = cache_copy_in;
    return KV_OK;
}

/* ---- a CPU backend whose cache the swap can reach ----------------------------------------------
 * kv_backend_cpu() itself; kv_backend_cpu_cache() hands over its cache. This goes away when
 * kv_backend.h gains read_blocks / write_blocks for every device. */

int kv_swap_backend_cpu(kv_backend **out, kv_swap_io *io, const kv_model *model,
                        const kv_cache_spec *spec, kv_err *err)
{
    if (!out || !io || !model || !spec)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_backend_cpu: NULL argument");
    *out = NULL;
    if (spec->layout != KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_backend_cpu: swapping needs a paged cache");
    kv_backend *b = NULL;
    int rc = kv_backend_cpu(&b, model, spec, err);
    if (!rc) rc = kv_swap_io_cache(io, kv_backend_cpu_cache(b), err);
    if (rc) {
        kv_backend_destroy(b);
        return rc;
    }
    *out = b;
    return KV_OK;
}

/* ---- the host tier -------------------------------------------------------------------------- */

int kv_swap_init(kv_swap *sw, int n_blocks, int block_size, size_t block_bytes,
                 const kv_link *link, kv_err *err)
{
    memset(sw, 0, sizeof *sw);
    if (block_bytes == 0)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: blocks of 0 bytes");
    sw->link = link ? *link : kv_link_default();
    if (!(sw->link.bandwidth > 0) || !(sw->link.latency >= 0))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: link of %g B/s and %g s latency",
                       sw->link.bandwidth, sw->link.latency);
    int rc = kv_pool_init(&sw->pool, n_blocks, block_size, block_bytes, err);
    if (rc) return rc;
    sw->mem = kv_calloc((size_t)n_blocks * block_bytes);
    if (!sw->mem) {
        kv_pool_free(&sw->pool);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_init: host tier of %d blocks of %zu bytes",
                       n_blocks, block_bytes);
    }
    return KV_OK;
}

void kv_swap_free(kv_swap *sw)
{
    if (!sw) return;
    kv_pool_free(&sw->pool);
    kv_free(sw->mem);
    memset(sw, 0, sizeof *sw);
}

void kv_swapped_drop(kv_swap *sw, kv_swapped *s)
{
    if (!s) return;
    for (int i = 0; s->resident && i < s->n_blocks; i++)
        kv_pool_unref(&sw->pool, s->host_blocks[i], NULL);
    kv_free(s->host_blocks);
    kv_free(s->tokens);
    memset(s, 0, sizeof *s);
}

/* What this first version can swap: per-token formats, no window, no prefix cache. */
static int check_swappable(const kv_swap *sw, kv_backend *b, const kv_swap_io *io, int slot,
                           const char *who, kv_err *err)
{
    if (!b || !b->paged || !io || !io->copy_out)
        return kv_fail(err, KV_ERR_ARG, "%s: needs a paged backend and its swap io", who);
    if (slot < 0 || slot >= b->paged->n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d outside [0, %d)", who, slot,
                       b->paged->n_slots);
    if (io->block_bytes != sw->pool.block_bytes || b->paged->pool.block_size != sw->pool.block_size)
        return kv_fail(err, KV_ERR_ARG, "%s: device blocks of %d tokens, %zu bytes but host "
                       "blocks of %d tokens, %zu bytes", who, b->paged->pool.block_size,
                       io->block_bytes, sw->pool.block_size, sw->pool.block_bytes);
    if (b->spec.window > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window sequence (its ring "
                       "position is per sequence state this version does not save)", who);
    if (b->paged->prefix_caching)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: with prefix caching on (a swapped-in "
                       "table would have to be re-registered)", who);
    for (int l = 0; l < b->config->n_layers; l++) {
        const int f = kv_cache_spec_layer_dtype(&b->spec, l);
        if (kvq_is_fp8(f) || kvq_is_kivi(f))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose per-sequence "
                           "scales or fp32 window this version does not save", who, l,
                           kv_dtype_name(f));
    }
    return KV_OK;
}

int kv_swap_out(kv_swap *sw, kv_backend *b, const kv_swap_io *io, int slot, kv_swapped *out,
                kv_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_swappable(sw, b, io, slot, "kv_swap_out", err);
    if (rc) return rc;
    kv_paged *pg = b->paged;
    const kv_block_table *t = &pg->tables[slot];
    const int n = t->n_blocks;
    if (n > kv_pool_available(&sw->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_out: slot %d holds %d blocks (%lld "
                       "tokens, %zu bytes a block) but the host tier has %d free of %d",
                       slot, n, (long long)t->n_tokens, sw->pool.block_bytes,
                       kv_pool_available(&sw->pool), sw->pool.n_blocks);
    out->host_blocks = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    out->tokens = kv_calloc((size_t)(t->n_tokens > 0 ? t->n_tokens : 1) * sizeof(int));
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    if (!out->host_blocks || !out->tokens || !pairs) {
        kv_free(pairs);
        kv_swapped_drop(sw, out);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_out: out of memory");
    }
    out->resident = 1;
    for (int i = 0; i < n && !rc; i++) {
        rc = kv_pool_alloc(&sw->pool, &out->host_blocks[i], err); /* cannot fail: checked */
        if (!rc) out->n_blocks = i + 1;
        pairs[i] = (kv_block_copy){t->blocks[i], out->host_blocks[i]};
    }
    /* one pass over the block list: a single batched copy, a single link latency */
    if (!rc && n) rc = io->copy_out(io->ctx, pairs, n, sw->mem, err);
    kv_free(pairs);
    if (rc) {
        kv_swapped_drop(sw, out);
        return rc;
    }
    link_account(sw, KV_LINK_OUT, n, sw->pool.block_bytes);
    out->n_tokens = t->n_tokens;
    if (t->n_tokens && pg->tokens[slot])
        memcpy(out->tokens, pg->tokens[slot], (size_t)t->n_tokens * sizeof(int));
    b->reset(b, slot);
    return KV_OK;
}

int kv_swap_in(kv_swap *sw, kv_backend *b, const kv_swap_io *io, int slot, kv_swapped *s,
               kv_err *err)
{
    int rc = check_swappable(sw, b, io, slot, "kv_swap_in", err);
    if (rc) return rc;
    kv_paged *pg = b->paged;
    kv_block_table *t = &pg->tables[slot];
    if (!s || !s->resident)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: the sequence is not in the host tier");
    if (t->n_blocks || b->length(b, slot))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: slot %d is in use", slot);
    if ((int64_t)s->n_tokens > b->spec.capacity)
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_in: %lld tokens exceed the capacity %d",
                       (long long)s->n_tokens, b->spec.capacity);
    const int n = s->n_blocks;
    if (n > kv_pool_available(&pg->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_in: the sequence needs %d blocks but "
                       "the device pool has %d free of %d (blocks of %d tokens)", n,
                       kv_pool_available(&pg->pool), pg->pool.n_blocks, pg->pool.block_size);
    /* the token record the prefix cache and fork read */
    if (pg->tok_cap[slot] < s->n_tokens) {
        int *tok = kv_calloc((size_t)s->n_tokens * sizeof(int));
        if (!tok) return kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
        kv_free(pg->tokens[slot]);
        pg->tokens[slot] = tok;
        pg->tok_cap[slot] = s->n_tokens;
    }
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    if (!pairs) return kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
    const int B = pg->pool.block_size;
    for (int i = 0; i < n && !rc; i++) {
        int blk = -1;
        rc = kv_pool_alloc(&pg->pool, &blk, err);
        if (rc) break;
        const int64_t rows = s->n_tokens - (int64_t)i * B;
        rc = kv_block_table_push(t, blk, (int)(rows < B ? rows : B), err);
        if (rc) kv_pool_unref(&pg->pool, blk, NULL);
        pairs[i] = (kv_block_copy){s->host_blocks[i], blk};
    }
    if (!rc && n) rc = io->copy_in(io->ctx, pairs, n, sw->mem, err);
    kv_free(pairs);
    if (!rc) rc = b->set_blocks(b, slot, t->blocks, t->n_blocks, err);
    if (!rc && s->n_tokens) rc = b->set_length(b, slot, (int)s->n_tokens, err);
    if (rc) { /* give the device blocks back; the sequence stays in the host tier */
        b->reset(b, slot);
        return rc;
    }
    link_account(sw, KV_LINK_IN, n, sw->pool.block_bytes);
    if (s->n_tokens) memcpy(pg->tokens[slot], s->tokens, (size_t)s->n_tokens * sizeof(int));
    if (pg->pool.n_used > pg->peak_used) pg->peak_used = pg->pool.n_used;
    kv_swapped_drop(sw, s);
    return KV_OK;
}
