/*
 * kvlab info --model on the GGUF files of tests/data/gguf (tools/gguf/make_test_files.py):
 * the header, keys and values, the config, the tensor table as the generator wrote them; and
 * the refusals with exit 2: a file that is not there, a truncated one, `--model smollm2`
 * before tools/fetch-model.sh has fetched it, --weights that the model or the device cannot
 * use.
 *
 * Usage: test_gguf_cli <kvlab> <tests/data/gguf>
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_cli.h"

static char data[PATH_MAX];

/* kvlab info --model @p file: exit 0 and every '|'-separated piece of @p want on stdout */
static void expect_info(const char *file, const char *want)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", data, file);
    result r = run_in(dir, (const char *const[]){"info", "--model", path, NULL});
    KV_CHECK(r.rc == 0, "info --model %s: exit %d (stderr: %s)", file, r.rc, r.err);
    char words[2048];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        KV_CHECK(r.out && strstr(r.out, w), "info --model %s: stdout lacks '%s'", file, w);
    free(r.out);
    free(r.err);
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    if (argc < 3 || !realpath(argv[2], data)) {
        fprintf(stderr, "usage: %s <kvlab> <tests/data/gguf>\n", argv[0]);
        return 2;
    }
    expect_info("tiny_llama.gguf",
                "GGUF         version 3, alignment 32|"
                "model        dim 32, L 2, H 4, H_kv 2, d 8, hidden 64, vocab 40, seq 128|"
                "untied classifier|metadata (11 keys)|"
                "  general.architecture                     string   \"llama\"\n|"
                "  llama.block_count                        u32      2\n|"
                "  llama.rope.freq_base                     f32      500000\n|"
                "tensors (21, |"
                "  token_embd.weight                Q8_0     32 x 40|"
                "  blk.0.attn_q.weight              Q4_0     32 x 32|"
                "  blk.1.ffn_down.weight            Q5_1     64 x 32|"
                "  blk.0.ffn_up.weight              BF16     32 x 64                      4096|"
                "  output.weight                    Q4_1     32 x 40");
    expect_info("types_v2.gguf",
                "GGUF         version 2, alignment 32|"
                "model        not loadable: architecture 'kvlab-test' is not supported (kvlab "
                "runs 'llama')|"
                "  test.scalar.u64                          u64      18446744073709551615\n|"
                "  test.scalar.i64                          i64      -9223372036854775808\n|"
                "  test.array.string                        [string x 5] \"a\", \"\", "
                "\"<|im_start|>\", \"\xc4\xa0the\", \"xxxx|(300 bytes)|"
                "  test.array.long_i32                      [i32 x 1000] 0, 1, 2, 3, 4, 5, ...\n|"
                "  test.nested.deep                         [array x 2]\n|"
                "  i32.four                         I32      1 x 2 x 1 x 3                  24"
                "          128");
    expect_info("align64.gguf", "alignment 64|  general.alignment                        u32      64");

    char path[PATH_MAX + 64], cut[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/types_v3.gguf", data);
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    size_t n;
    unsigned char *b = slurp(path, &n);
    KV_CHECK(b != NULL, "cannot read %s", path);
    if (b) write_bytes(cut, b, n - 100);
    free(b);
    expect_cli_bad("kvlab info: --model:|tensor 4 'q8_0.rows': data [6368, 6504) past the end of the file (size 6460)",
                   (const char *const[]){"info", "--model", cut, NULL});
    expect_cli_bad("kvlab info: --model:|cannot open|no-such.gguf",
                   (const char *const[]){"info", "--model", "no-such.gguf", NULL});
    /* --weights: a CPU storage for a GGUF model only; a 16-bit copy needs --device cuda */
    expect_cli_bad("kvlab generate: --weights: native keeps a GGUF model's blocks; tiny has fp32 "
                   "weights (f32 only)",
                   (const char *const[]){"generate", "--default", "tiny", "--weights", "native", NULL});
    expect_cli_bad("kvlab generate: --weights: bf16 weights need --device cuda (on the cpu: f32, "
                   "native, q8_0 or f16)",
                   (const char *const[]){"generate", "--weights", "bf16", NULL});
    expect_cli_bad("kvlab bench engine: --context: needs --model",
                   (const char *const[]){"bench", "engine", "--context", "64", NULL});
    setenv("KVLAB_MODELS", dir, 1); /* an empty models folder */
    expect_cli_bad("model 'smollm2' is not fetched: run tools/fetch-model.sh smollm2",
                   (const char *const[]){"info", "--model", "smollm2", NULL});
    cleanup();
    return kv_test_finish();
}
