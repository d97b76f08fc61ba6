/*
 * Model weights and checkpoint files: deterministic random init, round trips in both formats
 * (tied/untied, MHA/GQA), a file laid out byte by byte as llama2.c's exporter writes it, and
 * every kind of bad file failing cleanly with the right status and a message naming the problem.
 */
#define _GNU_SOURCE
#include "kv_checkpoint.h"
#include "kv_file.h"
#include "common/kv_test.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];   /* per-run scratch folder */
static char path[256]; /* scratch file name */

static const char *file(const char *name)
{
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* number of entries in the scratch folder whose name contains KV_FILE_TMP_PREFIX */
static int temp_files_left(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, KV_FILE_TMP_PREFIX)) n++;
    closedir(d);
    return n;
}

static void write_bytes(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f) { printf("cannot write %s\n", p); exit(1); }
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* read a whole file into memory; *n receives its size */
static unsigned char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
    fclose(f);
    return b;
}

/* expect kv_checkpoint_read(p) to fail with status and a message containing want */
static void expect_read_fail(const char *p, int status, const char *want, const char *what)
{
    kv_model m;
    kv_err err = {{0}};
    int rc = kv_checkpoint_read(p, &m, &err);
    KV_CHECK(rc == status, "%s: status %s, want %s (%s)", what, kv_status_name(rc),
             kv_status_name(status), err.msg);
    KV_CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    KV_CHECK(m.data == NULL && m.n_floats == 0 && m.w.wq == NULL, "%s: model not left zeroed",
             what);
}

/* ---------------------------------------------------------------------------------- */

static void test_randomize(void)
{
    kv_err err = {{0}};
    kv_model a, b;
    KV_CHECK(kv_model_default(&a, KV_DEFAULT_TINY, &err) == KV_OK, "tiny: %s", err.msg);
    KV_CHECK(kv_model_default(&b, KV_DEFAULT_TINY, &err) == KV_OK, "tiny again: %s", err.msg);
    KV_CHECK(a.n_floats == kv_config_param_count(&a.config), "n_floats %lld",
             (long long)a.n_floats);
    KV_CHECK(memcmp(a.data, b.data, sizeof(float) * (size_t)a.n_floats) == 0,
             "same seed, different bytes");
    KV_CHECK(a.w.wcls == a.w.token_embedding, "tied tiny: wcls is not the embedding");
    kv_model_randomize(&b, 12345);
    KV_CHECK(memcmp(a.data, b.data, sizeof(float) * (size_t)a.n_floats) != 0,
             "different seed, same bytes");

    /* init scales as documented: |w| < sqrt(3/fan_in), embedding std ~ 2/sqrt(dim), gains 1 */
    const kv_config *c = &a.config;
    const float lim_in = sqrtf(3.0f / c->dim), lim_hid = sqrtf(3.0f / c->hidden_dim);
    float max_wq = 0, max_w2 = 0;
    for (long i = 0; i < (long)c->n_layers * c->dim * c->dim; i++)
        max_wq = fmaxf(max_wq, fabsf(a.w.wq[i]));
    for (long i = 0; i < (long)c->n_layers * c->dim * c->hidden_dim; i++)
        max_w2 = fmaxf(max_w2, fabsf(a.w.w2[i]));
    KV_CHECK(max_wq <= lim_in && max_wq > 0.9f * lim_in, "wq max %g, limit %g", max_wq, lim_in);
    KV_CHECK(max_w2 <= lim_hid && max_w2 > 0.9f * lim_hid, "w2 max %g, limit %g", max_w2, lim_hid);
    double ss = 0;
    long ne = (long)c->vocab_size * c->dim;
    for (long i = 0; i < ne; i++) ss += (double)a.w.token_embedding[i] * a.w.token_embedding[i];
    double std = sqrt(ss / ne), want = 2.0 / sqrt(c->dim);
    KV_CHECK(fabs(std - want) < 0.05 * want, "embedding std %g, want %g", std, want);
    int ones = 1;
    for (long i = 0; i < (long)c->n_layers * c->dim; i++)
        ones &= a.w.rms_att[i] == 1.0f && a.w.rms_ffn[i] == 1.0f;
    for (int i = 0; i < c->dim; i++) ones &= a.w.rms_final[i] == 1.0f;
    KV_CHECK(ones, "RMSNorm gains are not all 1");

    /* check_finite names tensor, layer and index */
    KV_CHECK(kv_model_check_finite(&a, &err) == KV_OK, "random model not finite: %s", err.msg);
    const long kv_dim = kv_config_kv_dim(c);
    a.w.wk[1 * kv_dim * c->dim + 5] = NAN;
    KV_CHECK(kv_model_check_finite(&a, &err) == KV_ERR_FORMAT && strstr(err.msg, "wk") &&
                 strstr(err.msg, "layer 1") && strstr(err.msg, "index 5") && strstr(err.msg, "NaN"),
             "NaN in wk: '%s'", err.msg);
    a.w.wk[1 * kv_dim * c->dim + 5] = 0.0f;
    a.w.rms_final[7] = -INFINITY;
    KV_CHECK(kv_model_check_finite(&a, &err) == KV_ERR_FORMAT && strstr(err.msg, "rms_final") &&
                 strstr(err.msg, "index 7") && strstr(err.msg, "inf"),
             "inf in rms_final: '%s'", err.msg);
    kv_model_free(&a);
    kv_model_free(&b);
    kv_model_free(&b); /* freeing twice (a zeroed struct) is fine */

    KV_CHECK(kv_model_default(&a, KV_DEFAULT_COUNT, &err) == KV_ERR_ARG && a.data == NULL,
             "default out of range");
    kv_config bad = {0};
    KV_CHECK(kv_model_alloc(&a, &bad, &err) == KV_ERR_ARG && a.data == NULL,
             "alloc of an invalid config");
    kv_config big = kv_preset_find("llama-2-70b")->config; /* valid shape, too big to hold */
    KV_CHECK(kv_model_alloc(&a, &big, &err) == KV_ERR_NOMEM && strstr(err.msg, "2^34"),
             "70B alloc: '%s'", err.msg);

    /* the small default is deterministic too (and its untied variant has its own wcls) */
    KV_CHECK(kv_model_default(&a, KV_DEFAULT_SMALL, &err) == KV_OK, "small: %s", err.msg);
    KV_CHECK(a.n_floats == kv_config_param_count(&a.config), "small n_floats");
    kv_model_free(&a);
}

/* a model with every field chosen; weights random from seed */
static int make_model(kv_model *m, int n_kv_heads, int tied, uint64_t seed)
{
    kv_config c;
    kv_config_default(KV_DEFAULT_TINY, &c, NULL);
    c.n_kv_heads = n_kv_heads;
    c.tied_classifier = tied;
    c.seq_len = 40;
    kv_err err = {{0}};
    if (kv_model_alloc(m, &c, &err)) {
        printf("alloc: %s\n", err.msg);
        return 0;
    }
    kv_model_randomize(m, seed);
    return 1;
}

static void test_round_trip(void)
{
    const int formats[2] = {KV_FILE_LLAMA2C, KV_FILE_KVLAB};
    for (int fi = 0; fi < 2; fi++)
        for (int kvh = 4; kvh >= 1; kvh /= 2) /* MHA, GQA G=2, MQA */
            for (int tied = 0; tied <= 1; tied++) {
                kv_model m, r;
                kv_err err = {{0}};
                if (!make_model(&m, kvh, tied, 7 + kvh + tied)) { KV_CHECK(0, "make_model"); continue; }
                const char *p = file("rt.bin");
                int rc = kv_checkpoint_write(p, &m, formats[fi], &err);
                KV_CHECK(rc == KV_OK, "write fmt %d kv %d tied %d: %s", fi, kvh, tied, err.msg);
                rc = kv_checkpoint_read(p, &r, &err);
                KV_CHECK(rc == KV_OK, "read fmt %d kv %d tied %d: %s", fi, kvh, tied, err.msg);
                if (rc == KV_OK) {
                    KV_CHECK(memcmp(&m.config, &r.config, sizeof m.config) == 0,
                             "config differs after round trip (fmt %d kv %d tied %d)", fi, kvh, tied);
                    KV_CHECK(r.n_floats == m.n_floats &&
                                 memcmp(m.data, r.data, sizeof(float) * (size_t)m.n_floats) == 0,
                             "weights differ after round trip (fmt %d kv %d tied %d)", fi, kvh, tied);
                    KV_CHECK((r.w.wcls == r.w.token_embedding) == tied, "wcls tying lost");
                }
                /* file size is exactly header + weights (+ RoPE tables for llama2.c) */
                struct stat st;
                long long want = (fi == 0 ? 28 + 4LL * 2 * 40 * 8 : 256) + 4LL * m.n_floats;
                KV_CHECK(stat(p, &st) == 0 && st.st_size == want, "file size %lld, want %lld",
                         (long long)st.st_size, want);
                kv_model_free(&m);
                kv_model_free(&r);
            }

    /* kvlab keeps the fields llama2.c cannot express; llama2.c refuses them by name */
    kv_model m, r;
    kv_err err = {{0}};
    make_model(&m, 2, 0, 99);
    m.config.rope_theta = 500000.0f;
    m.config.rotary_dim = 8;
    m.config.norm_eps = 1e-6f;
    m.config.kind = KV_MODEL_RECALL_INDUCTION;
    KV_CHECK(kv_checkpoint_write(file("ext.bin"), &m, KV_FILE_KVLAB, &err) == KV_OK,
             "kvlab write: %s", err.msg);
    KV_CHECK(kv_checkpoint_read(file("ext.bin"), &r, &err) == KV_OK, "kvlab read: %s", err.msg);
    KV_CHECK(memcmp(&m.config, &r.config, sizeof m.config) == 0, "kvlab extra fields lost");
    KV_CHECK(r.data && memcmp(m.data, r.data, 4 * (size_t)m.n_floats) == 0, "kvlab weights differ");
    kv_model_free(&r);
    const struct { const char *field; int which; } refuse[] = {
        {"rope_theta", 0}, {"rotary_dim", 1}, {"norm_eps", 2}, {"kind", 3}};
    for (int i = 0; i < 4; i++) {
        kv_config keep = m.config;
        m.config.rope_theta = refuse[i].which == 0 ? 500000.0f : 10000.0f;
        m.config.rotary_dim = refuse[i].which == 1 ? 8 : 16;
        m.config.norm_eps = refuse[i].which == 2 ? 1e-6f : 1e-5f;
        m.config.kind = refuse[i].which == 3 ? KV_MODEL_RECALL_DIRECT : KV_MODEL_GENERIC;
        int rc = kv_checkpoint_write(file("refused.bin"), &m, KV_FILE_LLAMA2C, &err);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(err.msg, refuse[i].field),
                 "llama2.c write of %s: %s '%s'", refuse[i].field, kv_status_name(rc), err.msg);
        KV_CHECK(access(file("refused.bin"), F_OK) != 0, "refused write left a file");
        m.config = keep;
    }
    KV_CHECK(kv_checkpoint_write(file("x.bin"), &m, 7, &err) == KV_ERR_ARG, "unknown format");
    kv_model_free(&m);
    KV_CHECK(temp_files_left() == 0, "temporary files left after writes");
}

/* ------------------------------------------------------------------------------------
 * A file exactly as llama2.c's export.py (legacy_export, "version 0") lays it out, written
 * here field by field with fwrite, independently of kv_checkpoint_write.
 */
static float pattern(int tensor, long j) { return (float)tensor + (float)(j % 1021) / 1024.0f; }

static void write_tensor(FILE *f, int tensor, long n)
{
    for (long j = 0; j < n; j++) {
        float v = pattern(tensor, j);
        fwrite(&v, 4, 1, f);
    }
}

static long check_tensor(const float *x, int tensor, long n)
{
    long bad = 0;
    for (long j = 0; j < n; j++) bad += x[j] != pattern(tensor, j);
    return bad;
}

static void test_llama2c_layout(int n_kv_heads, int tied)
{
    const int dim = 32, hidden = 88, L = 3, H = 4, vocab = 300, seq = 24;
    const int hs = dim / H, kv_dim = n_kv_heads * hs;
    char p[256];
    snprintf(p, sizeof p, "%s", file("llama2c.bin"));
    FILE *f = fopen(p, "wb");
    int32_t hdr[7] = {dim, hidden, L, H, n_kv_heads, tied ? vocab : -vocab, seq};
    fwrite(hdr, 4, 7, f);
    write_tensor(f, 0, (long)vocab * dim);       /* token_embedding_table */
    write_tensor(f, 1, (long)L * dim);           /* rms_att_weight */
    write_tensor(f, 2, (long)L * dim * dim);     /* wq */
    write_tensor(f, 3, (long)L * dim * kv_dim);  /* wk */
    write_tensor(f, 4, (long)L * dim * kv_dim);  /* wv */
    write_tensor(f, 5, (long)L * dim * dim);     /* wo */
    write_tensor(f, 6, (long)L * dim);           /* rms_ffn_weight */
    write_tensor(f, 7, (long)L * dim * hidden);  /* w1 */
    write_tensor(f, 8, (long)L * hidden * dim);  /* w2 */
    write_tensor(f, 9, (long)L * dim * hidden);  /* w3 */
    write_tensor(f, 10, dim);                    /* rms_final_weight */
    for (int t = 0; t < 2; t++)                  /* freq_cis_real, freq_cis_imag */
        for (int pos = 0; pos < seq; pos++)
            for (int i = 0; i < hs / 2; i++) {
                float v = t == 0 ? cosf(pos * powf(10000.0f, -2.0f * i / hs))
                                 : sinf(pos * powf(10000.0f, -2.0f * i / hs));
                fwrite(&v, 4, 1, f);
            }
    if (!tied) write_tensor(f, 11, (long)vocab * dim); /* wcls */
    fclose(f);

    kv_model m;
    kv_err err = {{0}};
    int rc = kv_checkpoint_read(p, &m, &err);
    KV_CHECK(rc == KV_OK, "llama2.c file (kv %d tied %d): %s", n_kv_heads, tied, err.msg);
    if (rc) return;
    const kv_config *c = &m.config;
    KV_CHECK(c->dim == dim && c->hidden_dim == hidden && c->n_layers == L && c->n_heads == H &&
                 c->n_kv_heads == n_kv_heads && c->vocab_size == vocab && c->seq_len == seq &&
                 c->tied_classifier == tied && c->rope_theta == 10000.0f &&
                 c->rotary_dim == hs && c->norm_eps == 1e-5f && c->kind == KV_MODEL_GENERIC,
             "llama2.c header read wrong (kv %d tied %d)", n_kv_heads, tied);
    long bad = check_tensor(m.w.token_embedding, 0, (long)vocab * dim) +
               check_tensor(m.w.rms_att, 1, (long)L * dim) +
               check_tensor(m.w.wq, 2, (long)L * dim * dim) +
               check_tensor(m.w.wk, 3, (long)L * dim * kv_dim) +
               check_tensor(m.w.wv, 4, (long)L * dim * kv_dim) +
               check_tensor(m.w.wo, 5, (long)L * dim * dim) +
               check_tensor(m.w.rms_ffn, 6, (long)L * dim) +
               check_tensor(m.w.w1, 7, (long)L * dim * hidden) +
               check_tensor(m.w.w2, 8, (long)L * hidden * dim) +
               check_tensor(m.w.w3, 9, (long)L * dim * hidden) +
               check_tensor(m.w.rms_final, 10, dim) +
               check_tensor(m.w.wcls, tied ? 0 : 11, (long)vocab * dim);
    KV_CHECK(bad == 0, "%ld weights misplaced (kv %d tied %d)", bad, n_kv_heads, tied);
    KV_CHECK((m.w.wcls == m.w.token_embedding) == tied, "tying wrong");

    /* and kvlab's llama2.c writer reproduces the file byte for byte (RoPE tables within
     * float rounding of the cosf/sinf above, so compare everything but them exactly) */
    const char *q = file("llama2c_again.bin");
    KV_CHECK(kv_checkpoint_write(q, &m, KV_FILE_LLAMA2C, &err) == KV_OK, "rewrite: %s", err.msg);
    size_t na = 0, nb = 0;
    unsigned char *a = slurp(p, &na), *b = slurp(q, &nb);
    KV_CHECK(a && b && na == nb, "rewritten size %zu, original %zu", nb, na);
    if (a && b && na == nb) {
        size_t rope_at = 28 + 4 * (size_t)(m.n_floats - (tied ? 0 : (long)vocab * dim));
        size_t rope_bytes = 4 * (size_t)2 * seq * (hs / 2);
        KV_CHECK(memcmp(a, b, rope_at) == 0, "weights before the RoPE tables differ");
        KV_CHECK(memcmp(a + rope_at + rope_bytes, b + rope_at + rope_bytes,
                        na - rope_at - rope_bytes) == 0, "wcls after the RoPE tables differs");
        long far = 0;
        for (size_t i = rope_at; i < rope_at + rope_bytes; i += 4) {
            float x, y;
            memcpy(&x, a + i, 4);
            memcpy(&y, b + i, 4);
            far += fabsf(x - y) > 1e-5f;
        }
        KV_CHECK(far == 0, "%ld RoPE table entries differ from cos/sin", far);
    }
    free(a);
    free(b);
    kv_model_free(&m);
}

/* ------------------------------------------------------------------------------------ */

static void put32(unsigned char *b, int32_t v) { memcpy(b, &v, 4); }

static void test_bad_files(void)
{
    kv_model m;
    kv_err err = {{0}};
    make_model(&m, 2, 1, 5);
    char good_l[256], good_k[256]; /* file() reuses one buffer: keep copies */
    snprintf(good_l, sizeof good_l, "%s", file("good_l.bin"));
    snprintf(good_k, sizeof good_k, "%s", file("good_k.bin"));
    kv_checkpoint_write(good_l, &m, KV_FILE_LLAMA2C, &err);
    kv_checkpoint_write(good_k, &m, KV_FILE_KVLAB, &err);
    size_t nl = 0, nk = 0;
    unsigned char *fl = slurp(good_l, &nl), *fk = slurp(good_k, &nk);
    if (!fl || !fk) { KV_CHECK(0, "cannot read back good files"); return; }
    unsigned char *buf = malloc(nk > nl ? nk + 16 : nl + 16);

    expect_read_fail(file("no_such_file.bin"), KV_ERR_IO, "cannot open", "missing file");
    write_bytes(file("empty.bin"), "", 0);
    expect_read_fail(file("empty.bin"), KV_ERR_FORMAT, "empty", "empty file");
    write_bytes(file("short.bin"), fl, 10);
    expect_read_fail(file("short.bin"), KV_ERR_FORMAT, "truncated header", "truncated llama2.c header");
    write_bytes(file("short.bin"), fk, 100);
    expect_read_fail(file("short.bin"), KV_ERR_FORMAT, "truncated header", "truncated kvlab header");

    /* truncated weights: the message states expected and found sizes */
    char want[128];
    write_bytes(file("cut.bin"), fl, nl - 4);
    snprintf(want, sizeof want, "expected %zu bytes", nl);
    expect_read_fail(file("cut.bin"), KV_ERR_FORMAT, want, "truncated llama2.c weights");
    snprintf(want, sizeof want, "found %zu", nl - 4);
    expect_read_fail(file("cut.bin"), KV_ERR_FORMAT, want, "truncated llama2.c weights (found)");
    write_bytes(file("cut.bin"), fk, nk - 1000);
    expect_read_fail(file("cut.bin"), KV_ERR_FORMAT, "truncated", "truncated kvlab weights");
    /* a header announcing Llama-2-7B over a 28-byte file: refused before any allocation */
    int32_t big[7] = {4096, 11008, 32, 32, 32, -32000, 4096};
    write_bytes(file("big.bin"), big, sizeof big);
    expect_read_fail(file("big.bin"), KV_ERR_FORMAT, "truncated", "7B header, no weights");

    memcpy(buf, fl, nl);
    memset(buf + nl, 0, 3);
    write_bytes(file("long.bin"), buf, nl + 3);
    expect_read_fail(file("long.bin"), KV_ERR_FORMAT, "3 trailing bytes", "trailing bytes llama2.c");
    memcpy(buf, fk, nk);
    memset(buf + nk, 0, 8);
    write_bytes(file("long.bin"), buf, nk + 8);
    expect_read_fail(file("long.bin"), KV_ERR_FORMAT, "trailing", "trailing bytes kvlab");

    /* kvlab header damage */
    memcpy(buf, fk, nk);
    memcpy(buf, "KVLX", 4); /* not our magic: read as llama2.c, whose header is absurd then */
    write_bytes(file("magic.bin"), buf, nk);
    expect_read_fail(file("magic.bin"), KV_ERR_FORMAT, "magic", "wrong magic");
    memcpy(buf, fk, nk);
    put32(buf + 4, 2);
    write_bytes(file("version.bin"), buf, nk);
    expect_read_fail(file("version.bin"), KV_ERR_FORMAT, "version 2", "unknown kvlab version");
    memcpy(buf, fk, nk);
    buf[200] = 1;
    write_bytes(file("pad.bin"), buf, nk);
    expect_read_fail(file("pad.bin"), KV_ERR_FORMAT, "padding byte 200", "nonzero padding");
    memcpy(buf, fk, nk);
    put32(buf + 48, 5); /* tied flag */
    write_bytes(file("tied.bin"), buf, nk);
    expect_read_fail(file("tied.bin"), KV_ERR_FORMAT, "tied_classifier (5)", "bad tied flag");
    memcpy(buf, fk, nk);
    put32(buf + 8 + 20, -512); /* kvlab stores tying explicitly; negative vocab is just wrong */
    write_bytes(file("negvocab.bin"), buf, nk);
    expect_read_fail(file("negvocab.bin"), KV_ERR_FORMAT, "vocab_size (-512)", "kvlab negative vocab");
    int32_t ak42[2] = {0x616b3432, 1};
    memcpy(buf, ak42, 8);
    write_bytes(file("ak42.bin"), buf, 256);
    expect_read_fail(file("ak42.bin"), KV_ERR_FORMAT, "ak42", "llama2.c export v1");

    /* llama2.c header fields (dim, hidden, L, H, H_kv, vocab, seq) */
    struct { int idx; int32_t val; const char *want, *what; } fields[] = {
        {3, 5, "n_heads (5) must divide dim (64)", "heads not dividing dim"},
        {4, 3, "n_kv_heads (3) must divide n_heads (4)", "kv heads not dividing heads"},
        {0, 1 << 30, "dim (1073741824)", "absurd dim"},
        {2, 100000, "n_layers (100000)", "absurd layers"},
        {5, 1 << 30, "vocab_size (1073741824)", "absurd vocab"},
        {6, 1 << 30, "seq_len (1073741824)", "absurd seq_len"},
        {1, -5, "hidden_dim (-5)", "negative hidden"},
        {0, -64, "dim (-64)", "negative dim"},
        {6, -1, "seq_len (-1)", "negative seq_len"},
        {5, INT32_MIN, "vocab_size", "vocab INT_MIN"},
        {5, 0, "vocab_size (0)", "zero vocab"},
        {4, 0, "n_kv_heads (0)", "zero kv heads"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        memcpy(buf, fl, nl);
        put32(buf + 4 * fields[i].idx, fields[i].val);
        write_bytes(file("field.bin"), buf, nl);
        expect_read_fail(file("field.bin"), KV_ERR_FORMAT, fields[i].want, fields[i].what);
    }

    /* non-finite weights: the writer stores them, the reader names tensor and layer */
    const long kvd = kv_config_kv_dim(&m.config);
    const float keep_q = m.w.wq[1L * m.config.dim * m.config.dim + 3];
    const float keep_v = m.w.wv[kvd * m.config.dim - 1];
    m.w.wq[1L * m.config.dim * m.config.dim + 3] = NAN;
    kv_checkpoint_write(file("nan.bin"), &m, KV_FILE_LLAMA2C, &err);
    expect_read_fail(file("nan.bin"), KV_ERR_FORMAT, "wq layer 1 index 3 is NaN", "NaN weight");
    m.w.wq[1L * m.config.dim * m.config.dim + 3] = keep_q;
    m.w.wv[kvd * m.config.dim - 1] = INFINITY;
    kv_checkpoint_write(file("inf.bin"), &m, KV_FILE_KVLAB, &err);
    expect_read_fail(file("inf.bin"), KV_ERR_FORMAT, "wv layer 0", "inf weight");
    m.w.wv[kvd * m.config.dim - 1] = keep_v;

    /* failed writes leave nothing behind */
    int rc = kv_checkpoint_write("/nonexistent-kvlab-dir/model.bin", &m, KV_FILE_KVLAB, &err);
    KV_CHECK(rc == KV_ERR_IO && strstr(err.msg, "nonexistent-kvlab-dir"),
             "write into a missing folder: %s '%s'", kv_status_name(rc), err.msg);
    const char *target = file("a_directory");
    mkdir(target, 0755);
    rc = kv_checkpoint_write(target, &m, KV_FILE_LLAMA2C, &err); /* rename onto a folder fails */
    KV_CHECK(rc == KV_ERR_IO && strstr(err.msg, "rename"), "write onto a folder: %s '%s'",
             kv_status_name(rc), err.msg);
    KV_CHECK(temp_files_left() == 0, "a failed write left its temporary file");
    rmdir(file("a_directory"));
    /* a failed write keeps the previous file intact */
    rc = kv_checkpoint_write(good_k, &m, KV_FILE_KVLAB, &err);
    size_t n2 = 0;
    unsigned char *again = slurp(good_k, &n2);
    KV_CHECK(rc == KV_OK && again && n2 == nk && memcmp(again, fk, nk) == 0,
             "rewriting the same model changed the file");
    free(again);
    KV_CHECK(kv_checkpoint_write(NULL, &m, KV_FILE_KVLAB, &err) == KV_ERR_ARG, "NULL path");
    kv_model none;
    KV_CHECK(kv_checkpoint_read(NULL, &none, &err) == KV_ERR_ARG && none.data == NULL,
             "NULL path read");

    free(buf);
    free(fl);
    free(fk);
    kv_model_free(&m);
}

/* remove the scratch folder and what the tests wrote into it */
static void cleanup(void)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        remove(p);
    }
    closedir(d);
    rmdir(dir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "test_checkpoint_tmp_%ld", (long)getpid());
    if (mkdir(dir, 0755) != 0) {
        printf("cannot create %s\n", dir);
        return 1;
    }
    test_randomize();
    test_round_trip();
    test_llama2c_layout(4, 1); /* MHA, tied */
    test_llama2c_layout(2, 0); /* GQA, untied */
    test_llama2c_layout(1, 0); /* MQA, untied */
    test_bad_files();
    cleanup();
    return kv_test_finish();
}
