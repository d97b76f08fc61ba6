/*
 * kvlab info --model FILE.gguf: what a GGUF file holds (cli.h). The header, every metadata
 * key with its type and value (a long array as its type, count and first items; a long string
 * cut, with its length), the config kvlab would load (or why it would not), and the tensor
 * table: name, ggml type, shape (ne[0] first, the row length), bytes and offset in the data
 * section.
 */
#include "cli.h"
#include "kv_gguf_quant.h"

#include <ctype.h>
#include <string.h>

#define SHOW_ITEMS 6    /* items of an array shown */
#define SHOW_BYTES 60   /* bytes of a string shown */

/* a string of the file, quoted, non-printing bytes as \xNN, cut after SHOW_BYTES */
static void put_str(kv_gguf_str s)
{
    putchar('"');
    const uint64_t n = s.n < SHOW_BYTES ? s.n : SHOW_BYTES;
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s.s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (isprint(c) || c >= 0x80) putchar(c); /* UTF-8 passes through */
        else printf("\\x%02x", c);
    }
    putchar('"');
    if (n < s.n) printf("... (%llu bytes)", (unsigned long long)s.n);
}

static void put_num(int type, const void *p, uint64_t i)
{
    const double v = kv_gguf_array_num(type, p, i);
    if (type == KV_GGUF_U64) {
        uint64_t u;
        memcpy(&u, (const char *)p + 8 * i, 8);
        printf("%llu", (unsigned long long)u);
    } else if (type == KV_GGUF_I64) {
        int64_t s;
        memcpy(&s, (const char *)p + 8 * i, 8);
        printf("%lld", (long long)s);
    } else if (type == KV_GGUF_BOOL) {
        printf("%s", v != 0 ? "true" : "false");
    } else if (type == KV_GGUF_F32 || type == KV_GGUF_F64) {
        printf("%.9g", v);
    } else {
        printf("%.0f", v);
    }
}

static void put_kv(const kv_gguf *g, const kv_gguf_kv *kv)
{
    char key[96];
    snprintf(key, sizeof key, "%.*s", (int)(kv->key.n < 90 ? kv->key.n : 90), kv->key.s);
    if (kv->type != KV_GGUF_ARRAY) {
        printf("  %-40s %-8s ", key, kv_gguf_type_name(kv->type));
        if (kv->type == KV_GGUF_STRING) put_str(kv->str);
        else put_num(kv->type, kv->value, 0);
        putchar('\n');
        return;
    }
    char type[32];
    snprintf(type, sizeof type, "[%s x %llu]", kv_gguf_type_name(kv->elem_type),
             (unsigned long long)kv->n);
    printf("  %-40s %-8s", key, type);
    const uint64_t show = kv->n < SHOW_ITEMS ? kv->n : SHOW_ITEMS;
    const kv_gguf_str *strs;
    uint64_t n;
    if (kv->elem_type == KV_GGUF_STRING && kv_gguf_get_strings(g, key, &strs, &n, NULL) == KV_OK) {
        for (uint64_t i = 0; i < show; i++) {
            printf("%s", i ? ", " : " ");
            put_str(strs[i]);
        }
    } else if (kv->elem_type != KV_GGUF_ARRAY) {
        for (uint64_t i = 0; i < show; i++) {
            printf("%s", i ? ", " : " ");
            put_num(kv->elem_type, kv->value, i);
        }
    }
    printf("%s\n", show < kv->n ? ", ..." : "");
}

static void put_tensors(const kv_gguf *g)
{
    uint64_t total = 0;
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) total += kv_gguf_tensor_at(g, i)->nbytes;
    char b[32];
    printf("tensors (%lld, %s)\n", (long long)kv_gguf_n_tensors(g),
           kv_fmt_bytes((double)total, b, sizeof b));
    printf("  %-32s %-8s %-20s %12s %12s\n", "name", "type", "shape", "bytes", "offset");
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        char shape[96];
        int k = 0;
        for (int d = 0; d < t->n_dims; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? " x " : "",
                          (long long)t->ne[d]);
        printf("  %-32.*s %-8s %-20s %12llu %12llu\n", (int)t->name.n, t->name.s,
               kv_ggml_type_name(t->type), shape, (unsigned long long)t->nbytes,
               (unsigned long long)t->offset);
    }
}

int kv_cli_info_gguf(const char *cmd, const char *model)
{
    char path[KV_CLI_PATH_MAX];
    kv_err err;
    int rc = kv_cli_model_resolve(model, path, sizeof path, &err);
    if (rc) return kv_cli_fail(cmd, "--model", rc, &err);
    kv_gguf *g = NULL;
    if ((rc = kv_gguf_open(path, &g, &err))) return kv_cli_fail(cmd, "--model", rc, &err);
    char b[32];
    printf("file         %s\n", path);
    printf("GGUF         version %d, alignment %llu, data at byte %llu of %s\n",
           kv_gguf_version(g), (unsigned long long)kv_gguf_alignment(g),
           (unsigned long long)kv_gguf_data_offset(g),
           kv_fmt_bytes((double)kv_gguf_file_size(g), b, sizeof b));
    kv_config c;
    if (kv_gguf_model_config(g, &c, &err) == KV_OK) {
        char d[256];
        kv_config_describe(&c, d, sizeof d);
        printf("model        %s, eps %g, rotary %d, %s classifier\n", d, (double)c.norm_eps,
               c.rotary_dim, c.tied_classifier ? "tied" : "untied");
    } else {
        printf("model        not loadable: %s\n", err.msg);
    }
    printf("metadata (%lld keys)\n", (long long)kv_gguf_n_kv(g));
    for (int64_t i = 0; i < kv_gguf_n_kv(g); i++) put_kv(g, kv_gguf_kv_at(g, i));
    put_tensors(g);
    kv_gguf_close(g);
    return KV_EXIT_OK;
}
