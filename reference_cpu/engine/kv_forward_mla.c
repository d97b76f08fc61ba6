/* The multi-head latent attention block of the forward pass (kv_attn_block.h): chapter 11.
 *
 * Per layer, for the step's T rows xb [T][dim] (normed):
 *
 *   queries and latent   kv_mla_project(): q_nope, q_R (rotated) per head, and the row
 *                        c_KV ‖ k_R = RMSNorm(W_DKV·x) ‖ RoPE(W_KR·x) — RoPE on k_R only
 *   cache                the row, one plane (kv_cache_write_seq() with no V): d_c + d_R
 *                        elements per token for all H heads
 *   attention            kv_mla_attention_absorbed() over the slot's rows 0..pos: q̃ = W_UKᵀ q,
 *                        scores against the latent and k_R, the weighted sum in latent space,
 *                        W_UV after it (kv_attention_mla.h derives it)
 *   output               xb2 = Wo · the heads' outputs [H·d_v]
 *
 * Each row is projected alone and attends over its own n = pos + 1 rows in one fixed order, so
 * a token's logits do not depend on whether its prefix came in one chunk or one token at a
 * time (tests/test_mla_model.c holds cached decode to chapter 01's recompute bit for bit).
 *
 * What it refuses (check()): a window (the block reads rows 0..pos, not a ring's rows),
 * chapter 09's retention (its selectors score per-head keys, which a latent cache never
 * holds), tensor-parallel shards (ranks split KV heads; MLA has one latent row, which every
 * rank would hold whole) and a storage format whose group does not divide the latent row (the
 * cache's own check would call the row a head dim). The CUDA engine has no MLA block and refuses the model at upload. */
#include "kv_attn_block.h"
#include "kv_attention_mla.h"
#include "kv_ops_fast.h"
#include "kv_quant.h"

static int mla_check(const kv_config *cfg, const kv_cache_spec *spec, const kv_shard *sh,
                     kv_err *err)
{
    if (sh)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_forward: an MLA model on a tensor-parallel "
                       "shard is not supported: ranks split KV heads, and MLA caches one latent "
                       "row that every head reads (chapter 11)");
    if (spec->window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_forward: a sliding window (chapter 06) on an "
                       "MLA model is not supported: its attention block reads rows 0..pos, not a "
                       "window's ring");
    if (spec->retain.select)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_forward: %s retention (chapter 09) on an MLA "
                       "model is not supported: its selectors score per-head keys, which a latent "
                       "cache never holds", kv_select_method_name(spec->retain.select));
    /* the group the cache's own check asks every row to hold (kv_cache_spec_check_caps()),
     * which would call the row a head dim: here it is the latent row */
    const int r = kv_mla_row(&cfg->mla), f = spec->quant.dtype;
    const int g = f >= 0 && f < KV_QF_COUNT ? kvq_row_group(f, KV_QROLE_VALUE, r) : 0;
    if (g && r % g)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_forward: %s needs the latent row (d_c + d_R "
                       "= %d) to be a multiple of its group %d", kv_quant_name(f), r, g);
    return KV_OK;
}

/* one plane of rows c_KV ‖ k_R: the latent cache of chapter 11 (kv_mla_cache_config()) */
static int mla_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                            kv_err *err)
{
    kv_config shape;
    int rc = kv_mla_cache_config(&cfg->mla, cfg->n_layers, cfg->seq_len, &shape, err);
    return rc ? rc : kv_cache_create_planes(c, &shape, spec, 1, err);
}

static void mla_cache_shape(kv_config *shape, const kv_shard *sh)
{
    (void)sh; /* refused by mla_check() */
    shape->dim = kv_mla_row(&shape->mla); /* one KV head whose rows are d_c + d_R */
    shape->n_heads = 1;
    shape->n_kv_heads = 1;
}

/* the step's floats: q_nope, q_R, rows, the heads' outputs and kv_mla_project()'s scratch */
static size_t step_floats(const kv_config *p, int T)
{
    const kv_mla_dims *m = &p->mla;
    const size_t H = (size_t)p->n_heads, Tz = (size_t)T;
    const size_t proj = Tz * ((size_t)m->q_rank + H * (m->d_nope + m->d_rope));
    return Tz * (H * m->d_nope + H * m->d_rope + (size_t)kv_mla_row(m) + H * m->d_v) + proj;
}

static int mla_begin(kv_attn_step *a, kv_err *err)
{
    const size_t n = step_floats(&a->m->config, a->T);
    a->max_len = 0;
    for (int i = 0; i < a->n_seqs; i++)
        if (a->seqs[i].pos + a->seqs[i].n_tokens > a->max_len)
            a->max_len = a->seqs[i].pos + a->seqs[i].n_tokens;
    a->scratch = kv_calloc(n * sizeof(float));
    if (!a->scratch)
        return kv_fail(err, KV_ERR_NOMEM, "kv_forward: could not allocate %.1f MiB for the MLA "
                       "block's rows", (double)n * 4 / 1048576.0);
    return KV_OK;
}

static int mla_layer(kv_attn_step *a, int l, kv_err *err)
{
    const kv_config *p = &a->m->config;
    const kv_mla_dims *m = &p->mla;
    const kv_mla_layer *w = &a->m->mla[l];
    const kv_seq *seqs = a->seqs;
    kv_state *s = a->s;
    const int T = a->T, H = p->n_heads, width = kv_mla_row(m);
    float *qn = a->scratch;                          /* [T][H][d_nope] */
    float *qr = qn + (size_t)T * H * m->d_nope;      /* [T][H][d_R], rotated at its position */
    float *row = qr + (size_t)T * H * m->d_rope;     /* [T][d_c + d_R]: c_KV ‖ RoPE(k_R) */
    float *o = row + (size_t)T * width;              /* [T][H][d_v]: the heads' outputs */
    float *proj = o + (size_t)T * H * m->d_v;        /* kv_mla_project_scratch(w, T) */
    int rc;

    kv_mla_project(w, s->xb, s->tok_pos, T, a->rope_freq, p->norm_eps, qn, qr, row, proj);
    /* the rows first, one call per sequence (a quantized cache sees the whole chunk), so a
     * prefill row can attend to the rows before it; a latent cache has one plane: no V */
    for (int i = 0, t = 0; i < a->n_seqs; t += seqs[i].n_tokens, i++) {
        rc = kv_cache_write_seq(a->c, l, seqs[i].slot, seqs[i].pos, seqs[i].n_tokens,
                                row + (size_t)t * width, NULL, err);
        if (rc) return rc;
    }
    /* each row over its slot's rows 0..pos, in latent space; every head reads the same rows */
    for (int t = 0; t < T; t++) {
        const kv_head_view lat = kv_cache_view(a->c, l, s->tok_slot[t], 0, KV_QROLE_KEY);
        rc = kv_mla_attention_absorbed(w, qn + (size_t)t * H * m->d_nope,
                                       qr + (size_t)t * H * m->d_rope, &lat, s->tok_pos[t] + 1,
                                       o + (size_t)t * H * m->d_v, err);
        if (rc) return rc;
    }
    kv_matmul_fast(s->xb2, o, w->wo, T, H * m->d_v, p->dim);
    return KV_OK;
}

/* ---- counters ----------------------------------------------------------------------------
 * Symbols: L, H, dim, hidden, V as kv_forward.c's; d_c, d_R, d_nope, d_v, q_rank (kv_mla.h);
 * r = d_c + d_R the cached row; b bytes per cached element (metadata included).
 *
 *   P = L · (q + dim·r + H·d_v·dim + 3·dim·hidden)   weights a token multiplies, with
 *       q = dim·H·(d_nope + d_R), or dim·q_rank + q_rank·H·(d_nope + d_R) through the bottleneck
 *   flops_proj  += 2·P per new token + 2·dim·V per classifier row
 *   flops_attn  += L·H·(2·d_nope·d_c + 2·d_c·d_v) per new token (q̃ and W_UV, once per step)
 *                + L·H·(2·r + 2·d_c) per (new token, cached row): kv_mla_attention_flops()
 *   kv_bytes_read    += L·r·b per (new token, cached row): one row serves all H heads
 *   kv_bytes_written += L·r·b per new token                                                  */
static void mla_count(kv_counters *cnt, const kv_config *c, const kv_cache_spec *spec,
                      const kv_seq *seqs, int n_seqs)
{
    if (!cnt) return;
    const kv_mla_dims *m = &c->mla;
    const double L = c->n_layers, H = c->n_heads, dim = c->dim, hidden = c->hidden_dim;
    const double dc = m->d_c, dr = m->d_rope, dn = m->d_nope, dv = m->d_v, R = m->q_rank;
    const double r = dc + dr;
    const double b = kv_cache_spec_bytes_per_element(spec, c->n_layers, kv_mla_row(m));
    const double q = R > 0 ? dim * R + R * H * (dn + dr) : dim * H * (dn + dr);
    const double P = L * (q + dim * r + H * dv * dim + 3.0 * dim * hidden);
    for (int s = 0; s < n_seqs; s++) {
        const double n = seqs[s].n_tokens, p0 = seqs[s].pos;
        const double attended = n * p0 + n * (n + 1.0) / 2.0; /* sum of (p+1) */
        const double n_cls = seqs[s].all_logits ? n : 1.0;
        cnt->flops_proj += 2.0 * P * n + 2.0 * dim * c->vocab_size * n_cls;
        cnt->flops_attn += L * H * (n * (2.0 * dn * dc + 2.0 * dc * dv) +
                                    attended * (2.0 * r + 2.0 * dc));
        cnt->kv_bytes_read += L * r * b * attended;
        cnt->kv_bytes_written += L * r * b * n;
        cnt->tokens += seqs[s].n_tokens;
    }
    cnt->steps += 1;
}

const kv_attn_block kv_attn_mla = {
    "mla", mla_check, mla_cache_create, mla_cache_shape,
    mla_begin, mla_layer, kv_attn_step_end, mla_count,
};
