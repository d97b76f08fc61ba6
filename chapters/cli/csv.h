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

#include <stddef.h>
#include <stdio.h>

#include "kv_common.h"

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

/**
 * Split @p text (@p n bytes, then a NUL), one chapter's CSV stream of one or more tables, into
 * one file per table in the folder @p dir: "<prefix>-<T>-<name>.csv", T counting the tables
 * from 1 and name the header's first column other than "part" and "chapter" (the columns that
 * carry a part's number, not what the table holds), lowercased. A table starts at a header, a
 * row whose fields are all names (a letter or '_', then letters, digits, '_'), when no table is
 * open or the open one has rows; a '#' comment line or a blank line ends it. Each file is one
 * header, then the table's rows, byte for byte as in @p text, written through kv_file_create()
 * and kv_file_commit() (a file of that name is replaced, no other touched). One line per file
 * written goes to @p log (NULL: none). KV_ERR_FORMAT when a row comes before any header or a
 * quoted field never ends, KV_ERR_IO when a file cannot be written.
 */
int kv_csv_split(const char *text, size_t n, const char *dir, const char *prefix, FILE *log,
                 kv_err *err);

/** The end of the record that starts at @p p (just past its LF, or @p end): a quoted field
 * may hold a newline, so quotes are followed. NULL when a quote never closes. */
const char *kv_csv_record_end(const char *p, const char *end);
/** 1 when the record [p, e) is a header: every field a name, none quoted, none empty. */
int kv_csv_is_header(const char *p, const char *e);

/**
 * The same stream of tables as JSON, for --json (json_out.c): a JSON array with one object per
 * table, {"columns": [...], "rows": [{column: value, ...}, ...]}, each value a JSON number when
 * the field is one as JSON writes numbers, null when empty, else a string. '#' comment lines
 * and blank lines are not rows. KV_ERR_FORMAT as kv_csv_split().
 */
int kv_csv_to_json(FILE *f, const char *text, size_t n, kv_err *err);

#endif
