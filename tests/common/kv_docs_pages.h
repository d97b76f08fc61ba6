/* The documentation's pages, for the docs tests that read every one (test_docs_tables_numbers.c). */
#ifndef KV_DOCS_PAGES_H
#define KV_DOCS_PAGES_H

#include <glob.h>
#include <stdio.h>

/* The pages under @p root/docs (*.md) into @p pages: glob()'s status, 0 when there are some
 * (globfree() them then). */
static inline int kv_docs_pages(const char *root, glob_t *pages)
{
    char pattern[4096];
    snprintf(pattern, sizeof pattern, "%s/docs/*.md", root);
    return glob(pattern, 0, NULL, pages);
}

#endif
