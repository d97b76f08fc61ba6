/**
 * @file measure.h
 * Timing generation runs for the tour and the benchmarks: per-step wall times of repeated
 * runs, the work each step did (kv_counters, from shapes) and medians over the repeats.
 */
#ifndef KV_CLI_MEASURE_H
#define KV_CLI_MEASURE_H

#include "cli.h"
#include "kv_generate.h"

typedef struct {
    int mode;           /* ::kv_gen_mode */
    int n_steps, repeats;
    int *tokens;        /* [n_steps]            tokens chosen by the first repeat */
    double *seconds;    /* [repeats][n_steps]   wall time of each step (forward + choice) */
    double *total;      /* [repeats]            wall time of each whole run */
    kv_counters *work;  /* [n_steps]            work of each step (same in every repeat) */
    kv_counters sum;    /*                      work of one whole run */
    int repeats_differ; /* 1 if a repeat chose other tokens than the first (never expected) */
    int done;           /* repeats completed */
} kv_run_log;

int kv_run_log_init(kv_run_log *r, int mode, int n_steps, int repeats, kv_err *err);
void kv_run_log_free(kv_run_log *r);

/**
 * One greedy run of kv_generate() on @p b, recorded as repeat number r->done.
 * @p progress (may be NULL) is advanced by one per step, out of @p progress_total.
 */
int kv_run_once(kv_run_log *r, kv_backend *b, const int *prompt, int n_prompt,
                kv_progress *progress, long progress_base, long progress_total, kv_err *err);

/** Median over the completed repeats of step @p step's time. */
double kv_run_step_median(const kv_run_log *r, int step);
/** Median over the completed repeats of the whole run's time. */
double kv_run_total_median(const kv_run_log *r);
/** Median of @p n values (the array is sorted in place). */
double kv_median(double *v, int n);

/** The fixed prompt of the demos and benchmarks: BOS then deterministic ids < vocab. */
void kv_demo_prompt(int *tokens, int n, int vocab);

#endif
