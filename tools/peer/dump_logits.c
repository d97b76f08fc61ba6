/* dump_logits.c: greedy generation through llama.cpp's libllama, with the margin at each step.
 *
 * The outside reference for kvlab's GGUF path. It tokenizes a prompt with the model's own
 * vocabulary, runs the whole prompt as one batch, then generates N tokens greedily (argmax,
 * temperature 0), one token per decode call. For each step it prints the chosen id and the
 * top-2 margin (largest logit minus the second largest): llama.cpp's CPU matmuls quantize
 * activations to 8 bits, so a reimplementation in fp32 may pick the other token only where
 * this margin is small.
 *
 * Output (text, stdout):
 *   prompt_ids N id id ...
 *   step I id ID margin M top1 L1 top2 ID2 L2     (one line per generated token)
 * --logits-at P,P,...  --logits-out FILE  writes the full logit vector (n_vocab little-endian
 * float32) after each listed prompt position, in the order given;
 * --step-logits FILE  writes the full logits of every generation step the same way.
 *
 * Build: tools/peer/build-llama.sh (links the static libllama and ggml). */
#define _POSIX_C_SOURCE 200809L /* strdup */

#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_AT 16

static void usage(FILE *f)
{
    fprintf(f,
        "usage: dump_logits -m MODEL.gguf (-p PROMPT | -f FILE) [options]\n"
        "  -n N               tokens to generate greedily (default 64)\n"
        "  -t N               threads (default 1, for determinism)\n"
        "  --no-special       treat <|im_start|> etc. in the prompt as plain text\n"
        "  --logits-at P,...  prompt positions whose full logits to write (at most %d)\n"
        "  --logits-out FILE  where to write them (float32 little-endian, n_vocab each)\n"
        "  --step-logits FILE write the full logits of every generation step\n"
        "  --kv-f16           keep llama.cpp's default f16 KV cache (default: f32)\n"
        "  --help             this text\n", MAX_AT);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) { cap *= 2; buf = realloc(buf, cap + 1); }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

/* the top two logits of one row: the margin a greedy choice stands on */
static void top2(const float *logits, int n_vocab, int *i1, int *i2)
{
    int a = 0, b = -1;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[a]) { b = a; a = i; }
        else if (b < 0 || logits[i] > logits[b]) b = i;
    }
    *i1 = a; *i2 = b;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL;
    const char *logits_out = NULL, *step_out = NULL;
    int n_gen = 64, threads = 1, special = 1, kv_f16 = 0, n_at = 0, at[MAX_AT];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") && more) model_path = argv[++i];
        else if (!strcmp(a, "-p") && more) prompt = argv[++i];
        else if (!strcmp(a, "-f") && more) prompt_file = argv[++i];
        else if (!strcmp(a, "-n") && more) n_gen = atoi(argv[++i]);
        else if (!strcmp(a, "-t") && more) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--no-special")) special = 0;
        else if (!strcmp(a, "--kv-f16")) kv_f16 = 1;
        else if (!strcmp(a, "--logits-out") && more) logits_out = argv[++i];
        else if (!strcmp(a, "--step-logits") && more) step_out = argv[++i];
        else if (!strcmp(a, "--logits-at") && more) {
            for (char *s = argv[++i], *end; *s; s = end + (*end == ',')) {
                if (n_at == MAX_AT) {
                    fprintf(stderr, "dump_logits: too many positions\n");
                    return 2;
                }
                at[n_at++] = (int)strtol(s, &end, 10);
                if (end == s) { fprintf(stderr, "dump_logits: bad --logits-at\n"); return 2; }
            }
        } else { fprintf(stderr, "dump_logits: bad argument '%s'\n", a); usage(stderr); return 2; }
    }
    if (!model_path || (!prompt == !prompt_file) || n_gen < 0 || threads < 1 ||
        (n_at > 0) != (logits_out != NULL)) {
        usage(stderr);
        return 2;
    }
    size_t len = 0;
    char *text = prompt_file ? read_file(prompt_file, &len) : strdup(prompt);
    if (!text) { fprintf(stderr, "dump_logits: cannot read %s\n", prompt_file); return 1; }
    if (!prompt_file) len = strlen(text);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "dump_logits: cannot load %s\n", model_path); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    /* add_special = true: BOS only where the vocabulary asks for it (SmolLM2: it does not) */
    int n_prompt = -llama_tokenize(vocab, text, (int32_t)len, NULL, 0, true, special);
    llama_token *toks = malloc(sizeof(llama_token) * (size_t)(n_prompt + n_gen + 1));
    if (n_prompt <= 0 ||
        llama_tokenize(vocab, text, (int32_t)len, toks, n_prompt, true, special) != n_prompt) {
        fprintf(stderr, "dump_logits: tokenization failed\n");
        return 1;
    }
    for (int k = 0; k < n_at; k++)
        if (at[k] < 0 || at[k] >= n_prompt) {
            fprintf(stderr, "dump_logits: position %d outside the prompt (%d tokens)\n",
                    at[k], n_prompt);
            return 2;
        }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_gen + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (!kv_f16) cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "dump_logits: cannot create a context\n"); return 1; }

    printf("prompt_ids %d", n_prompt);
    for (int i = 0; i < n_prompt; i++) printf(" %d", toks[i]);
    printf("\n");

    /* the prompt as one batch; logits out at the last token and at each asked position */
    struct llama_batch b = llama_batch_init(n_prompt, 0, 1);
    b.n_tokens = n_prompt;
    for (int i = 0; i < n_prompt; i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = i == n_prompt - 1;
        for (int k = 0; k < n_at; k++) if (at[k] == i) b.logits[i] = 1;
    }
    if (llama_decode(ctx, b)) { fprintf(stderr, "dump_logits: prompt decode failed\n"); return 1; }
    if (logits_out) {
        FILE *f = fopen(logits_out, "wb");
        if (!f) { fprintf(stderr, "dump_logits: cannot write %s\n", logits_out); return 1; }
        for (int k = 0; k < n_at; k++)
            fwrite(llama_get_logits_ith(ctx, at[k]), sizeof(float), (size_t)n_vocab, f);
        if (fclose(f)) { fprintf(stderr, "dump_logits: write failed\n"); return 1; }
    }
    llama_batch_free(b);

    FILE *sf = step_out ? fopen(step_out, "wb") : NULL;
    if (step_out && !sf) { fprintf(stderr, "dump_logits: cannot write %s\n", step_out); return 1; }
    int row = n_prompt - 1;   /* the batch index of the logits that choose the next token */
    for (int s = 0; s < n_gen; s++) {
        const float *lg = llama_get_logits_ith(ctx, row);
        int i1, i2;
        top2(lg, n_vocab, &i1, &i2);
        printf("step %d id %d margin %.6f top1 %.6f top2 %d %.6f\n", s, i1, lg[i1] - lg[i2],
               lg[i1], i2, lg[i2]);
        if (sf) fwrite(lg, sizeof(float), (size_t)n_vocab, sf);
        toks[n_prompt + s] = i1;
        if (s + 1 == n_gen) break;
        /* no stop at end-of-generation tokens: the test compares a fixed number of steps */
        if (llama_decode(ctx, llama_batch_get_one(&toks[n_prompt + s], 1))) {
            fprintf(stderr, "dump_logits: decode failed at step %d\n", s);
            return 1;
        }
        row = 0;
    }
    if (sf && fclose(sf)) { fprintf(stderr, "dump_logits: write failed\n"); return 1; }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(toks);
    free(text);
    return 0;
}
