/*
 * kvlab convert: MHA → GQA/MQA by mean-pooling the K/V projection heads of each group
 * (Ainslie et al. 2023; reference_cpu/engine/kv_convert.h), written out as a new checkpoint, with the
 * change it makes to the model's next-token distributions measured on the way.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model_load.h"
#include "kv_checkpoint.h"
#include "kv_convert.h"
#include "kv_file.h"
#include "kv_heads.h"
#include "kv_rng.h"

static const char *const formats[] = {"kvlab", "llama2c", NULL};

int cmd_convert(int argc, char **argv)
{
    const char *cmd = "kvlab convert";
    const char *in_path = NULL, *def = NULL, *out_path = NULL, *format = "kvlab";
    int kv_heads = 0, compare = 128;
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &in_path, 0, 0, NULL, "FILE", "llama2.c or kvlab checkpoint to convert, `trained`, a GGUF file or smollm2", 0},
        {"--default", KV_OPT_CHOICE, &def, 0, 0, kv_cli_defaults, "NAME", "or an embedded model", 0},
        {"--kv-heads", KV_OPT_INT, &kv_heads, 1, 1 << 16, NULL, "N", "KV heads after pooling (divides the model's H_kv; 1 = MQA)", 0},
        {"--out", KV_OPT_STRING, &out_path, 0, 0, NULL, "FILE", "where to write the converted checkpoint", 0},
        {"--format", KV_OPT_CHOICE, &format, 0, 0, formats, "F", "file format written (default kvlab)", 0},
        {"--compare", KV_OPT_INT, &compare, 0, 1 << 16, NULL, "T", "measure KL / top-1 over T seeded tokens (default 128; 0 = skip)", 0},
    };
    int r = kv_args_parse(cmd,
                          "Pool the model's K/V projection heads in groups of G = H_kv / N into N KV\n"
                          "heads (the mean of each group; query and output projections unchanged) and\n"
                          "write the result. The cache then holds N instead of H_kv heads per layer.\n"
                          "Before uptraining, the pooled model is a different function: --compare\n"
                          "runs T seeded tokens through both (teacher-forced, CPU) and reports the mean\n"
                          "KL(original || pooled) of the next-token distributions and how often their\n"
                          "argmax agrees.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (!in_path == !def) return kv_args_bad(cmd, "--model", "give exactly one of --model FILE or --default NAME");
    if (!opts[2].seen) return kv_args_bad(cmd, "--kv-heads", "missing (the KV heads to pool into)");
    if (!out_path) return kv_args_bad(cmd, "--out", "missing (the checkpoint to write)");

    kv_err err = {{0}};
    /* a device node, FIFO, symbolic link or missing folder as --out is refused now, before
     * any work */
    int st = kv_cli_outputs_check(cmd, (const kv_cli_output[]){{"--out", out_path}}, 1);
    if (st) return st;
    kv_model out = {0};
    kv_cli_model mdl;
    const kv_cli_model_args ma = {in_path, def, NULL, NULL, KV_CLI_TEXT_NONE, 0};
    if ((st = kv_cli_model_load(cmd, &ma, &mdl))) return st;
    const kv_model *const in = &mdl.m;
    const kv_config *c = &in->config;
    st = kv_convert_pool_kv_heads(&out, in, kv_heads, &err);
    if (st) {
        kv_cli_model_close(&mdl);
        return kv_cli_fail(cmd, "--kv-heads", st, &err);
    }
    const int d = kv_config_head_dim(c);
    printf("convert: H %d, H_kv %d (G %d) -> H_kv %d (G %d), d %d: each new K/V head is the mean "
           "of %d old ones\n", c->n_heads, c->n_kv_heads,
           kv_heads_group(c->n_heads, c->n_kv_heads), kv_heads,
           kv_heads_group(c->n_heads, kv_heads), d, c->n_kv_heads / kv_heads);
    char a[32], b[32];
    printf("cache per token (fp32, L %d): %s -> %s (L*2*H_kv*d*4 bytes)\n", c->n_layers,
           kv_fmt_bytes((double)c->n_layers * 2 * c->n_kv_heads * d * 4, a, sizeof a),
           kv_fmt_bytes((double)c->n_layers * 2 * kv_heads * d * 4, b, sizeof b));
    if (compare > 0) {
        int n = compare < c->seq_len ? compare : c->seq_len;
        int *tok = kv_calloc((size_t)n * sizeof(int));
        kv_rng rng;
        kv_rng_seed(&rng, 1);
        for (int i = 0; tok && i < n; i++) tok[i] = (int)(kv_rng_u32(&rng) % (uint32_t)c->vocab_size);
        kv_convert_diff df;
        st = tok ? kv_convert_compare(in, &out, tok, n, &df, &err)
                 : kv_fail(&err, KV_ERR_NOMEM, "tokens");
        kv_free(tok);
        if (st) {
            kv_cli_model_close(&mdl);
            kv_model_free(&out);
            return kv_cli_fail(cmd, "compare", st, &err);
        }
        printf("output change over %d seeded tokens (teacher-forced): KL mean %.4g nats, max %.4g; "
               "top-1 agreement %.1f%%; max |logit diff| %.4g%s\n", df.positions, df.kl_mean,
               df.kl_max, 100.0 * df.top1_agree, df.max_abs, df.identical ? " (bit-identical)" : "");
    }
    st = kv_checkpoint_write(out_path, &out, strcmp(format, "kvlab") ? KV_FILE_LLAMA2C : KV_FILE_KVLAB,
                             &err);
    kv_cli_model_close(&mdl);
    kv_model_free(&out);
    if (st) return st == KV_ERR_IO ? kv_cli_write_fail(cmd, "--out", &err)
                                   : kv_cli_fail(cmd, out_path, st, &err);
    printf("wrote %s (%s format)\n", out_path, format);
    return KV_EXIT_OK;
}
