/*
 * A GGUF model whose matrices stay in a storage type of their own (--weights native, q8_0,
 * f16: kv_gguf_model_load_as(), multiplied by kv_linear.h) against the fp32 model of the same
 * file, tests/data/gguf/tiny_llama.gguf (two layers, weights in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * F16, BF16 and F32; written by the gguf Python package, tools/gguf/make_test_files.py):
 *
 *  - every matrix handle has the fp32 matrix's shape and the storage's type (native: the
 *    file's own), and its rows dequantized are the fp32 model's rows: bit for bit for native
 *    (the same dequantizer), within half a Q8_0 step (max|w| / 254 of the block, plus the
 *    binary16 rounding of the step, 127 * 2^-11 of it) or half a binary16 unit for q8_0 and
 *    f16; the norms are the fp32 model's bits;
 *  - a prefill is one product over its rows: the logits after each of 9 prompt tokens
 *    (all_logits) equal 9 one-token steps bit for bit, on 1 and 2 threads;
 *  - a column slice that cuts a block (tensor parallel's Wo, W2) is refused in words, one on
 *    block boundaries runs;
 *  - what needs fp32 weights refuses a stored model, naming why: a checkpoint (no file
 *    written), a draft of the first layers, the one-screen forward pass.
 *
 * Usage: test_weights_storage <tests/data/gguf>
 */
#include "common/kv_test.h"

#include "kv_cache.h"
#include "kv_checkpoint.h"
#include "kv_forward.h"
#include "kv_forward_min.h"
#include "kv_gguf_model.h"
#include "kv_gguf_quant.h"
#include "kv_linear.h"
#include "kv_spec.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>

#define N_PROMPT 9

/* the stored matrix against the fp32 one, row by row */
static void check_mat(const kv_mat *s, const kv_mat *f, int storage, int file_type,
                      const char *what)
{
    KV_CHECK(s->rows == f->rows && s->cols == f->cols, "%s: %d x %d, fp32 %d x %d", what,
             s->rows, s->cols, f->rows, f->cols);
    const int want = storage == KV_WEIGHTS_NATIVE ? file_type
                     : storage == KV_WEIGHTS_Q8_0 ? KV_GGML_Q8_0 : KV_GGML_F16;
    KV_CHECK(s->type == want, "%s: type %s, want %s", what, kv_ggml_type_name(s->type),
             kv_ggml_type_name(want));
    if (s->rows != f->rows || s->cols != f->cols) return;
    float *row = malloc(sizeof(float) * (size_t)s->cols); /* [cols] */
    long bad = 0;
    for (int i = 0; i < s->rows; i++) {
        kv_ggml_dequant_row(s->type, (const uint8_t *)s->data + (size_t)i * s->row_bytes, row,
                            s->cols);
        const float *ref = (const float *)f->data + (size_t)i * f->cols;
        for (int b = 0; b < s->cols; b += 32) {
            float amax = 0.0f;
            for (int j = b; j < b + 32 && j < s->cols; j++) amax = fmaxf(amax, fabsf(ref[j]));
            for (int j = b; j < b + 32 && j < s->cols; j++) {
                double lim = 0.0; /* native: the same bits */
                if (storage == KV_WEIGHTS_Q8_0) lim = amax / 254.0 * (1 + 0x1p-10) + amax / 127.0 * 127 * 0x1p-11;
                if (storage == KV_WEIGHTS_F16) lim = fabs(ref[j]) * 0x1p-11 + 0x1p-25;
                bad += lim == 0.0 ? memcmp(&row[j], &ref[j], sizeof(float)) != 0
                                  : fabs((double)row[j] - ref[j]) > lim;
            }
        }
    }
    KV_CHECK(bad == 0, "%s: %ld weights off the fp32 model's", what, bad);
    free(row);
}

/* logits after each prompt token: one prefill with all_logits [N][V], and N one-token steps */
static void check_prefill(const kv_model *m, const char *what)
{
    const int V = m->config.vocab_size;
    int prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (7 * i + 3) % V;
    float *all = malloc(sizeof(float) * (size_t)V * N_PROMPT), *one = malloc(sizeof(float) * V);
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        kv_err err = {{0}};
        kv_cache_spec spec = kv_cache_spec_default(1, 16);
        kv_cache c, c1;
        kv_state s, s1;
        kv_state_init(&s), kv_state_init(&s1);
        int rc = kv_forward_cache_create(&c, &m->config, &spec, &err);
        if (!rc) rc = kv_forward_cache_create(&c1, &m->config, &spec, &err);
        KV_CHECK(rc == KV_OK, "%s: cache: %s", what, err.msg);
        if (rc) break;
        kv_seq q = {0, 0, N_PROMPT, prompt, all};
        rc = kv_forward(m, &c, &s, &q, 1, NULL, NULL, &err);
        KV_CHECK(rc == KV_OK, "%s: prefill: %s", what, err.msg);
        int same = rc == KV_OK;
        for (int t = 0; t < N_PROMPT && same; t++) {
            kv_seq q1 = {0, t, 1, &prompt[t], NULL};
            rc = kv_forward(m, &c1, &s1, &q1, 1, one, NULL, &err);
            KV_CHECK(rc == KV_OK, "%s: step %d: %s", what, t, err.msg);
            same = rc == KV_OK && memcmp(one, all + (size_t)t * V, sizeof(float) * V) == 0;
            for (int i = 0; i < V; i++) same &= isfinite(one[i]) != 0;
        }
        KV_CHECK(same, "%s, %d thread%s: the prefill's logits are not the one-token steps'",
                 what, threads, threads == 1 ? "" : "s");
        kv_cache_free(&c), kv_cache_free(&c1);
        kv_state_free(&s), kv_state_free(&s1);
    }
    free(all), free(one);
}

/* what needs fp32 weights refuses @p m, naming why */
static void check_refusals(const kv_model *m, const char *what)
{
    kv_err err = {{0}};
    char path[] = "/tmp/kvlab_test_weights_XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd), unlink(path);
    int rc = kv_checkpoint_write(path, m, KV_FILE_KVLAB, &err);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(err.msg, "fp32") && access(path, F_OK) != 0,
             "%s: checkpoint: status %d \"%s\"", what, rc, err.msg);
    kv_model view;
    rc = kv_model_layer_prefix(&view, m, 1, &err);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(err.msg, "fp32"), "%s: layer prefix: %d \"%s\"",
             what, rc, err.msg);
    kv_min_cache mc;
    kv_min_state ms;
    rc = kv_min_create(m, 8, &mc, &ms, &err);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(err.msg, "fp32"), "%s: kv_forward_min: %d \"%s\"",
             what, rc, err.msg);
}

/* tensor parallel's column slices: cut a block -> refused in words; on boundaries -> runs */
static void check_slices(const kv_model *m, const char *what)
{
    const kv_mat o = kv_model_mat(m, KV_MAT_O, 0);
    const kv_ggml_type_info *t = kv_ggml_type(o.type);
    float x[64] = {0}, y[64];
    kv_err err = {{0}};
    int rc = kv_linear(y, x, &o, 1, 0, o.rows, 8, 16, &err);
    if (t->block > 1)
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(err.msg, "block"), "%s: columns 8..24 of "
                 "a %s Wo: status %d \"%s\"", what, t->name, rc, err.msg);
    else
        KV_CHECK(rc == KV_OK, "%s: columns 8..24 of a %s Wo: %s", what, t->name, err.msg);
    rc = kv_linear(y, x, &o, 1, 0, o.rows, 0, o.cols, &err);
    KV_CHECK(rc == KV_OK, "%s: the whole Wo: %s", what, err.msg);
    rc = kv_linear(y, x, &o, 1, 0, o.rows + 1, 0, o.cols, &err);
    KV_CHECK(rc == KV_ERR_ARG, "%s: a row past the matrix: status %d", what, rc);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/data/gguf>\n", argv[0]);
        return 2;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/tiny_llama.gguf", argv[1]);
    kv_gguf *g = NULL;
    kv_err err = {{0}};
    int rc = kv_gguf_open(path, &g, &err);
    KV_CHECK(rc == KV_OK, "%s: %s", path, err.msg);
    if (rc) return kv_test_finish();
    kv_model ref;
    rc = kv_gguf_model_load(g, &ref, &err);
    KV_CHECK(rc == KV_OK && ref.mats == NULL, "fp32: %s", err.msg);
    if (rc) return kv_gguf_close(g), kv_test_finish();
    KV_CHECK(kv_model_need_fp32(&ref, "x", &err) == KV_OK, "an fp32 model is refused");
    check_prefill(&ref, "f32");
    const int L = ref.config.n_layers, dim = ref.config.dim;
    for (int storage = KV_WEIGHTS_NATIVE; storage <= KV_WEIGHTS_F16; storage++) {
        const char *sname = kv_weights_storage_name(storage);
        kv_model m;
        rc = kv_gguf_model_load_as(g, &m, storage, NULL, NULL, &err);
        KV_CHECK(rc == KV_OK && m.mats && m.blocks, "%s: %s", sname, err.msg);
        if (rc) continue;
        KV_CHECK(m.w.wq == NULL && m.w.token_embedding == NULL, "%s: fp32 matrices kept", sname);
        KV_CHECK(memcmp(m.w.rms_att, ref.w.rms_att, sizeof(float) * L * dim) == 0 &&
                 memcmp(m.w.rms_ffn, ref.w.rms_ffn, sizeof(float) * L * dim) == 0 &&
                 memcmp(m.w.rms_final, ref.w.rms_final, sizeof(float) * dim) == 0,
                 "%s: the norms are not the fp32 model's", sname);
        static const char *const file[KV_MAT_PER_LAYER] = {"attn_q", "attn_k", "attn_v",
                                                            "attn_output", "ffn_gate",
                                                            "ffn_down", "ffn_up"};
        for (int which = 0; which <= KV_MAT_EMBED; which++) {
            for (int l = 0; l < (which < KV_MAT_PER_LAYER ? L : 1); l++) {
                char name[64], what[96];
                if (which < KV_MAT_PER_LAYER)
                    snprintf(name, sizeof name, "blk.%d.%s.weight", l, file[which]);
                else snprintf(name, sizeof name, which == KV_MAT_CLS ? "output.weight"
                                                                     : "token_embd.weight");
                snprintf(what, sizeof what, "%s %s", sname, name);
                const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
                const kv_mat s = kv_model_mat(&m, which, l), f = kv_model_mat(&ref, which, l);
                check_mat(&s, &f, storage, t ? t->type : -1, what);
            }
        }
        printf("%s: %.1f KiB of matrices a token reads (fp32: %.1f KiB)\n", sname,
               kv_model_matrix_bytes(&m) / 1024, kv_model_matrix_bytes(&ref) / 1024);
        check_prefill(&m, sname);
        check_slices(&m, sname);
        check_refusals(&m, sname);
        kv_model_free(&m);
    }
    kv_model m;
    rc = kv_gguf_model_load_as(g, &m, 7, NULL, NULL, &err);
    KV_CHECK(rc == KV_ERR_ARG && m.data == NULL, "storage 7: status %d", rc);
    kv_model_free(&ref);
    kv_gguf_close(g);
    return kv_test_finish();
}
