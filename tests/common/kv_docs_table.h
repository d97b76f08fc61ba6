/* What the two table tests share (test_docs_tables.c: pass-key and dialogue cells against
 * their CSVs; test_docs_tables_numbers.c: measured numbers against theirs): a Markdown table's
 * cell, and the count of mismatches a table leaves, printed unless quiet (each test's
 * self-check writes tables wrong on purpose and only counts). */
#ifndef KV_DOCS_TABLE_H
#define KV_DOCS_TABLE_H

#include <stdio.h>
#include <string.h>

static int bad, quiet; /* mismatches of the table being checked; quiet: the self-check's */
#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            bad++;                                                                         \
            if (!quiet) printf("  "), printf(__VA_ARGS__), printf("\n");                   \
        }                                                                                  \
    } while (0)

/* cell k (0-based) of a table line "| a | b |" into out [cap], spaces trimmed; 0 when the
 * line (up to its newline) has no such cell */
static inline int kv_docs_table_cell(const char *line, int k, char *out, size_t cap)
{
    const char *nl = strchr(line, '\n'), *end = nl ? nl : line + strlen(line);
    const char *p = memchr(line, '|', (size_t)(end - line));
    for (int i = 0; p && i < k; i++) p = memchr(p + 1, '|', (size_t)(end - p - 1));
    const char *e = p ? memchr(p + 1, '|', (size_t)(end - p - 1)) : NULL;
    if (!e) return 0;
    for (p++; *p == ' '; p++) {}
    while (e > p && e[-1] == ' ') e--;
    snprintf(out, cap, "%.*s", (int)(e - p), p);
    return 1;
}

#endif
