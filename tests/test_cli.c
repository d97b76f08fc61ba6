/*
 * The kvlab command line, run as a user would: exit codes (0 ok, 1 run failed, 2 bad
 * arguments or input files), messages that name the bad argument, --help everywhere, the
 * calc figures of the chapters, and the chapter demos running to completion.
 *
 * usage: test_cli <path to kvlab> <CUDA mode: none|cuda|emulation>
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_bench.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h" /* kvlab, result, run_in(): shared with the bad-input tests */

/* Run kvlab with the NULL-terminated arguments in the current folder, stdout and stderr
 * captured (run_in()). */
static result run(const char *first, ...)
{
    const char *args[64];
    int n = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 63; a = va_arg(ap, const char *)) args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return run_in(".", args);
}

static void done(result *r)
{
    free(r->out);
    free(r->err);
}

/* Expect exit 2 with @p name in stderr; the command line is shown on failure. */
#define EXPECT_BAD(name, ...)                                                                 \
    do {                                                                                      \
        result r_ = run(__VA_ARGS__, (const char *)NULL);                                     \
        KV_CHECK(r_.rc == 2, "%s: exit %d, expected 2 (stderr: %s)", #__VA_ARGS__, r_.rc, r_.err); \
        KV_CHECK(strstr(r_.err, name) != NULL, "%s: stderr does not name '%s': %s",         \
                 #__VA_ARGS__, name, r_.err);                                                 \
        done(&r_);                                                                            \
    } while (0)

/* Expect exit 0 and @p text in stdout. */
#define EXPECT_OK(text, ...)                                                                  \
    do {                                                                                      \
        result r_ = run(__VA_ARGS__, (const char *)NULL);                                     \
        KV_CHECK(r_.rc == 0, "%s: exit %d, expected 0 (stderr: %s)", #__VA_ARGS__, r_.rc, r_.err); \
        KV_CHECK(strstr(r_.out, text) != NULL, "%s: stdout lacks '%s'", #__VA_ARGS__, text);  \
        done(&r_);                                                                            \
    } while (0)

static void test_dispatch(void)
{
    result r = run(NULL);
    KV_CHECK(r.rc == 2, "no command: exit %d, expected 2", r.rc);
    done(&r);
    EXPECT_BAD("frobnicate", "frobnicate");
    EXPECT_OK("calc", "--help");
    const char *subs[] = {"tour", "generate", "calc", "info", "bench", "needle", "dialogue",
                          "convert"};
    for (int i = 0; i < 8; i++) EXPECT_OK("usage", subs[i], "--help");
    EXPECT_OK("usage", "bench", "decode", "--help");
    EXPECT_OK("usage", "bench", "attention-gqa", "--help");
    EXPECT_OK("usage", "serve", "--help");
    EXPECT_OK("usage", "bench", "swap", "--help");
    EXPECT_OK("usage", "bench", "attention", "--help");
    EXPECT_BAD("--kv-heads", "convert", "--kv-heads", "3x");
    EXPECT_BAD("--heads", "bench", "attention-gqa", "--heads", "0");
}

static void test_tour_args(void)
{
    EXPECT_BAD("--bogus", "tour", "--bogus");
    EXPECT_BAD("--chapter", "tour", "--chapter");
    EXPECT_BAD("--chapter", "tour", "--chapter", "12abc");
    EXPECT_BAD("--chapter", "tour", "--chapter", "-1");
    EXPECT_BAD("--chapter", "tour", "--chapter", "99999999999999999999999");
    EXPECT_BAD("--chapter", "tour", "--chapter", "77");
    EXPECT_BAD("--chapter", "tour", "--chapter", "--csv");
    EXPECT_BAD("--device", "tour", "--device", "tpu");
    EXPECT_BAD("stray", "tour", "stray");
    EXPECT_BAD("--csv", "tour", "--csv", "--csv");
}

/* generate as llama2.c's run.c: past the context the steps are cut with a note, an empty
 * prompt is BOS alone, and BOS or EOS ends the text unless --no-stop. */
static void test_generate_llama2c(void)
{
    result r = run("generate", "--steps", "100000", "--prompt", "", (const char *)NULL);
    KV_CHECK(r.rc == 0 && strstr(r.err, "note: --steps 100000 cut to 512") != NULL,
             "generate --steps 100000: exit %d (%s)", r.rc, r.err);
    done(&r);
    /* hot sampling over tiny-gqa's 512 tokens: seed 3 meets EOS at token 155 */
    result all = run("generate", "--steps", "511", "--temperature", "50", "--seed", "3",
                     "--no-stop", "--default", "tiny-gqa", (const char *)NULL);
    result stop = run("generate", "--steps", "511", "--temperature", "50", "--seed", "3",
                      "--default", "tiny-gqa", (const char *)NULL);
    KV_CHECK(all.rc == 0 && stop.rc == 0, "generate: exits %d, %d", all.rc, stop.rc);
    KV_CHECK(strstr(all.err, "511 tokens in") != NULL && strstr(all.err, "stopped") == NULL,
             "--no-stop: %s", all.err);
    KV_CHECK(strstr(stop.err, "stopped at EOS after 155 of 511 tokens") != NULL &&
             strstr(stop.err, "155 tokens in") != NULL, "no stop at EOS: %s", stop.err);
    /* the stopped run's text (the EOS not printed) begins the --no-stop run's */
    const size_t n = strlen(stop.out);
    KV_CHECK(n > 1 && strlen(all.out) > n && strncmp(all.out, stop.out, n - 1) == 0,
             "the stopped run's text is not the start of the --no-stop run's");
    done(&all);
    done(&stop);
}

static void test_generate_args(void)
{
    EXPECT_BAD("--steps", "generate", "--steps", "12abc");
    EXPECT_BAD("--steps", "generate", "--steps", "-3");
    EXPECT_BAD("--steps", "generate", "--steps", "");
    EXPECT_BAD("--temperature", "generate", "--temperature", "nan");
    EXPECT_BAD("--temperature", "generate", "--temperature", "-0.5");
    EXPECT_BAD("--top-p", "generate", "--top-p", "1.5");
    EXPECT_BAD("--seed", "generate", "--seed", "99999999999999999999999");
    EXPECT_BAD("--mode", "generate", "--mode", "fast");
    EXPECT_BAD("--default", "generate", "--default", "huge");
    EXPECT_BAD("--model", "generate", "--model");
    EXPECT_BAD("/nonexistent/model.bin", "generate", "--model", "/nonexistent/model.bin");
    EXPECT_BAD("--tokenizer", "generate", "--tokenizer");
    EXPECT_BAD("--prompt", "generate", "--model", "x.bin", "--prompt", "hi");
    /* chapter 05: the cache layout options */
    EXPECT_BAD("--layout", "generate", "--layout", "scattered");
    EXPECT_BAD("--block-size", "generate", "--block-size", "8");  /* needs --layout paged */
    EXPECT_BAD("--blocks", "generate", "--layout", "paged", "--blocks", "0");
    EXPECT_BAD("multiple of 32", "generate", "--layout", "paged", "--cache", "int4", "--block-size", "16");

    /* bad input files: a model file of garbage, a tokenizer file cut short -> exit 2, named */
    char path[] = "/tmp/kvlab_test_garbage_XXXXXX";
    int fd = mkstemp(path);
    KV_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        const char junk[] = "this is not a checkpoint, only forty-odd bytes of text";
        KV_CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk, "write");
        close(fd);
        EXPECT_BAD(path, "generate", "--model", path);
        EXPECT_BAD(path, "generate", "--tokenizer", path);
        unlink(path);
    }
}

static void test_calc_args(void)
{
    EXPECT_BAD("nosuch", "calc", "--preset", "nosuch");
    EXPECT_BAD("--dtype", "calc", "--preset", "llama-2-7b", "--dtype", "fp64");
    EXPECT_BAD("--seq", "calc", "--preset", "llama-2-7b", "--seq", "0");
    EXPECT_BAD("--seq", "calc", "--preset", "llama-2-7b", "--seq", "2048x");
    EXPECT_BAD("--batch", "calc", "--preset", "llama-2-7b", "--batch", "-8");
    EXPECT_BAD("--config", "calc", "--config", "1,2,3");
    EXPECT_BAD("--config", "calc", "--config", "64,172,2,4,3,512,512"); /* H_kv 3 does not divide H 4 */
    EXPECT_BAD("--config", "calc", "--config", "64,172,2,4,4,512,51x");
    EXPECT_BAD("--config", "calc", "--config", "64,172,2,4,4,512,512,");
    EXPECT_BAD("--config", "calc", "--config", "64,172,2,4,4,512,512,9");
    EXPECT_BAD("--config", "calc", "--config",
               "0000000000000000000000000000000000000000000000000000000000000000064abc,172,2,4,4,512,512");
    EXPECT_BAD("--preset", "calc", "--preset", "llama-2-7b", "--config", "64,172,2,4,4,512,512");
    EXPECT_BAD("--frob", "calc", "--frob=1");
    /* chapter 10: --tp needs a model and ranks that split the heads */
    EXPECT_BAD("--tp", "calc", "--tp", "2");
    EXPECT_BAD("--tp", "calc", "--preset", "llama-2-7b", "--tp", "3");
    EXPECT_BAD("--tp", "calc", "--preset", "llama-3-8b", "--tp", "0");
}

static void test_other_args(void)
{
    EXPECT_BAD("--verbose", "info", "--verbose");
    EXPECT_BAD("benchmark", "bench");
    EXPECT_BAD("nosuch", "bench", "nosuch");
    EXPECT_BAD("--repeats", "bench", "decode", "--repeats", "0");
    EXPECT_BAD("--steps", "bench", "decode", "--steps", "12abc");
    EXPECT_BAD("--default", "bench", "decode", "--default", "nosuch");
    /* issue 11: the roofline benchmarks */
    EXPECT_OK("usage", "bench", "bandwidth", "--help");
    EXPECT_OK("usage", "bench", "engine", "--help");
    EXPECT_BAD("--cache", "bench", "engine", "--cache", "nosuch");
    EXPECT_BAD("--config", "bench", "engine", "--config", "huge");
    EXPECT_BAD("--tokens", "bench", "engine", "--tokens", "300", "--seq-len", "300");
    /* chapters 07 and 08 (the full set is in test_bad_input) */
    EXPECT_BAD("--trace", "serve", "--preempt", "lru");
    EXPECT_BAD("--min", "bench", "swap", "--min", "64", "--max", "32");
    EXPECT_BAD("--decode", "bench", "attention", "--decode", "0");
    EXPECT_BAD("--prefill", "bench", "attention", "--prefill", "64,");
}

static void test_calc_figures(void)
{
    /* Llama-2-7B, fp16: 2*32*128*2 = 16 KiB per token per layer, x32 = 512 KiB per token,
     * x2048 = 1 GiB, x8 = 8 GiB */
    result r = run("calc", "--preset", "llama-2-7b", "--dtype", "fp16", "--seq", "2048", "--batch", "8",
                   (const char *)NULL);
    KV_CHECK(r.rc == 0, "calc llama-2-7b: exit %d", r.rc);
    KV_CHECK(strstr(r.out, "16384 bytes = 16 KiB") != NULL, "per token per layer 16 KiB missing:\n%s", r.out);
    KV_CHECK(strstr(r.out, "524288 bytes = 512 KiB") != NULL, "per token 512 KiB missing");
    KV_CHECK(strstr(r.out, "1073741824 bytes = 1 GiB") != NULL, "1 GiB at 2048 tokens missing");
    KV_CHECK(strstr(r.out, "8589934592 bytes = 8 GiB") != NULL, "8 GiB at batch 8 missing");
    KV_CHECK(strstr(r.out, "binary") != NULL, "units not said to be binary");
    done(&r);
    /* the source article's "about 1 GB" for 7B fp32 at 512 tokens: it is 0.5 GiB */
    r = run("calc", "--preset", "llama-2-7b", "--dtype", "fp32", "--seq", "512", (const char *)NULL);
    KV_CHECK(r.rc == 0 && strstr(r.out, "536870912 bytes = 512 MiB = 0.5 GiB") != NULL,
             "7B fp32 at 512 tokens is not 0.5 GiB:\n%s", r.out);
    done(&r);
    /* Mistral's window caps N at 4096: 32*2*8*128*2 * 4096 = 512 MiB, and it says so */
    r = run("calc", "--preset", "Mistral-7B", "--seq", "32768", (const char *)NULL);
    KV_CHECK(r.rc == 0 && strstr(r.out, "536870912 bytes = 512 MiB") != NULL &&
                 strstr(r.out, "sliding window") != NULL,
             "mistral-7b at 32768 tokens not capped at the 4096 window:\n%s", r.out);
    done(&r);
    /* int4 (KIVI) is half a byte per element plus an fp16 scale and zero per 32 elements:
     * b = 0.625, 32*2*32*128*0.625*1024 = 160 MiB, with the metadata note */
    r = run("calc", "--preset", "llama-2-7b", "--dtype", "int4", "--seq", "1024", (const char *)NULL);
    KV_CHECK(r.rc == 0 && strstr(r.out, "= 160 MiB") != NULL && strstr(r.out, "chapter 04") != NULL,
             "int4 figures or the metadata note missing:\n%s", r.out);
    done(&r);
    /* --config: llama2.c stories15M shape, fp32, 256 tokens: 6*2*6*48*4 = 13.5 KiB per token */
    EXPECT_OK("13824 bytes = 13.5 KiB", "calc", "--config", "288,768,6,6,6,32000,256", "--dtype", "fp32");
    /* --tp (chapter 10): Llama-3-70B, 8 KV heads, 8192 tokens fp16: 80*2*8192*8*128*2 =
     * 2.5 GiB; 8 ranks hold one KV head each (320 MiB), 16 ranks hold one each too, every head
     * twice: 5 GiB over all ranks */
    EXPECT_OK("= 320 MiB per rank", "calc", "--preset", "llama-3-70b", "--seq", "8192", "--tp", "8");
    EXPECT_OK("5 GiB over all ranks (every KV head stored twice)", "calc", "--preset",
              "llama-3-70b", "--seq", "8192", "--tp", "16");
    EXPECT_OK("llama-3-70b", "calc");
    EXPECT_OK("mistral-7b", "calc", "--list");
    EXPECT_OK("CUDA mode", "info");
}

/* quick: under the sanitizers the chapters below run at tour --quick's sizes (the same code
 * paths; the Release suite and the README's tour run them at full size) */
static void test_runs(const char *cuda_mode, int quick)
{
    const char *q = quick ? "--quick" : NULL; /* NULL ends the argument list early */
    EXPECT_OK("cost of the step", "tour", "--chapter", "1", q);
    EXPECT_OK("identical", "tour", "--chapter", "2", q);
    /* chapter 03: Llama-2-7B MHA 512 KiB per token at fp16, divided by G = 8 for its GQA column */
    EXPECT_OK("64 KiB", "calc", "--compare-heads");
    EXPECT_OK("G", "tour", "--chapter", "3", q);
    EXPECT_OK("int8", "tour", "--chapter", "4", q);
    EXPECT_OK("chapter,mode,step", "tour", "--chapter", "1", "--csv", "-", q);
    /* chapter 09's CSV: both tables, the second (kept positions) ending with the figure's rows */
    EXPECT_OK("kept,direct,topk/b16,2,question 100%", "tour", "--chapter", "9", "--csv", "-", q);
    /* tour --quick (what memcheck runs): every chapter's demo, its checks included, exit 0 */
    EXPECT_OK("== chapter 10: speculative decoding: the cache writes every draft, rolls back the "
              "rejected (device cpu, quick sizes) ==", "tour", "--quick");
    EXPECT_BAD("--quick", "tour", "--quick", "--quick");
    EXPECT_OK("speed-up", "bench", "decode", "--steps", "8", "--repeats", "1");
    EXPECT_OK("growth exponents", "bench", "decode", "--steps", "8", "--repeats", "1");
    EXPECT_OK("last-level cache", "bench", "bandwidth", "--mib", "8", "--repeats", "1");
    /* --threads on every command, those without a model too; never more than the CPUs */
    EXPECT_OK("last-level cache", "bench", "bandwidth", "--mib", "8", "--repeats", "1", "--threads", "1");
    EXPECT_OK("--threads N", "calc", "--help");
    EXPECT_BAD("more than the", "calc", "--threads", "100000");
    EXPECT_BAD("more than the", "tour", "--threads", "100000");
    EXPECT_OK("ratio", "bench", "engine", "--tokens", "4", "--dim", "32", "--layers", "1",
              "--heads", "2", "--hidden", "32", "--vocab", "64", "--repeats", "1");
    EXPECT_OK("abc", "generate", "--steps", "8", "--layout", "paged", "--block-size", "4", "--prompt", "abc");
    /* chapter 07 modelled only (a preset: nothing measured), chapter 08 on a small shape */
    EXPECT_OK("recompute dearer than swap", "bench", "swap", "--model", "llama-2-7b", "--max", "64");
    EXPECT_OK("prefill,cpu,cpu tiled", "bench", "attention", "--decode", "none", "--prefill", "32",
              "--prefill-heads", "2", "--prefill-kv-heads", "1", "--head-dim", "16",
              "--prefill-repeats", "1", "--csv", "-");
    EXPECT_OK("cpu engine", "bench", "attention", "--decode", "64", "--prefill", "none",
              "--only", "engine", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
              "--repeats", "1");
    EXPECT_OK("portable loops", "bench", "attention", "--decode", "64", "--prefill", "none",
              "--only", "engine,naive", "--loops", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "16", "--repeats", "1");
    {   /* an engine row larger than the LLC is followed by the same call from the LLC:
         * fp16, 8 KV heads of d 64 = 2 KiB of K and V per token, twice the LLC */
        const int64_t llc = kv_llc_bytes(NULL, NULL);
        const int64_t n = llc > 0 ? 2 * llc / 2048 : 1024;
        char ns[32];
        snprintf(ns, sizeof ns, "%lld", (long long)n);
        if (n <= (1 << 20)) {
            /* its ratio is against the larger of the bandwidth before and after it, so never
             * above its rate over the run's first figure; the resident row uses the same */
            result r = run("bench", "attention", "--decode", ns, "--prefill", "none", "--only",
                           "engine", "--heads", "8", "--kv-heads", "8", "--head-dim", "64",
                           "--dtype", "fp16", "--repeats", "1", (const char *)NULL);
            const char *hb = strstr(r.out, "this run): "), *row = strstr(r.out, "cpu engine  ");
            const char *res = strstr(r.out, "(resident)");
            double bw0 = 0, t = 0, g = 0, pct = 0, tr = 0, gr = 0, pr = 0;
            char unit[8], ur[8];
            int ok = r.rc == 0 && hb && row && res && sscanf(hb, "this run): %lf", &bw0) == 1 &&
                     sscanf(row, "cpu engine %lf %*s %7s %lf %lf%%", &t, unit, &g, &pct) == 4 &&
                     sscanf(res, "(resident) %lf %*s %7s %lf %lf%%", &tr, ur, &gr, &pr) == 4;
            KV_CHECK(ok, "bench attention, resident case: exit %d, output not as expected: %s",
                     r.rc, r.out);
            if (ok) {
                /* each figure to its printed digits: GB/s to 0.005, percent to 0.05 */
                KV_CHECK(pct <= 100.0 * (g + 0.005) / (bw0 - 0.005) + 0.05,
                         "engine row at %.1f%% of BW, above its %.2f GB/s over the first %.2f",
                         pct, g, bw0);
                /* the same roof: GB/s over percent alike, to the printed digits (GB/s to
                 * 0.005, percent to 0.05: each quotient within its relative error) */
                const double a = g / pct, b = gr / pr;
                const double tol = a * (0.005 / g + 0.05 / pct) + b * (0.005 / gr + 0.05 / pr);
                KV_CHECK(fabs(a - b) <= tol,
                         "engine and resident rows against different bandwidths: %.2f/%.1f "
                         "vs %.2f/%.1f", g, pct, gr, pr);
            }
            done(&r);
            EXPECT_OK("\ndecode,cpu,cpu engine resident,8,8,64,fp16,1,", "bench", "attention",
                      "--decode", ns, "--prefill", "none", "--only", "engine", "--heads", "8",
                      "--kv-heads", "8", "--head-dim", "64", "--dtype", "fp16", "--repeats", "1",
                      "--csv", "-");
        }
    }
    /* chapter 05: every layout against the memory's rate for its pattern, in the same run */
    EXPECT_OK("in shuffled chunks of one head's block: B8 (512 B)", "bench", "paged", "--heads",
              "2", "--kv-heads", "1", "--head-dim", "16", "--lengths", "64", "--repeats", "1");
    EXPECT_OK("paged,8,cpu,", "bench", "paged", "--heads", "2", "--kv-heads", "1", "--head-dim",
              "16", "--lengths", "64", "--repeats", "1", "--csv", "-");
    EXPECT_OK("6 of 6 cells pass", "needle", "--lengths", "200", "--depths", "0,50,100", "--layout", "paged", "--block-size", "8");

    /* greedy naive and cached generation print the same tokens */
    result a = run("generate", "--steps", "24", "--mode", "naive", "--prompt", "abc", (const char *)NULL);
    result b = run("generate", "--steps=24", "--mode=cached", "--prompt", "abc", (const char *)NULL);
    KV_CHECK(a.rc == 0 && b.rc == 0, "generate: exits %d, %d (%s%s)", a.rc, b.rc, a.err, b.err);
    KV_CHECK(strcmp(a.out, b.out) == 0 && strncmp(a.out, "abc", 3) == 0,
             "naive and cached text differ:\n%s\n%s", a.out, b.out);
    KV_CHECK(strstr(a.err, "tokens/s") != NULL, "generate does not report tokens/s");
    KV_CHECK(strstr(a.err, "from the second token on, as run.c") != NULL,
             "generate does not report run.c's tokens/s: %s", a.err);
    done(&a);
    done(&b);
    test_generate_llama2c();

    if (strcmp(cuda_mode, "emulation") == 0) {
        /* the emulated GPU runs a short chapter 02 demo: the same tokens as its naive run */
        EXPECT_OK("identical", "tour", "--chapter", "2", "--device", "cuda");
    } else if (strcmp(cuda_mode, "cuda") == 0) {
        /* a real CUDA build: runs where a GPU is, else exits 1 with a message, never crashes */
        result r = run("tour", "--chapter", "2", "--device", "cuda", (const char *)NULL);
        KV_CHECK(r.rc == 0 || (r.rc == 1 && strstr(r.err, "no usable CUDA device") != NULL),
                 "tour --device cuda: exit %d, stderr: %s", r.rc, r.err);
        done(&r);
    }
    if (strcmp(cuda_mode, "none") == 0) {
        const char *what[5][6] = {{"tour", "--chapter", "1", "--device", "cuda", NULL},
                                  {"generate", "--device", "cuda", NULL},
                                  {"bench", "decode", "--device", "cuda", NULL},
                                  {"bench", "attention", "--device", "cuda", NULL},
                                  {"serve", "--trace", "t.csv", "--device", "cuda", NULL}};
        for (int i = 0; i < 5; i++) {
            result r = run(what[i][0], what[i][1], what[i][2], what[i][3], what[i][4], what[i][5],
                           (const char *)NULL);
            KV_CHECK(r.rc == 2 && strstr(r.err, "without CUDA") != NULL,
                     "%s --device cuda in a CPU-only build: exit %d, stderr: %s", what[i][0], r.rc, r.err);
            done(&r);
        }
    }
}

/* kvlab tp (chapter 10): --help, a refused rank count, and a replicated run whose per-rank
 * cache is the figure `kvlab calc --tp` prints for the same shape (the command it names). */
static void test_tp(void)
{
    EXPECT_OK("usage", "tp", "--help");
    EXPECT_OK("tp ", "--help"); /* listed in kvlab's own help */
    EXPECT_BAD("--ranks", "tp", "--default", "tiny", "--ranks", "3");
    EXPECT_BAD("--ranks", "tp", "--ranks", "0");
    result r = run("tp", "--default", "tiny-gqa", "--ranks", "4", "--prompt", "8", "--tokens", "8",
                   "--repeats", "1", (const char *)NULL);
    KV_CHECK(r.rc == 0, "tp tiny-gqa 4 ranks: exit %d (stderr: %s)", r.rc, r.err);
    KV_CHECK(strstr(r.out, "tokens equal to p = 1: yes") != NULL, "tp: tokens not equal: %s", r.out);
    KV_CHECK(strstr(r.out, "replicated on p / H_kv = 2 ranks") != NULL, "tp: replication not "
             "stated: %s", r.out);
    KV_CHECK(strstr(r.out, "= 4 per token") != NULL, "tp: tiny has L = 2: 4 all-reduces per "
             "token: %s", r.out);
    char fmt[32] = "", cfg[64] = "", dt[16] = "", seq[16] = "", ranks[8] = "";
    const char *b = strstr(r.out, "per-rank KV cache: ");
    const char *c = strstr(r.out, "kvlab calc --config ");
    int ok = b && c && sscanf(strstr(b, "= ") + 2, "%31[^(]", fmt) == 1 &&
             sscanf(c, "kvlab calc --config %63s --dtype %15s --seq %15s --tp %7s", cfg, dt, seq,
                    ranks) == 4;
    KV_CHECK(ok, "tp: no per-rank bytes or calc command in: %s", r.out);
    done(&r);
    if (!ok) return;
    fmt[strlen(fmt) - 1] = '\0'; /* the space before "(" */
    char want[64];
    snprintf(want, sizeof want, "= %s per rank", fmt);
    r = run("calc", "--config", cfg, "--dtype", dt, "--seq", seq, "--tp", ranks, (const char *)NULL);
    KV_CHECK(r.rc == 0 && strstr(r.out, want) != NULL, "calc --tp does not print '%s': %s", want,
             r.out);
    done(&r);
}

/* Column col (0 = the format) of the format's row of bench quant --csv. */
static double csv_field(const char *out, const char *format, int col)
{
    char key[32];
    snprintf(key, sizeof key, "\n%s,", format);
    const char *p = strstr(out, key);
    for (int i = 0; p && i < col; i++) p = strchr(p + 1, ',');
    return p ? atof(p + 1) : -1.0;
}

/* Chapter 04, exercise 1: --outlier-channels makes key channels outliers. Per-token int8 keys
 * share one scale per row, so one channel 20 times larger coarsens every channel of the row:
 * their error must grow (predicted about 3x: the row's amax grows 20x, its norm about 2.6x for
 * one channel of 64); KIVI's per-channel keys (int2/w32, the format that spills at these sizes)
 * give the outlier channel its own scale and must stay within 10 %. Values are untouched. */
static void test_outliers(void)
{
    EXPECT_BAD("--outlier-channels", "bench", "quant", "--outlier-channels", "513");
    double k8[2], kivi[2], v8[2];
    for (int o = 0; o < 2; o++) {
        result r = run("bench", "quant", "--quick", "--no-needles", "--seq", "64", "--repeats", "1",
                       "--csv", "-", "--outlier-channels", o ? "1" : "0", (const char *)NULL);
        KV_CHECK(r.rc == 0, "bench quant --outlier-channels %d: exit %d (%s)", o, r.rc, r.err);
        k8[o] = csv_field(r.out, "int8", 2);
        v8[o] = csv_field(r.out, "int8", 3);
        kivi[o] = csv_field(r.out, "int2/w32", 2);
        done(&r);
    }
    KV_CHECK(k8[0] > 0 && k8[1] > 2.0 * k8[0], "int8 key error %g -> %g with an outlier channel: "
             "expected at least 2x", k8[0], k8[1]);
    KV_CHECK(kivi[0] > 0 && fabs(kivi[1] / kivi[0] - 1.0) < 0.1, "int2/w32 (per-channel keys) key "
             "error %g -> %g: expected within 10 %%", kivi[0], kivi[1]);
    KV_CHECK(v8[0] > 0 && fabs(v8[1] / v8[0] - 1.0) < 0.1, "int8 value error %g -> %g: the "
             "values are not scaled", v8[0], v8[1]);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s <kvlab> <cuda mode> [quick]\n", argv[0]);
        return 2;
    }
    const int quick = argc > 3 && !strcmp(argv[3], "quick");
    kvlab = argv[1];
    test_dispatch();
    test_tour_args();
    test_generate_args();
    test_calc_args();
    test_other_args();
    test_calc_figures();
    test_tp();
    test_outliers();
    test_runs(argv[2], quick);
    return kv_test_finish();
}
