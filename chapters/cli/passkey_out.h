/*
 * What kvlab passkey prints and writes (passkey_out.c): a table per cache variant (found /
 * asked per depth and length), a summary with a row per variant, the CSV (a row per prompt)
 * and the SVG heatmap (a panel per length, a row per variant, a column per depth).
 */
#ifndef KV_CLI_PASSKEY_OUT_H
#define KV_CLI_PASSKEY_OUT_H

#include <stdio.h>

#include "cache_sets.h"
#include "kv_passkey.h"

/** One prompt of the grid. */
typedef struct {
    int length, depth_pct;
    kv_passkey_result r;
} pk_cell;

/** The whole run: cells [n_var][n_len][n_dep][keys]. */
typedef struct {
    const char *model, *haystack;
    const int *lengths;
    int n_len;
    const int *depths;
    int n_dep, keys;
    const char (*specs)[KV_CLI_SPEC_MAX]; /* [n_var] */
    int n_var;
    const pk_cell *cells;
} pk_grid;

/** Variant @p v's table: found / asked per (depth, length), each length's total, the sum. */
void pk_print_grid(FILE *f, const pk_grid *g, int v);
/** A row per variant: found / asked per length and in all, and the change against row 0. */
void pk_print_summary(FILE *f, const pk_grid *g);
void pk_write_csv(FILE *f, const pk_grid *g);
void pk_write_svg(FILE *f, const pk_grid *g);

/** Write @p path with @p fn through kv_file_create() (renamed over it once complete): 0, or 1
 * after a message naming @p opt. */
int pk_write_file(const char *cmd, const char *opt, const char *path,
                  void (*fn)(FILE *, const pk_grid *), const pk_grid *g);

#endif
