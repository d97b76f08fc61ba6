/*
 * kvlab generate: text (or token ids) from an embedded default or a checkpoint, naive or
 * cached, on the CPU or the GPU, with the tokens/s it reached.
 *
 * As llama2.c's run.c: an empty prompt is BOS alone, generation ends at BOS or EOS (unless
 * --no-stop), more steps than the context holds are cut to fit (with a note), and the speed is
 * also given run.c's way, from the end of the first step (which holds the prompt's prefill)
 * to the end of the last.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_checkpoint.h"
#include "kv_generate.h"
#include "kv_needle.h"
#include "model_load.h"

static const char *const modes[] = {"naive", "cached", NULL};
/* kv_cli_defaults and chapter 11's MLA model, which only this command runs (on the cpu) */
static const char *const models[] = {"tiny", "tiny-gqa", "small", "tiny-mla", NULL};

/* When the first and the last step ended (kv_now()): run.c's tokens/s leaves the first out. */
typedef struct {
    double first, last;
} step_times;

static void on_step(void *user, int step, int token, const kv_counters *work, double seconds)
{
    (void)token, (void)work, (void)seconds;
    step_times *t = user;
    t->last = kv_now();
    if (step == 0) t->first = t->last;
}

/* Print a token's text, leaving out raw control bytes a random model may pick. */
static void print_piece(const char *s)
{
    if (!s || !s[0]) return;
    if (s[1] == '\0' && !(isprint((unsigned char)s[0]) || isspace((unsigned char)s[0]))) return;
    fputs(s, stdout);
}

int cmd_generate(int argc, char **argv)
{
    const char *cmd = "kvlab generate";
    const char *model_path = NULL, *def = NULL, *tok_path = NULL, *text = NULL, *save = NULL;
    const char *mode = "cached", *device = "cpu", *cache = "fp32";
    int steps = 64, no_stop = 0;
    double temperature = 0.0, top_p = 1.0;
    int64_t seed = 42;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "llama2.c or kvlab checkpoint, `trained`: the model kvlab ships (datasets/models/, with its tokenizer), a GGUF file, or smollm2: SmolLM2-135M-Instruct (tools/fetch-model.sh smollm2; docs/real-model.md)", 0},
        {"--default", KV_OPT_CHOICE, &def, 0, 0, models, "NAME", "embedded model (default tiny; tiny-mla: multi-head latent attention, chapter 11, cpu only)", 0},
        {"--save-model", KV_OPT_STRING, &save, 0, 0, NULL, "FILE", "also write the model as a kvlab checkpoint before generating (e.g. --default tiny-mla --save-model mla.bin, then --model mla.bin)", 0},
        {"--tokenizer", KV_OPT_STRING, &tok_path, 0, 0, NULL, "FILE", "llama2.c tokenizer.bin (defaults: the embedded byte tokenizer)", 0},
        {"--prompt", KV_OPT_TEXT, &text, 0, 0, NULL, "TEXT", "prompt text (needs a tokenizer unless empty; default and \"\": BOS only)", 0},
        {"--steps", KV_OPT_INT, &steps, 1, 1 << 24, NULL, "N", "tokens to generate (default 64; cut, with a note, to what the model's seq_len holds after the prompt)", 0},
        {"--no-stop", KV_OPT_FLAG, &no_stop, 0, 0, NULL, NULL, "generate all N tokens (default: end at BOS or EOS, as llama2.c's run.c)", 0},
        {"--mode", KV_OPT_CHOICE, &mode, 0, 0, modes, "M", "naive recompute or KV cache (default cached)", 0},
        KV_CLI_SAMPLER_OPTS(temperature, top_p, seed),
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "cache storage: fp32 (default), fp16, bf16, int8, int8-g32/64/128, fp8-e4m3, fp8-e5m2, int4, int2; options /head (fp8 per-head scales), /wR (KIVI window), /lA,B (only those layers; the rest fp16) (chapter 04)", 0},
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Generate tokens after a prompt and print them as text (with a tokenizer)\n"
                          "or as ids, then the speed reached. The embedded defaults have random\n"
                          "weights: their text is noise; they exist for timing and for the chapters.\n"
                          "A model with multi-head latent attention (tiny-mla, or a kvlab file of one)\n"
                          "caches one latent row per token (chapter 11) and runs on the cpu.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    e = kv_cli_check_device(cmd, device);
    if (!e) e = kv_cli_engine_check(cmd, device, &en);
    if (!e) e = kv_cli_outputs_check(cmd, (const kv_cli_output[]){{"--save-model", save}}, 1);
    if (e) return e;

    const char *ptext = text ? text : "";
    if (ptext[0] && !tok_path && !kv_cli_model_has_text(model_path))
        return kv_args_bad(cmd, "--prompt", "a model file needs --tokenizer FILE to encode the prompt");
    kv_cli_model_args ma = {model_path, def, "tiny", tok_path,
                            ptext[0] ? KV_CLI_TEXT_NEED : KV_CLI_TEXT_ANY, 0,
                            kv_cli_engine_storage(device, &en)};
    kv_cli_model mdl;
    if ((e = kv_cli_model_load(cmd, &ma, &mdl))) return e;
    kv_model *const mp = &mdl.m;
    kv_err err = {{0}};
    int *prompt = NULL, *out = NULL, n_prompt = 0, rc = KV_EXIT_OK, st;
    kv_backend *b = NULL;
    kv_sampler sampler;
    int have_sampler = 0;
    if (save && (st = kv_checkpoint_write(save, mp, KV_FILE_KVLAB, &err))) {
        rc = st == KV_ERR_IO ? kv_cli_write_fail(cmd, "--save-model", &err)
                             : kv_cli_fail(cmd, save, st, &err);
        goto done;
    }
    const int vocab = mp->config.vocab_size, have_tok = kv_cli_has_text(&mdl);
    if (have_tok && ptext[0]) {
        if ((st = kv_cli_encode(&mdl, ptext, 1, &prompt, &n_prompt, &err))) {
            rc = kv_cli_fail(cmd, "--prompt", st, &err);
            goto done;
        }
    }
    if (!n_prompt) { /* an empty prompt (or no tokenizer): BOS alone, as run.c */
        free(prompt);
        if (!(prompt = malloc(sizeof(int)))) {
            rc = kv_cli_fail(cmd, "prompt", KV_ERR_NOMEM, &err);
            goto done;
        }
        prompt[0] = kv_cli_bos(&mdl);
        n_prompt = 1;
    }
    /* the prompt and every token fed back take a position; the last chosen token is never fed */
    if (n_prompt > mp->config.seq_len) {
        fprintf(stderr, "%s: --prompt: %d tokens exceed the model's seq_len %d\n", cmd, n_prompt,
                mp->config.seq_len);
        rc = KV_EXIT_USAGE;
        goto done;
    }
    if ((int64_t)n_prompt + steps - 1 > mp->config.seq_len) {
        const int fit = mp->config.seq_len - n_prompt + 1;
        fprintf(stderr, "%s: note: --steps %d cut to %d: the model's seq_len %d holds the %d-token "
                "prompt and %d more tokens\n", cmd, steps, fit, mp->config.seq_len, n_prompt, fit - 1);
        steps = fit;
    }
    out = malloc((size_t)steps * sizeof(int)); /* [steps] */
    kv_cache_spec spec;
    if ((st = kv_needle_cache_spec(cache, 1, n_prompt + steps, &spec, &err))) {
        rc = kv_cli_fail(cmd, "--cache", st, &err);
        goto done;
    }
    kv_cli_layout_apply(&lo, &spec);
    if (!out) {
        rc = kv_cli_fail(cmd, "output", KV_ERR_NOMEM, &err);
        goto done;
    }
    if ((st = kv_cli_backend_engine(&b, device, mp, &spec, &en, &err))) {
        rc = kv_cli_fail(cmd, "backend", st, &err);
        goto done;
    }
    if ((st = kv_sampler_init(&sampler, vocab, (float)temperature, (float)top_p, (uint64_t)seed, &err))) {
        rc = kv_cli_fail(cmd, "sampler", st, &err);
        goto done;
    }
    have_sampler = 1;

    kv_gen_opts o = {0};
    o.mode = strcmp(mode, "naive") == 0 ? KV_MODE_NAIVE : KV_MODE_CACHED;
    o.n_steps = steps;
    o.sampler = &sampler;
    step_times times = {0, 0};
    o.on_step = on_step;
    o.user = &times;
    int stops[8];
    o.n_stop = kv_cli_stop_ids(&mdl, stops, 8);
    o.stop = stops;
    kv_counters total = {0};
    int n_out = 0;
    double t0 = kv_now();
    st = no_stop ? kv_generate(b, prompt, n_prompt, &o, out, &total, &err)
                 : kv_generate_stop(b, prompt, n_prompt, &o, out, &n_out, &total, &err);
    double t = kv_now() - t0;
    if (no_stop) n_out = steps;
    if (st) {
        rc = kv_cli_fail(cmd, "generation", st, &err);
        goto done;
    }
    if (have_tok) {
        char piece[256];
        fputs(ptext, stdout);
        int prev = prompt[n_prompt - 1];
        for (int i = 0; i < n_out; i++) {
            int stop = 0;
            for (int k = 0; k < o.n_stop && !no_stop; k++) stop |= out[i] == stops[k];
            if (stop) break; /* the stop token: not text */
            const int len = kv_cli_piece(&mdl, prev, out[i], piece, sizeof piece);
            if (mdl.vocab) fwrite(piece, 1, (size_t)len, stdout); /* bytes of UTF-8, as they come */
            else print_piece(piece);
            prev = out[i];
        }
        printf("\n");
    } else {
        for (int i = 0; i < n_out; i++) printf("%d%c", out[i], i + 1 < n_out ? ' ' : '\n');
    }
    if (n_out < steps) {
        char name[64] = "EOS";
        if (mdl.vocab) kv_cli_piece_name(&mdl, out[n_out - 1], name, sizeof name);
        else if (out[n_out - 1] == 1) snprintf(name, sizeof name, "BOS");
        fprintf(stderr, "%s: stopped at %s after %d of %d tokens (--no-stop to go on)\n", cmd,
                name, n_out, steps);
    }
    char lname[96], runc[64] = "";
    if (n_out > 1) /* run.c's figure: steps after the first, from the end of the first */
        snprintf(runc, sizeof runc, " (%.1f from the second token on, as run.c)",
                 (n_out - 1) / (times.last - times.first));
    fprintf(stderr, "%d tokens in %.4f s (prompt of %d tokens included): %.1f tokens/s%s; mode %s,"
                    " device %s, cache %s (%s)\n", n_out, t, n_prompt, n_out / t, runc, mode,
            b->name, cache, kv_cli_layout_name(&spec, lname, sizeof lname));
done:
    if (have_sampler) kv_sampler_free(&sampler);
    if (b) kv_backend_destroy(b);
    free(prompt);
    free(out);
    kv_cli_model_close(&mdl);
    return rc;
}
