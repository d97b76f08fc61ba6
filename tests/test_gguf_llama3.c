/*
 * Llama 3.x's RoPE frequency factors, held to llama.cpp on a tiny synthetic Llama 3.1 file.
 *
 * tests/data/gguf/llama3_rope.gguf (tools/gguf/make_llama3_rope.py): 3 layers, dim 32, H 2
 * over H_kv 1, head dim 16 (8 RoPE pairs), theta 500000, F32 weights from a fixed seed, and
 * rope_freqs.weight computed with Llama 3.1's rule (factor 8, low_freq_factor 1,
 * high_freq_factor 4, original context 8192). tests/data/llama3/ holds llama.cpp's logits
 * (dump_logits, tools/peer/make-llama3-expected.sh) at 6 positions of an 835-token prompt.
 *
 *  1. The loaded config: theta, and one factor per pair equal to the rule computed here from
 *     its definition (pairs 0-3 fast: 1; pair 4 smoothed; pairs 5-7 slow: 8).
 *  2. kvlab's logits at the 6 positions within LOGIT_BOUND of llama.cpp's, through the plain
 *     cache and through a StreamingLLM window (keys rotated at attention by the cache's table,
 *     kv_cache_rope_table(), which must carry the factors too).
 *  3. The factors matter: the same model with them dropped (every pair at theta^(-2i/d))
 *     agrees at position 0 (no rotation) but misses llama.cpp by more than 10 LOGIT_BOUND at
 *     the later positions, so a RoPE that ignored them fails 2.
 *  4. A checkpoint cannot carry the factors: both formats refuse in words, writing nothing.
 *  5. The file's tokenizer (Llama 3's llama-bpe, cut to 386 tokens): kv_vocab_encode() of
 *     prompt.txt, BOS added, gives llama.cpp's prompt ids.
 *  6. Linear RoPE scaling (llama_linear.gguf: rope.scaling.type linear, factor 4) is the
 *     factor 4 in every pair; kv_rope_freqs() divides theta^(-2i/d) by each factor, and
 *     without factors gives theta^(-2i/d) exactly, the bits every RoPE had before factors.
 *
 * LOGIT_BOUND is measured, not derived: the largest |kvlab - llama.cpp| over the 6 x 386
 * logits is 3.7e-4 (at position 834; logits of magnitude up to 26): both run fp32 matmuls
 * and an fp32 KV cache and differ by summation order and by llama.cpp's fp32 angles (kvlab
 * forms them in double). Without the factors the difference is 1.7 at position 64 and 7 to
 * 13 beyond.
 *
 * Usage: test_gguf_llama3 <tests/data/gguf> <tests/data/llama3>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"

#include "kv_checkpoint.h"
#include "kv_forward.h"
#include "kv_gguf_model.h"
#include "kv_ops.h"
#include "kv_vocab.h"

#include <math.h>
#include <unistd.h>

#define LOGIT_BOUND 1e-3
#define N_POS 6
#define MAX_PROMPT 1024

static int V;                    /* the vocabulary, 386 */
static int n_prompt, prompt[MAX_PROMPT];
static int positions[N_POS];
static float *expected;          /* [N_POS][V] llama.cpp's logits */

/* Llama 3.1's factor for pair i of d (conversion/llama.py's rule, from its definition) */
static double llama31_factor(int i, int d, double theta)
{
    const double factor = 8, low = 1, high = 4, original = 8192;
    const double wavelen = 2 * M_PI / pow(theta, -2.0 * i / d);
    if (wavelen < original / high) return 1;
    if (wavelen > original / low) return factor;
    const double s = (original / wavelen - low) / (high - low);
    return 1 / ((1 - s) / factor + s);
}

static int read_expected(const char *dir)
{
    char path[1024], line[16384];
    snprintf(path, sizeof path, "%s/logits.txt", dir);
    FILE *f = fopen(path, "r");
    KV_CHECK(f != NULL, "cannot read %s", path);
    if (!f) return -1;
    int got = 0, at;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "positions: 6 %d %d %d %d %d %d", &positions[0], &positions[1],
                   &positions[2], &positions[3], &positions[4], &positions[5]) == N_POS)
            got |= 1;
        if (sscanf(line, "prompt_ids %d%n", &n_prompt, &at) == 1 && n_prompt <= MAX_PROMPT) {
            const char *p = line + at;
            int k = 0, used;
            while (k < n_prompt && sscanf(p, "%d%n", &prompt[k], &used) == 1) p += used, k++;
            got |= k == n_prompt ? 2 : 0;
        }
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    size_t n = 0;
    expected = (float *)kv_test_slurp(path, &n);
    KV_CHECK(got == 3 && expected && n == sizeof(float) * N_POS * (size_t)V,
             "logits.txt / logits.f32: %d, %zu bytes", got, n);
    return got == 3 && expected && n == sizeof(float) * N_POS * (size_t)V ? 0 : -1;
}

/* the prompt in one step through a cache of @p spec; the largest |kvlab - llama.cpp| at each
 * listed position into err[N_POS] */
static int run(const kv_model *m, const kv_cache_spec *spec, double *err_at)
{
    kv_cache c;
    kv_state s;
    kv_err e;
    kv_state_init(&s);
    float *all = malloc(sizeof(float) * (size_t)n_prompt * V); /* [n_prompt][V] */
    int rc = all ? kv_forward_cache_create(&c, &m->config, spec, &e) : KV_ERR_NOMEM;
    KV_CHECK(rc == KV_OK, "cache: %s", rc == KV_ERR_NOMEM ? "no memory" : e.msg);
    if (rc) return free(all), rc;
    kv_seq q = {0, 0, n_prompt, prompt, all};
    rc = kv_forward(m, &c, &s, &q, 1, NULL, NULL, &e);
    KV_CHECK(rc == KV_OK, "forward: %s", e.msg);
    for (int k = 0; k < N_POS && !rc; k++) {
        err_at[k] = 0;
        for (int i = 0; i < V; i++) {
            const double d = fabs((double)all[(size_t)positions[k] * V + i] -
                                  expected[(size_t)k * V + i]);
            err_at[k] = d > err_at[k] ? d : err_at[k];
        }
    }
    kv_cache_free(&c);
    kv_state_free(&s);
    free(all);
    return rc;
}

static void check_config(const kv_config *c)
{
    const int d = kv_config_head_dim(c);
    KV_CHECK(c->rope_theta == 500000.0f && c->rotary_dim == 16 && d == 16 &&
             c->n_rope_factors == 8, "config: theta %g, rotary %d, %d factors",
             (double)c->rope_theta, c->rotary_dim, c->n_rope_factors);
    for (int i = 0; i < c->n_rope_factors && i < KV_ROPE_MAX_PAIRS; i++) {
        const double want = llama31_factor(i, d, 500000.0);
        KV_CHECK(fabs(c->rope_factors[i] - want) <= 1e-5 * want,
                 "factor %d: %.7g, Llama 3.1's rule %.7g", i, (double)c->rope_factors[i], want);
    }
}

static void check_logits(const kv_model *m)
{
    double plain[N_POS], window[N_POS], none[N_POS];
    kv_cache_spec spec = kv_cache_spec_default(1, n_prompt);
    if (run(m, &spec, plain)) return;
    /* a window holding the whole prompt, keys stored unrotated and turned at attention by
     * their cache index (here their position): the table kv_cache_rope_table() */
    spec.window.size = n_prompt - 4;
    spec.window.n_sinks = 4;
    spec.window.pos_scheme = KV_POS_CACHE;
    if (run(m, &spec, window)) return;
    kv_model dropped = *m; /* the same weights (shallow), the factors forgotten */
    dropped.config.n_rope_factors = 0;
    spec = kv_cache_spec_default(1, n_prompt);
    if (run(&dropped, &spec, none)) return;
    for (int k = 0; k < N_POS; k++) {
        printf("  pos %4d  |kvlab - llama.cpp| max %.3g, window %.3g; factors dropped %.3g\n",
               positions[k], plain[k], window[k], none[k]);
        KV_CHECK(plain[k] <= LOGIT_BOUND && window[k] <= LOGIT_BOUND,
                 "pos %d: %.3g, window %.3g > %g", positions[k], plain[k], window[k],
                 LOGIT_BOUND);
        if (positions[k] == 0)
            KV_CHECK(none[k] <= LOGIT_BOUND, "pos 0 turns nothing: %.3g", none[k]);
        else
            KV_CHECK(none[k] > 10 * LOGIT_BOUND, "pos %d: dropping the factors moves the "
                     "logits by only %.3g", positions[k], none[k]);
    }
}

static void check_checkpoint(const kv_model *m)
{
    char path[] = "/tmp/kvlab-llama3-XXXXXX";
    const int fd = mkstemp(path);
    KV_CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    unlink(path); /* the write must not create it */
    for (int format = KV_FILE_LLAMA2C; format <= KV_FILE_KVLAB; format++) {
        kv_err e = {{0}};
        const int rc = kv_checkpoint_write(path, m, format, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "RoPE frequency factors") &&
                 access(path, F_OK) != 0, "format %d: status %d, \"%s\"", format, rc, e.msg);
        unlink(path);
    }
}

static void check_tokens(const kv_gguf *g, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    size_t n = 0;
    char *text = (char *)kv_test_slurp(path, &n);
    kv_vocab *v = NULL;
    kv_err e;
    int rc = text ? kv_vocab_from_gguf(g, &v, &e) : KV_ERR_IO;
    KV_CHECK(rc == KV_OK, "vocab: %s", text ? e.msg : path);
    static int ids[MAX_PROMPT];
    int got = 0;
    if (!rc) rc = kv_vocab_encode(v, text, n, 1, 1, ids, MAX_PROMPT, &got, &e);
    KV_CHECK(rc == KV_OK && got == n_prompt && memcmp(ids, prompt, sizeof(int) * got) == 0,
             "llama-bpe: %d ids, llama.cpp %d (%s)", got, n_prompt, rc ? e.msg : "differ");
    kv_vocab_free(v);
    free(text);
}

static void check_linear(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/llama_linear.gguf", dir);
    kv_gguf *g = NULL;
    kv_config c;
    kv_err e;
    int rc = kv_gguf_open(path, &g, &e);
    if (!rc) rc = kv_gguf_model_config(g, &c, &e);
    KV_CHECK(rc == KV_OK && c.n_rope_factors == 8, "%s: %s, %d factors", path,
             rc ? e.msg : "read", rc ? 0 : c.n_rope_factors);
    kv_gguf_close(g);
    if (rc || c.n_rope_factors != 8) return;
    double freq[KV_ROPE_MAX_PAIRS];
    kv_rope_freqs(&c, freq);
    for (int i = 0; i < 8; i++) {
        const double plain = pow(500000.0, -(double)(2 * i) / 16.0);
        KV_CHECK(c.rope_factors[i] == 4.0f && freq[i] == plain / 4.0,
                 "linear: pair %d factor %g, freq %.17g", i, (double)c.rope_factors[i], freq[i]);
    }
    c.n_rope_factors = 0; /* no factors: the frequencies RoPE always had, bit for bit */
    kv_rope_freqs(&c, freq);
    for (int i = 0; i < 8; i++)
        KV_CHECK(freq[i] == pow(500000.0, -(double)(2 * i) / 16.0), "no factors: pair %d", i);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s <tests/data/gguf> <tests/data/llama3>\n", argv[0]);
        return 2;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/llama3_rope.gguf", argv[1]);
    kv_gguf *g = NULL;
    kv_model m;
    kv_err e;
    int rc = kv_gguf_open(path, &g, &e);
    if (!rc) rc = kv_gguf_model_load(g, &m, &e);
    KV_CHECK(rc == KV_OK, "%s: %s", path, e.msg);
    if (rc) return kv_gguf_close(g), kv_test_finish();
    V = m.config.vocab_size;
    check_config(&m.config);
    if (read_expected(argv[2]) == 0) {
        check_logits(&m);
        check_tokens(g, argv[2]);
    }
    check_checkpoint(&m);
    check_linear(argv[1]);
    free(expected);
    kv_model_free(&m);
    kv_gguf_close(g);
    return kv_test_finish();
}
