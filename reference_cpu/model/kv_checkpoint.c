/*
 * Model files (kv_checkpoint.h): llama2.c's fp32 checkpoint and kvlab's versioned header.
 *
 * A checkpoint is untrusted input. The reader trusts nothing until the header has passed
 * kv_config_validate (which bounds every field, so the sizes below fit in int64), then
 * insists that the file is exactly as long as that header implies: a short file is a
 * truncated download, a long one was written by something else. Only then are weights read.
 * Both formats store native-endian int32/fp32, little-endian on every machine kvlab targets.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#include "kv_checkpoint.h"
#include "kv_file.h"
#include "kv_linear.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_KVLAB_MAGIC "KVLB"
#define KV_KVLAB_VERSION 1     /* MHA/GQA models */
#define KV_KVLAB_VERSION_ATTN 2 /* version 1 + the attention kind and MLA's dims (chapter 11) */
#define KV_KVLAB_HEADER_BYTES 256
#define KV_LLAMA2C_HEADER_BYTES 28 /* 7 x int32 */
/* llama2.c's export.py versions 1 and 2 start with this magic ("ak42"); run.c reads neither */
#define KV_LLAMA2C_EXPORT_MAGIC 0x616b3432

/* kvlab header v1, byte offsets (all 4-byte fields; the rest up to 256 is zero):
 *   0 magic "KVLB" | 4 version | 8 dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 *   vocab_size, seq_len (7 x int32) | 36 rope_theta f32 | 40 rotary_dim | 44 norm_eps f32 |
 *   48 tied_classifier | 52 kind | 56..255 zero
 * kvlab header v2 adds, for a model v1 cannot describe (an MLA model; an MHA/GQA model is
 * always written as v1, so its files stay as they were):
 *   56 attn | 60 d_c | 64 d_R | 68 d_nope | 72 d_v | 76 q_rank | 80..255 zero
 * The weights follow in kv_model.h's order either way (an MLA model's attention tensors in
 * place of wq, wk, wv, wo).                                                                */
#define KV_KVLAB_USED_BYTES 56
#define KV_KVLAB_USED_BYTES_ATTN 80

static int32_t get_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static float get_f32(const unsigned char *p) { float v; memcpy(&v, p, 4); return v; }
static void put_i32(unsigned char *p, int32_t v) { memcpy(p, &v, 4); }
static void put_f32(unsigned char *p, float v) { memcpy(p, &v, 4); }

/* the seven llama2.c fields, at p (offset 0 in llama2.c files, 8 in kvlab files) */
static void get_seven(const unsigned char *p, kv_config *c)
{
    c->dim = get_i32(p + 0);
    c->hidden_dim = get_i32(p + 4);
    c->n_layers = get_i32(p + 8);
    c->n_heads = get_i32(p + 12);
    c->n_kv_heads = get_i32(p + 16);
    c->vocab_size = get_i32(p + 20);
    c->seq_len = get_i32(p + 24);
}

static void put_seven(unsigned char *p, const kv_config *c, int vocab_field)
{
    put_i32(p + 0, c->dim);
    put_i32(p + 4, c->hidden_dim);
    put_i32(p + 8, c->n_layers);
    put_i32(p + 12, c->n_heads);
    put_i32(p + 16, c->n_kv_heads);
    put_i32(p + 20, vocab_field);
    put_i32(p + 24, c->seq_len);
}

/* floats in llama2.c's two legacy RoPE tables (cos, sin), each [seq_len][d/2] */
static int64_t rope_table_floats(const kv_config *c)
{
    return 2 * (int64_t)c->seq_len * (kv_config_head_dim(c) / 2);
}

/* Parse the header in hdr[0..have) into c; *header_bytes receives its size on disk. */
static int parse_header(const char *path, const unsigned char *hdr, size_t have, kv_config *c,
                        int *format, int64_t *header_bytes, kv_err *err)
{
    memset(c, 0, sizeof *c);
    if (have == 0) return kv_fail(err, KV_ERR_FORMAT, "'%s' is empty (0 bytes)", path);

    if (have >= 4 && memcmp(hdr, KV_KVLAB_MAGIC, 4) == 0) {
        *format = KV_FILE_KVLAB;
        *header_bytes = KV_KVLAB_HEADER_BYTES;
        if (have < KV_KVLAB_HEADER_BYTES)
            return kv_fail(err, KV_ERR_FORMAT,
                           "'%s': truncated header: the kvlab header is %d bytes, the file has %zu",
                           path, KV_KVLAB_HEADER_BYTES, have);
        int version = get_i32(hdr + 4);
        if (version != KV_KVLAB_VERSION && version != KV_KVLAB_VERSION_ATTN)
            return kv_fail(err, KV_ERR_FORMAT,
                           "'%s': kvlab file version %d is not supported (this build reads "
                           "versions %d and %d)", path, version, KV_KVLAB_VERSION,
                           KV_KVLAB_VERSION_ATTN);
        const int used = version == KV_KVLAB_VERSION ? KV_KVLAB_USED_BYTES
                                                     : KV_KVLAB_USED_BYTES_ATTN;
        for (int i = used; i < KV_KVLAB_HEADER_BYTES; i++)
            if (hdr[i] != 0)
                return kv_fail(err, KV_ERR_FORMAT,
                               "'%s': kvlab header padding byte %d is nonzero (corrupt header)",
                               path, i);
        get_seven(hdr + 8, c);
        c->rope_theta = get_f32(hdr + 36);
        c->rotary_dim = get_i32(hdr + 40);
        c->norm_eps = get_f32(hdr + 44);
        c->tied_classifier = get_i32(hdr + 48);
        c->kind = get_i32(hdr + 52);
        if (version == KV_KVLAB_VERSION_ATTN) {
            c->attn = get_i32(hdr + 56);
            c->mla.d_c = get_i32(hdr + 60);
            c->mla.d_rope = get_i32(hdr + 64);
            c->mla.d_nope = get_i32(hdr + 68);
            c->mla.d_v = get_i32(hdr + 72);
            c->mla.q_rank = get_i32(hdr + 76);
            /* one spelling per model: what version 1 describes is written as version 1 */
            if (c->attn == KV_ATTN_GQA)
                return kv_fail(err, KV_ERR_FORMAT, "'%s': kvlab file version 2 with attention "
                               "kind 0 (MHA/GQA), which kvlab writes as version 1 (corrupt "
                               "header)", path);
        }
        kv_err why;
        if (kv_config_validate(c, &why))
            return kv_fail(err, KV_ERR_FORMAT, "'%s': invalid kvlab header: %s", path, why.msg);
        return KV_OK;
    }

    if (have >= 4 && (uint32_t)get_i32(hdr) == KV_LLAMA2C_EXPORT_MAGIC) {
        int version = have >= 8 ? get_i32(hdr + 4) : -1;
        return kv_fail(err, KV_ERR_FORMAT,
                       "'%s': llama2.c export version %d (magic \"ak42\") is not supported; "
                       "export with --version 0 (the fp32 format run.c reads)", path, version);
    }

    /* anything else must be a llama2.c ("version 0") file: seven int32, no magic */
    *format = KV_FILE_LLAMA2C;
    *header_bytes = KV_LLAMA2C_HEADER_BYTES;
    if (have < KV_LLAMA2C_HEADER_BYTES)
        return kv_fail(err, KV_ERR_FORMAT,
                       "'%s': truncated header: %zu bytes, a llama2.c header needs %d "
                       "(and a kvlab file starts with the magic \"KVLB\")",
                       path, have, KV_LLAMA2C_HEADER_BYTES);
    get_seven(hdr, c);
    kv_config_set_defaults(c); /* theta 10000, full rotary, eps 1e-5: what run.c assumes */
    /* llama2.c has no tied flag: a negative vocab_size means the classifier is stored */
    c->tied_classifier = c->vocab_size > 0;
    if (c->vocab_size < 0 && c->vocab_size != INT32_MIN) c->vocab_size = -c->vocab_size;
    kv_err why;
    if (kv_config_validate(c, &why))
        return kv_fail(err, KV_ERR_FORMAT,
                       "'%s': no kvlab magic \"KVLB\", and not a valid llama2.c header: %s",
                       path, why.msg);
    return KV_OK;
}

static int read_floats(FILE *f, float *dst, int64_t n)
{
    /* in pieces, so a short read is caught close to where it happened */
    const int64_t chunk = (int64_t)1 << 24;
    while (n > 0) {
        size_t k = (size_t)(n < chunk ? n : chunk);
        if (fread(dst, sizeof(float), k, f) != k) return 0;
        dst += k;
        n -= (int64_t)k;
    }
    return 1;
}

int kv_checkpoint_read(const char *path, kv_model *m, kv_err *err)
{
    if (!m) return kv_fail(err, KV_ERR_ARG, "model is NULL");
    memset(m, 0, sizeof *m);
    if (!path) return kv_fail(err, KV_ERR_ARG, "checkpoint path is NULL");
    FILE *f;
    int rc = kv_file_open_read(path, 0, &f, NULL, err); /* its header caps the size */
    if (rc) return rc;

    unsigned char hdr[KV_KVLAB_HEADER_BYTES]; /* [256] the longest header, or all of a shorter file */
    size_t have = fread(hdr, 1, sizeof hdr, f);
    kv_config c;
    int format = KV_FILE_LLAMA2C;
    int64_t header_bytes = 0, found = -1;
    if (ferror(f)) {
        rc = kv_fail(err, KV_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        goto done;
    }
    if ((rc = parse_header(path, hdr, have, &c, &format, &header_bytes, err))) goto done;

    /* exact size: header + weights (+ the two RoPE tables in llama2.c files). The header is
     * validated, so every term is bounded (< 2^45 bytes) and int64 cannot overflow. */
    const int64_t weights = kv_config_param_count(&c);
    const int64_t skipped = format == KV_FILE_LLAMA2C ? rope_table_floats(&c) : 0;
    const int64_t expected = header_bytes + 4 * (weights + skipped);
    if (fseeko(f, 0, SEEK_END) != 0 || (found = (int64_t)ftello(f)) < 0) {
        rc = kv_fail(err, KV_ERR_IO, "cannot determine the size of '%s': %s", path,
                     strerror(errno));
        goto done;
    }
    if (found < expected) {
        rc = kv_fail(err, KV_ERR_FORMAT,
                     "'%s' is truncated: expected %lld bytes (%lld-byte header + %lld floats), found %lld",
                     path, (long long)expected, (long long)header_bytes,
                     (long long)(weights + skipped), (long long)found);
        goto done;
    }
    if (found > expected) {
        rc = kv_fail(err, KV_ERR_FORMAT,
                     "'%s' has %lld trailing bytes: expected %lld bytes for its header, found %lld",
                     path, (long long)(found - expected), (long long)expected, (long long)found);
        goto done;
    }

    if ((rc = kv_model_alloc(m, &c, err))) goto done;
    /* everything up to rms_final is contiguous in both the file and m->data */
    const int64_t untied = c.tied_classifier ? 0 : (int64_t)c.vocab_size * c.dim;
    int ok = fseeko(f, (off_t)header_bytes, SEEK_SET) == 0 &&
             read_floats(f, m->data, weights - untied);
    /* llama2.c: skip the legacy freq_cis tables; run.c recomputes RoPE on the fly */
    if (ok && skipped) ok = fseeko(f, (off_t)(4 * skipped), SEEK_CUR) == 0;
    if (ok && untied) ok = read_floats(f, m->w.wcls, untied);
    if (!ok) {
        rc = kv_fail(err, KV_ERR_IO, "reading the weights of '%s' failed: %s", path,
                     ferror(f) ? strerror(errno) : "unexpected end of file");
        goto done;
    }
    kv_err why;
    if (kv_model_check_finite(m, &why)) {
        rc = kv_fail(err, KV_ERR_FORMAT, "'%s': %s", path, why.msg);
        goto done;
    }

done:
    fclose(f);
    if (rc) kv_model_free(m);
    return rc;
}

/* ------------------------------------------------------------------------------------ */

static int write_floats(FILE *f, const float *src, int64_t n)
{
    const int64_t chunk = (int64_t)1 << 24;
    while (n > 0) {
        size_t k = (size_t)(n < chunk ? n : chunk);
        if (fwrite(src, sizeof(float), k, f) != k) return 0;
        src += k;
        n -= (int64_t)k;
    }
    return 1;
}

/* llama2.c's export wrote the RoPE tables cos(pos * theta^(-2i/d)) and sin(...), each
 * [seq_len][d/2]. run.c skips them; writing real values keeps the file byte-compatible
 * with older readers that used them. */
static int write_rope_tables(FILE *f, const kv_config *c)
{
    const int half = kv_config_head_dim(c) / 2;
    float *row = malloc(sizeof(float) * (size_t)half); /* [d/2] */
    if (!row) return 0;
    int ok = 1;
    for (int table = 0; table < 2 && ok; table++) {
        for (int pos = 0; pos < c->seq_len && ok; pos++) {
            for (int i = 0; i < half; i++) {
                double freq = pow(10000.0, -2.0 * i / (2.0 * half));
                double a = pos * freq;
                row[i] = (float)(table == 0 ? cos(a) : sin(a));
            }
            ok = fwrite(row, sizeof(float), (size_t)half, f) == (size_t)half;
        }
    }
    free(row);
    return ok;
}

/* a llama2.c header holds only the seven fields: refuse what it would silently lose */
static int llama2c_can_express(const kv_config *c, kv_err *err)
{
    const char *hint = "; write the kvlab format instead";
    if (c->attn != KV_ATTN_GQA)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "an MLA model (chapter 11) cannot be stored in "
                       "a llama2.c file (its header knows only MHA/GQA shapes)%s", hint);
    if (c->rope_theta != 10000.0f)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "rope_theta %g cannot be stored in a llama2.c file (it assumes 10000)%s",
                       (double)c->rope_theta, hint);
    if (c->rotary_dim != kv_config_head_dim(c))
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "rotary_dim %d cannot be stored in a llama2.c file (it rotates the whole "
                       "head, %d)%s", c->rotary_dim, kv_config_head_dim(c), hint);
    if (c->norm_eps != 1e-5f)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "norm_eps %g cannot be stored in a llama2.c file (it assumes 1e-5)%s",
                       (double)c->norm_eps, hint);
    if (c->kind != KV_MODEL_GENERIC)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "model kind %d cannot be stored in a llama2.c file%s", c->kind, hint);
    return KV_OK;
}

int kv_checkpoint_write(const char *path, const kv_model *m, int format, kv_err *err)
{
    if (!path || !m || !m->data) return kv_fail(err, KV_ERR_ARG, "no path or no model to write");
    const kv_config *c = &m->config;
    int rc = kv_model_need_fp32(m, "writing a checkpoint", err);
    if (!rc) rc = kv_config_validate(c, err);
    if (rc) return rc;
    if (m->n_floats != kv_config_param_count(c))
        return kv_fail(err, KV_ERR_ARG, "model holds %lld floats but its config needs %lld",
                       (long long)m->n_floats, (long long)kv_config_param_count(c));
    if (format != KV_FILE_LLAMA2C && format != KV_FILE_KVLAB)
        return kv_fail(err, KV_ERR_ARG, "unknown checkpoint format %d (0 llama2.c, 1 kvlab)",
                       format);
    /* neither header has a field for them: a file without them would turn the model's slow
     * pairs at the wrong speed, quietly (a GGUF model is converted by keeping its file) */
    if (c->n_rope_factors)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "a model with RoPE frequency factors (Llama "
                       "3.x's rope_freqs, or linear RoPE scaling) cannot be stored in a %s "
                       "file: its header has no field for them (keep the GGUF file)",
                       format == KV_FILE_KVLAB ? "kvlab" : "llama2.c");
    if (format == KV_FILE_LLAMA2C && (rc = llama2c_can_express(c, err))) return rc;

    unsigned char hdr[KV_KVLAB_HEADER_BYTES] = {0}; /* [256] padding stays zero */
    size_t hdr_bytes;
    if (format == KV_FILE_KVLAB) {
        memcpy(hdr, KV_KVLAB_MAGIC, 4);
        put_i32(hdr + 4, c->attn == KV_ATTN_GQA ? KV_KVLAB_VERSION : KV_KVLAB_VERSION_ATTN);
        put_seven(hdr + 8, c, c->vocab_size);
        put_f32(hdr + 36, c->rope_theta);
        put_i32(hdr + 40, c->rotary_dim);
        put_f32(hdr + 44, c->norm_eps);
        put_i32(hdr + 48, c->tied_classifier);
        put_i32(hdr + 52, c->kind);
        if (c->attn != KV_ATTN_GQA) {
            put_i32(hdr + 56, c->attn);
            put_i32(hdr + 60, c->mla.d_c);
            put_i32(hdr + 64, c->mla.d_rope);
            put_i32(hdr + 68, c->mla.d_nope);
            put_i32(hdr + 72, c->mla.d_v);
            put_i32(hdr + 76, c->mla.q_rank);
        }
        hdr_bytes = KV_KVLAB_HEADER_BYTES;
    } else {
        put_seven(hdr, c, c->tied_classifier ? c->vocab_size : -c->vocab_size);
        hdr_bytes = KV_LLAMA2C_HEADER_BYTES;
    }

    /* a temporary file beside the target, renamed into place (kv_file.h): readers never see
     * a half-written checkpoint, and a failure leaves the old file (if any) untouched */
    kv_file_out o;
    if ((rc = kv_file_create(path, &o, err))) return rc;
    FILE *f = o.f;
    const int64_t untied = c->tied_classifier ? 0 : (int64_t)c->vocab_size * c->dim;
    int ok = fwrite(hdr, 1, hdr_bytes, f) == hdr_bytes &&
             write_floats(f, m->data, m->n_floats - untied);
    if (ok && format == KV_FILE_LLAMA2C) ok = write_rope_tables(f, c);
    if (ok && untied) ok = write_floats(f, m->w.wcls, untied);
    if (!ok) {
        rc = kv_fail(err, KV_ERR_IO, "writing '%s' failed: %s", path, strerror(errno));
        kv_file_abort(&o);
        return rc;
    }
    return kv_file_commit(&o, err);
}
