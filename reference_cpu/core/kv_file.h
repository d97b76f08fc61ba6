/**
 * @file kv_file.h
 * Opening files for reading and replacing them, once for every reader and writer of kvlab.
 *
 * Readers (checkpoints, tokenizers, needle specs, dialogues, traces) open their path through
 * kv_file_open_read(): only a regular file is read (a FIFO with no writer would block forever,
 * a directory reads as nothing, /dev/zero never ends) and no file beyond the reader's cap.
 * Text readers use kv_file_read_text(), which also refuses a NUL byte; kv_text_check_lines()
 * refuses CR-only line endings (LF and CRLF are the two accepted), for the parsers.
 *
 * Writers (checkpoints, tokenizers, serve's CSV files, needle's outputs) go through
 * kv_file_create() + kv_file_commit(): the bytes go to a temporary file beside the target
 * (".kvtmp.XXXXXX" in its folder), renamed over it only once all of it is written, so a failed
 * run leaves the old file (or no file) and never removes a path it did not create; a target
 * that exists and is not a regular file (a device node, a FIFO, a symbolic link, a directory)
 * is refused, never replaced. A replaced file keeps its mode and, where permitted, its owner.
 */
#ifndef KV_FILE_H
#define KV_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Caps of the text readers (bytes). */
#define KV_NEEDLE_MAX_BYTES (64 << 10)
#define KV_DIALOGUE_MAX_BYTES (1 << 20)
#define KV_TRACE_MAX_BYTES (64 << 20)

/**
 * Open @p path for reading ("rb"): KV_ERR_IO when it cannot be opened, is a directory, or is
 * not a regular file; KV_ERR_FORMAT when larger than @p max_bytes (0: no cap). Never blocks on
 * a FIFO. On success *f is the open file and *size (may be NULL) its size in bytes.
 */
int kv_file_open_read(const char *path, int64_t max_bytes, FILE **f, int64_t *size, kv_err *err);

/**
 * Read all of the text file @p path (kv_file_open_read with @p max_bytes) into *text, a malloc'd
 * NUL-terminated string of *n bytes (n may be NULL); KV_ERR_FORMAT when it holds a NUL byte.
 */
int kv_file_read_text(const char *path, int64_t max_bytes, char **text, size_t *n, kv_err *err);

/** KV_ERR_FORMAT ("line N ends in a bare CR ...") when @p text has a CR not followed by LF. */
int kv_text_check_lines(const char *text, kv_err *err);

/** How the name of a temporary file starts, in the target's folder (6 random characters follow). */
#define KV_FILE_TMP_PREFIX ".kvtmp."

/** A file being written: fwrite to @c f, then kv_file_commit or kv_file_abort. */
typedef struct {
    FILE *f;
    char *path; /* the target (a copy) */
    char *tmp;  /* the temporary file beside it */
} kv_file_out;

/** KV_OK when @p path may be replaced: it does not exist or is a regular file (KV_ERR_IO for
 * a directory, device, FIFO, socket or symbolic link), so a command can refuse before work. */
int kv_file_check_target(const char *path, kv_err *err);
/**
 * Start replacing @p path: refuses (KV_ERR_IO) a target that exists and is not a regular file,
 * and a temporary file that cannot be created beside it.
 */
int kv_file_create(const char *path, kv_file_out *o, kv_err *err);
/** Flush and close, then rename the temporary file over the target; on failure it is removed
 * and the target left as it was. Either way @p o is released. */
int kv_file_commit(kv_file_out *o, kv_err *err);
/** Close and remove the temporary file; the target is untouched (a no-op on a zeroed @p o). */
void kv_file_abort(kv_file_out *o);

#ifdef __cplusplus
}
#endif
#endif
