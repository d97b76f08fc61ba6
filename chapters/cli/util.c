/* Exit codes, byte formatting, progress lines and the cache layout options (cli.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int kv_cli_exit_code(int status)
{
    switch (status) {
    case KV_OK: return KV_EXIT_OK;
    case KV_ERR_ARG:
    case KV_ERR_IO:
    case KV_ERR_FORMAT:
    case KV_ERR_UNSUPPORTED: return KV_EXIT_USAGE; /* the input was wrong, not the run */
    default: return KV_EXIT_FAIL;
    }
}

int kv_cli_fail(const char *cmd, const char *what, int status, const kv_err *err)
{
    fprintf(stderr, "%s: %s: %s (%s)\n", cmd, what, err && err->msg[0] ? err->msg : "failed",
            kv_status_name(status));
    return kv_cli_exit_code(status);
}

int kv_cli_threads(const char *cmd, int n)
{
    if (n <= 0) return 0;
    const int cpus = omp_get_num_procs();
    if (n > cpus) /* more threads than CPUs only take turns, and far more crash libgomp */
        return kv_args_bad(cmd, "--threads", "%d is more than the %d CPUs of this machine", n,
                           cpus);
    omp_set_num_threads(n);
    return 0;
}

const char *kv_fmt_bytes(double bytes, char *buf, size_t n)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double v = bytes;
    while (fabs(v) >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.4g %s", v, unit[u]);
    return buf;
}

void kv_progress_start(kv_progress *p, const char *label)
{
    p->label = label;
    p->t0 = p->last = kv_now();
    p->shown = 0;
}

void kv_progress_update(kv_progress *p, long done, long total)
{
    /* a terminal gets one line rewritten in place; a file or pipe a new line every 5 s */
    const int tty = isatty(STDERR_FILENO);
    double now = kv_now();
    if (now - p->t0 < 1.0 || now - p->last < (tty ? 0.1 : 5.0)) return;
    p->last = now;
    p->shown = 1;
    fprintf(stderr, tty ? "\r  %s: %ld/%ld (%.1f s)   " : "  %s: %ld/%ld (%.1f s)\n", p->label,
            done, total, now - p->t0);
    fflush(stderr);
}

void kv_progress_end(kv_progress *p)
{
    if (p->shown)
        fprintf(stderr, "%s  %s: done in %.1f s          \n", isatty(STDERR_FILENO) ? "\r" : "",
                p->label, kv_now() - p->t0);
    p->shown = 0;
}

/* ---- --layout / --block-size / --blocks (chapter 05) ------------------------------------ */

const char *const kv_cli_layouts[] = {"contiguous", "paged", NULL};

int kv_cli_layout_check(const char *cmd, const kv_cli_layout *lo)
{
    const int paged = lo->layout && !strcmp(lo->layout, "paged");
    if (!paged && lo->block_size)
        return kv_args_bad(cmd, "--block-size", "needs --layout paged");
    if (!paged && lo->n_blocks) return kv_args_bad(cmd, "--blocks", "needs --layout paged");
    return 0;
}

void kv_cli_layout_apply(const kv_cli_layout *lo, kv_cache_spec *spec)
{
    if (!lo->layout || strcmp(lo->layout, "paged")) return;
    const int B = lo->block_size ? lo->block_size : kvq_is_kivi(spec->quant.dtype) ? KV_KIVI_GROUP : 16;
    spec->layout.kind = KV_LAYOUT_PAGED;
    spec->layout.block_size = B;
    /* the default pool reserves as much as the contiguous cache: no step can run out */
    spec->layout.n_blocks = lo->n_blocks ? lo->n_blocks
                                  : spec->n_slots * ((spec->capacity + B - 1) / B);
}

const char *kv_cli_layout_name(const kv_cache_spec *spec, char *buf, size_t n)
{
    if (spec->layout.kind != KV_LAYOUT_PAGED) snprintf(buf, n, "contiguous");
    else
        snprintf(buf, n, "paged, blocks of %d tokens, %d blocks", spec->layout.block_size,
                 spec->layout.n_blocks);
    return buf;
}
