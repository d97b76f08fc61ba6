/*
 * kvlab tour: each chapter's demo, in order. A chapter adds its demo as one row of the
 * table below (its function lives in chapters/NN-name/demo.c and is declared in cli.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

typedef struct {
    int chapter;
    const char *title;
    kv_demo_fn run;
} kv_demo;

static const kv_demo demos[] = {
    {1, "naive recompute", kv_demo_ch01},
    {2, "the KV cache", kv_demo_ch02},
    {3, "MQA and GQA", kv_demo_ch03},
    {4, "KV-cache quantization", kv_demo_ch04},
    {5, "paged KV cache", kv_demo_ch05},
    {6, "sliding window and attention sinks", kv_demo_ch06},
    {7, "swap and recompute", kv_demo_ch07},
    {8, "fused attention: naive, tiled, split-KV", kv_demo_ch08},
    {9, "eviction and sparse attention: who forgets the needle", kv_demo_ch09},
    {10, "speculative decoding: the cache writes every draft, rolls back the rejected", kv_demo_ch10},
    {11, "multi-head latent attention: one latent row per token", kv_demo_ch11},
};
static const int n_demos = (int)(sizeof demos / sizeof demos[0]);

/* --csv-dir: the demo's CSV, written to @p tmp, split into one file per table of @p dir named
 * by the chapter ("ch05-2-policy.csv"; csv.h: kv_csv_split). */
static int split_chapter(FILE *tmp, int chapter, const char *dir, kv_err *err)
{
    const long n = ftell(tmp);
    if (n < 0 || fseek(tmp, 0, SEEK_SET) != 0) return kv_fail(err, KV_ERR_IO, "the temporary file");
    char *text = malloc((size_t)n + 1);
    if (!text) return kv_fail(err, KV_ERR_NOMEM, "%ld bytes of CSV", n);
    int st = KV_OK;
    if (fread(text, 1, (size_t)n, tmp) != (size_t)n) {
        st = kv_fail(err, KV_ERR_IO, "reading the temporary file back");
    } else {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "ch%02d", chapter);
        text[n] = '\0';
        st = kv_csv_split(text, (size_t)n, dir, prefix, stdout, err);
    }
    free(text);
    return st;
}

int cmd_tour(int argc, char **argv)
{
    const char *cmd = "kvlab tour";
    int chapter = 0, csv = 0, quick = 0;
    const char *device = "cpu", *csv_dir = NULL;
    kv_opt opts[] = {
        {"--chapter", KV_OPT_INT, &chapter, 1, 99, NULL, "N", "run only chapter N's demo", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "the rows as CSV, to FILE in place of the table (- : standard output)", 0},
        {"--csv-dir", KV_OPT_STRING, &csv_dir, 0, 0, NULL, "DIR",
         "write the same CSV as one file per table into the folder DIR (it must exist),"
         " named by chapter and table (ch05-2-policy.csv), each one header and its rows;"
         " prints the files' names", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "smaller sizes and one repeat: every demo's code paths in a fraction of the time (memcheck, the emulation build); the numbers are not the chapters'", 0},
    };
    char about[1024];
    int used = snprintf(about, sizeof about,
                        "Run the chapter demos on the embedded default models and print what they\n"
                        "measured (times in seconds). Progress goes to stderr. Chapters:");
    for (int i = 0; i < n_demos && used < (int)sizeof about; i++)
        used += snprintf(about + used, sizeof about - used, "\n  %02d  %s", demos[i].chapter,
                         demos[i].title);
    int r = kv_args_parse(cmd, about, argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;

    int found = chapter == 0;
    for (int i = 0; i < n_demos; i++) found |= demos[i].chapter == chapter;
    if (!found)
        return kv_args_bad(cmd, "--chapter", "no demo for chapter %d yet (chapters 01..%02d have one)",
                           chapter, demos[n_demos - 1].chapter);
    struct stat sb;
    if (csv_dir && (stat(csv_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return kv_args_bad(cmd, "--csv-dir", "%s is not a folder (create it first)", csv_dir);
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;

    kv_demo_ctx ctx = {stdout, csv || csv_dir, device, quick};
    for (int i = 0; i < n_demos; i++) {
        if (chapter && demos[i].chapter != chapter) continue;
        kv_err err = {{0}};
        if (csv_dir && !(ctx.out = tmpfile())) {
            fprintf(stderr, "%s: no temporary file for chapter %02d's CSV\n", cmd,
                    demos[i].chapter);
            return KV_EXIT_FAIL;
        }
        if (csv_dir)
            ; /* the files are named by chapter: no comment line */
        else if (!csv)
            printf("== chapter %02d: %s (device %s%s) ==\n\n", demos[i].chapter, demos[i].title,
                   device, quick ? ", quick sizes" : "");
        else
            printf("# chapter %02d: %s (device %s%s)\n", demos[i].chapter, demos[i].title, device,
                   quick ? ", quick sizes" : "");
        int st = demos[i].run(&ctx, &err);
        if (csv_dir) {
            const int split =
                st == KV_OK ? split_chapter(ctx.out, demos[i].chapter, csv_dir, &err) : KV_OK;
            fclose(ctx.out);
            if (split != KV_OK) {
                fprintf(stderr, "%s: --csv-dir: %s %s\n", cmd, err.msg, kv_status_name(split));
                return KV_EXIT_FAIL;
            }
        }
        if (st != KV_OK) {
            /* the demo's inputs are fixed: any failure is the run's, not the user's.
             * A negative status is a check of the demo itself that did not hold. */
            fprintf(stderr, "%s: chapter %02d demo: %s%s%s\n", cmd, demos[i].chapter,
                    err.msg[0] ? err.msg : "failed", st > 0 ? " " : "",
                    st > 0 ? kv_status_name(st) : "");
            return KV_EXIT_FAIL;
        }
        if (!csv_dir) printf("\n");
    }
    return KV_EXIT_OK;
}
