/*
 * Growth exponents of the chapter 01/02 cost curves (kvlab bench decode): how a step's work
 * and time grow with the context length n, as the slope k of a least-squares line through
 * (log n, log cost), cost ~ n^k.
 *
 * Step i of a run (i >= 1) chooses token i after a prefix of n = prompt + i tokens:
 *   naive:  runs all n tokens       proj FLOPs ~ n (plus the fixed classifier), attention ~ n^2
 *   cached: runs one token at n-1   proj FLOPs ~ n^0,                            attention ~ n
 * Time follows whichever term dominates at these sizes, so its exponent lies in between. The
 * cost of a whole run of n tokens is the sum of its steps: one more power of n.
 */
#include <math.h>
#include <stdlib.h>

#include "bench_cmds.h"

/* Slope of log y on log x over the points with x, y > 0; NAN with fewer than 2. */
static double loglog_slope(const double *x, const double *y, int n)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!(x[i] > 0) || !(y[i] > 0)) continue;
        const double lx = log(x[i]), ly = log(y[i]);
        sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, m++;
    }
    const double den = m * sxx - sx * sx;
    return m < 2 || den == 0 ? NAN : (m * sxy - sx * sy) / den;
}

void kv_print_growth_exponents(FILE *f, const kv_run_log runs[2], int n_prompt)
{
    const int steps = runs[0].n_steps;
    if (steps < 3) {
        fprintf(f, "\ngrowth exponents: need at least 3 steps\n");
        return;
    }
    double *x = calloc((size_t)steps * 4, sizeof(double)); /* [4][steps]: n, proj, attn, time */
    if (!x) return;
    double *pr = x + steps, *at = x + 2 * steps, *tm = x + 3 * steps;
    fprintf(f, "\ngrowth exponents: per-step cost ~ n^k, k fitted on log-log over the steps with\n"
               "context n = %d..%d (step 0, the prefill, left out); a whole run costs n^(k+1)\n",
            n_prompt + 1, n_prompt + steps - 1);
    fprintf(f, "%-8s %10s %10s %10s   %s\n", "mode", "proj FLOP", "attn FLOP", "time", "expected FLOP k (proj, attn)");
    for (int k = 0; k < 2; k++) {
        int m = 0;
        for (int i = 1; i < steps; i++, m++) {
            x[m] = n_prompt + i;
            pr[m] = runs[k].work[i].flops_proj;
            at[m] = runs[k].work[i].flops_attn;
            tm[m] = kv_run_step_median(&runs[k], i);
        }
        fprintf(f, "%-8s %10.2f %10.2f %10.2f   %s\n", k ? "cached" : "naive",
                loglog_slope(x, pr, m), loglog_slope(x, at, m), loglog_slope(x, tm, m),
                k ? "0 and 1" : "1 (less: the fixed classifier) and 2");
    }
    free(x);
}
