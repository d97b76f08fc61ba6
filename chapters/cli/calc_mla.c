/*
 * kvlab calc, chapter 11: the cache of multi-head latent attention (MLA).
 *
 * An MLA layer caches one row per token, c_KV (d_c) ‖ k_R (d_R), whatever the number of heads:
 *   bytes = L · N · (d_c + d_R) · b      against L · 2 · N · H_kv · d · b (chapters 02, 03)
 * The presets are DeepSeek's (reference_cpu/model/kv_mla.c names the configs).
 */
#include <stdio.h>

#include "cli.h"
#include "kv_mla.h"
#include "kv_quant.h"

static double mla_b(const char *dt, int width) { return kv_quant_bytes_per_element(kv_quant_parse(dt), width); }

void kv_calc_mla_list(FILE *f)
{
    int np = 0;
    const kv_mla_preset *p = kv_mla_presets(&np);
    fprintf(f, "\nMLA presets (chapter 11; --preset NAME explains one):\n");
    fprintf(f, "%-16s %6s %3s %3s %4s %4s %5s %4s %6s %7s %7s\n", "preset", "dim", "L", "H",
            "d_c", "d_R", "nope", "d_v", "q_rank", "vocab", "seq");
    for (int i = 0; i < np; i++)
        fprintf(f, "%-16s %6d %3d %3d %4d %4d %5d %4d %6d %7d %7d\n", p[i].name, p[i].dim,
                p[i].n_layers, p[i].n_heads, p[i].mla.d_c, p[i].mla.d_rope, p[i].mla.d_nope,
                p[i].mla.d_v, p[i].mla.q_rank, p[i].vocab_size, p[i].seq_len);
}

/* DeepSeek-V2 against the model its paper measures the reduction against */
static void paper_claim(FILE *f, const kv_mla_preset *v2)
{
    const kv_preset *base = kv_mla_baseline();
    const kv_config *b = &base->config;
    const double mla = (double)v2->n_layers * kv_mla_row(&v2->mla);
    const double gqa = (double)b->n_layers * 2 * b->n_kv_heads * kv_config_head_dim(b);
    fprintf(f, "\nThe DeepSeek-V2 paper's \"KV cache reduced by 93.3 %%\" is against %s (L %d, H %d, "
            "H_kv %d, d %d):\n", base->name, b->n_layers, b->n_heads, b->n_kv_heads,
            kv_config_head_dim(b));
    fprintf(f, "  elements per token %d * %d = %.0f vs %d * 2 * %d * %d = %.0f: %.1f %% of it "
            "(%.1f %% less) at the same b;\n", v2->n_layers, kv_mla_row(&v2->mla), mla,
            b->n_layers, b->n_kv_heads, kv_config_head_dim(b), gqa, 100 * mla / gqa,
            100 * (1 - mla / gqa));
    fprintf(f, "  93.3 %% needs DeepSeek-V2's 6-bit cache elements against 16-bit ones: "
            "%.0f * 6 / (%.0f * 16) = %.2f %% (%.1f %% less).\n", mla, gqa,
            100 * mla * 6 / (gqa * 16), 100 * (1 - mla * 6 / (gqa * 16)));
}

void kv_calc_mla_heads_table(FILE *f, const char *dt, int64_t seq, int64_t batch)
{
    int np = 0, nl = 0;
    const kv_mla_preset *p = kv_mla_presets(&np);
    const kv_preset *l = kv_presets(&nl);
    const int64_t n = seq > 0 ? seq : 32768;
    char u[5][32];
    fprintf(f, "\nMLA (chapter 11): one row of d_c + d_R elements per token and layer, read by every "
            "query head:\nbytes per token = L * (d_c + d_R) * b. DeepSeek's rows: d = qk_nope_head_dim "
            "= v_head_dim,\nthe MHA/GQA/MQA columns as its paper's Table 1 counts them (2 * H_kv * d "
            "per layer). Rows\nmarked * are the presets above with DeepSeek-V2's ratios d_c = 4d, "
            "d_R = d/2: 4.5 * d per\nlayer, the cache of GQA with H_kv = 2.25.\n\n");
    fprintf(f, "%-17s %3s %3s %4s %4s %12s %12s %12s %12s %7s %12s\n", "model", "L", "H", "d_c",
            "d_R", "MHA H_kv=H", "GQA H_kv=H/8", "MQA H_kv=1", "MLA", "MLA/MHA", "MLA at N");
    for (int i = 0; i < np + nl; i++) {
        const int mine = i < np;
        const kv_config *c = mine ? NULL : &l[i - np].config;
        const int L = mine ? p[i].n_layers : c->n_layers, H = mine ? p[i].n_heads : c->n_heads;
        const int d = mine ? p[i].mla.d_nope : kv_config_head_dim(c);
        const int dc = mine ? p[i].mla.d_c : 4 * d, dr = mine ? p[i].mla.d_rope : d / 2;
        const double unit = (double)L * 2.0 * d * mla_b(dt, d); /* per token per KV head */
        const double lat = (double)L * (dc + dr) * mla_b(dt, dc + dr);
        char name[40];
        snprintf(name, sizeof name, "%s%s", mine ? p[i].name : l[i - np].name, mine ? "" : " *");
        kv_fmt_bytes(unit * H, u[0], sizeof u[0]);
        if (H % 8 == 0) kv_fmt_bytes(unit * (H / 8), u[1], sizeof u[1]);
        else snprintf(u[1], sizeof u[1], "-");
        kv_fmt_bytes(unit, u[2], sizeof u[2]);
        kv_fmt_bytes(lat, u[3], sizeof u[3]);
        kv_fmt_bytes(lat * (double)n * (double)batch, u[4], sizeof u[4]);
        fprintf(f, "%-17s %3d %3d %4d %4d %12s %12s %12s %12s %6.2f%% %12s\n", name, L, H, dc, dr,
                u[0], u[1], u[2], u[3], 100 * lat / (unit * H), u[4]);
    }
    fprintf(f, "(MLA at N: N = %lld tokens, batch B = %lld.)\n", (long long)n, (long long)batch);
    paper_claim(f, kv_mla_preset_find("deepseek-v2"));
}

void kv_calc_mla_explain(const kv_mla_preset *p, const char *dt, int64_t n, int64_t batch)
{
    const kv_mla_dims *m = &p->mla;
    const int L = p->n_layers, H = p->n_heads, w = kv_mla_row(m);
    const double b = mla_b(dt, w);
    const double per_layer = w * b, per_token = L * per_layer, at_n = per_token * (double)n;
    const double mha = (double)L * 2 * H * m->d_nope * mla_b(dt, m->d_nope);
    char u[4][32];
    printf("KV-cache memory of %s (multi-head latent attention, chapter 11): L %d, H %d,\n"
           "d_c %d (kv_lora_rank), d_R %d (qk_rope_head_dim), d_nope %d, d_v %d, q_rank %d; "
           "dtype %s, b = %g bytes\n\n", p->name, L, H, m->d_c, m->d_rope, m->d_nope, m->d_v,
           m->q_rank, dt, b);
    printf("  bytes = L * N * (d_c + d_R) * b   (one latent c_KV and one shared RoPE key k_R per "
           "token; no V,\n  no per-head rows: every head up-projects the same latent)\n\n");
    printf("  %-20s %-19s = %d * %g = %s\n", "per token per layer", "(d_c + d_R) * b", w, b,
           kv_fmt_bytes(per_layer, u[0], sizeof u[0]));
    printf("  %-20s %-19s = %d * %g = %s\n", "per token", "L * (per layer)", L, per_layer,
           kv_fmt_bytes(per_token, u[1], sizeof u[1]));
    printf("  %-20s %-19s = %lld * %g = %s\n", "at N tokens", "N * (per token)", (long long)n,
           per_token, kv_fmt_bytes(at_n, u[2], sizeof u[2]));
    printf("  %-20s %-19s = %lld * %s = %s\n", "at batch B", "B * (at N)", (long long)batch,
           u[2], kv_fmt_bytes(at_n * (double)batch, u[3], sizeof u[3]));
    printf("\n  as MHA with H = %d heads of d = %d (2 * H * d per layer): %s per token; MLA keeps "
           "%.2f %% of it,\n  the cache of GQA with H_kv = (d_c + d_R) / (2 d) = %g KV heads.\n", H,
           m->d_nope, kv_fmt_bytes(mha, u[0], sizeof u[0]), 100 * per_token / mha,
           (double)w / (2.0 * m->d_nope));
    if (kv_mla_preset_find("deepseek-v2") == p) paper_claim(stdout, p);
}
