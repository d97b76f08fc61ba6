/**
 * @file csv.h
 * The one CSV writer of kvlab: every --csv row, header and file goes through it, so that no
 * value a user chooses (a cache spec such as int8/l0,1, a file named a,b.txt) can move the
 * columns of a row.
 *
 * kv_csv_printf() is printf with one difference: the format's literal commas and newlines are
 * the separators, and the text between two separators is one field, quoted as RFC 4180 asks
 * (inside double quotes, each of its quotes doubled) when it holds a comma, a double quote, a
 * CR or an LF. A row may be written in several calls, each ending on a separator.
 */
#ifndef KV_CLI_CSV_H
#define KV_CLI_CSV_H

#include <stdio.h>

#if defined(__GNUC__)
#define KV_CSV_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KV_CSV_PRINTF(f, a)
#endif

/** printf's conversions (flags, width, precision, hh h l ll z j t L; d i u o x X c s f F e E
 * g G a A p %), each field quoted when it must be; returns the bytes written, or -1. */
int kv_csv_printf(FILE *f, const char *fmt, ...) KV_CSV_PRINTF(2, 3);

/** A row of a command that prints a table or CSV: kv_csv_printf() when @p csv, else fprintf. */
int kv_table_printf(FILE *f, int csv, const char *fmt, ...) KV_CSV_PRINTF(3, 4);

#endif
