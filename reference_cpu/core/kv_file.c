/* Opening files for reading and replacing them (kv_file.h): the regular-file check, the size
 * caps and the write-beside-then-rename every reader and writer of kvlab shares. */
#include "kv_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "64 KiB", "1 MiB": a cap as the messages name it */
static const char *cap_name(int64_t bytes, char *buf, size_t n)
{
    if (bytes % (1 << 20) == 0) snprintf(buf, n, "%lld MiB", (long long)(bytes >> 20));
    else if (bytes % 1024 == 0) snprintf(buf, n, "%lld KiB", (long long)(bytes >> 10));
    else snprintf(buf, n, "%lld-byte", (long long)bytes);
    return buf;
}

/* What @p st is when it is not a regular file ("a directory", "a FIFO"); NULL when it is. */
static const char *not_regular(const struct stat *st)
{
    if (S_ISREG(st->st_mode)) return NULL;
    if (S_ISDIR(st->st_mode)) return "a directory";
    if (S_ISLNK(st->st_mode)) return "a symbolic link";
    if (S_ISFIFO(st->st_mode)) return "a FIFO";
    if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) return "a device";
    return "a socket";
}

int kv_file_open_read(const char *path, int64_t max_bytes, FILE **f, int64_t *size, kv_err *err)
{
    *f = NULL;
    if (!path) return kv_fail(err, KV_ERR_ARG, "file path is NULL");
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise wait here forever; the flag
     * is cleared again before any read */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return kv_fail(err, KV_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kv_fail(err, KV_ERR_IO, "cannot read '%s': %s", path, strerror(e));
    }
    const char *what = not_regular(&st);
    if (what) {
        close(fd);
        if (S_ISDIR(st.st_mode)) /* the words of strerror(EISDIR), which readers said before */
            return kv_fail(err, KV_ERR_IO, "cannot read '%s': Is a directory", path);
        return kv_fail(err, KV_ERR_IO, "cannot read '%s': it is %s, not a regular file", path,
                       what);
    }
    if (max_bytes > 0 && (int64_t)st.st_size > max_bytes) {
        close(fd);
        char cap[32];
        return kv_fail(err, KV_ERR_FORMAT, "'%s' is larger than the %s cap (%lld bytes)", path,
                       cap_name(max_bytes, cap, sizeof cap), (long long)st.st_size);
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(*f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return kv_fail(err, KV_ERR_IO, "cannot open '%s': %s", path, strerror(e));
    }
    if (size) *size = (int64_t)st.st_size;
    return KV_OK;
}

int kv_file_read_text(const char *path, int64_t max_bytes, char **text, size_t *n, kv_err *err)
{
    *text = NULL;
    FILE *f;
    int64_t size = 0;
    int rc = kv_file_open_read(path, max_bytes, &f, &size, err);
    if (rc) return rc;
    /* read one byte past the size stat gave: a file that grew since is still caught */
    char *buf = malloc((size_t)size + 2);
    if (!buf) {
        fclose(f);
        return kv_fail(err, KV_ERR_NOMEM, "no memory to read '%s' (%lld bytes)", path,
                       (long long)size);
    }
    size_t got = fread(buf, 1, (size_t)size + 1, f);
    const int bad = ferror(f);
    fclose(f);
    if (bad || got > (size_t)size) {
        free(buf);
        return kv_fail(err, bad ? KV_ERR_IO : KV_ERR_FORMAT, "'%s' %s while it was read", path,
                       bad ? "could not be read" : "grew");
    }
    buf[got] = '\0';
    const char *nul = memchr(buf, '\0', got);
    if (nul) {
        int line = 1;
        for (const char *p = buf; p < nul; p++) line += *p == '\n';
        free(buf);
        return kv_fail(err, KV_ERR_FORMAT, "'%s' line %d: contains a NUL byte (a text file "
                       "holds none)", path, line);
    }
    *text = buf;
    if (n) *n = got;
    return KV_OK;
}

int kv_text_check_lines(const char *text, kv_err *err)
{
    int line = 1;
    for (const char *p = text; *p; p++) {
        if (*p == '\r' && p[1] != '\n')
            return kv_fail(err, KV_ERR_FORMAT, "line %d ends in a bare CR (old Mac line "
                           "endings): lines end in LF or CRLF", line);
        line += *p == '\n';
    }
    return KV_OK;
}

int kv_file_check_target(const char *path, kv_err *err)
{
    if (!path || !*path) return kv_fail(err, KV_ERR_ARG, "output path is empty");
    struct stat st;
    const char *what = lstat(path, &st) == 0 ? not_regular(&st) : NULL;
    if (what && S_ISDIR(st.st_mode)) /* strerror(EISDIR)'s words, as rename(2) would say */
        return kv_fail(err, KV_ERR_IO, "cannot rename a file onto '%s': Is a directory", path);
    if (what)
        return kv_fail(err, KV_ERR_IO, "will not replace '%s': it is %s, not a regular file",
                       path, what);
    return KV_OK;
}

/* A fresh temporary file in the folder of @p path: "<dir>/.kvtmp.XXXXXX", a name whose length
 * does not depend on the target's (a legal 255-byte name plus a suffix would not be), opened
 * O_EXCL so nothing that already has the name is written through. @p mode as open(2) takes it. */
static int open_temp(const char *path, char *tmp, size_t n, mode_t mode)
{
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (int)(slash - path) + 1 : 0; /* with its '/' */
    unsigned long long x = (unsigned long long)getpid() * 0x9E3779B97F4A7C15ull ^
                           (unsigned long long)(uintptr_t)tmp ^ (unsigned long long)time(NULL);
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[7];
        for (int i = 0; i < 6; i++, x /= 36) suffix[i] = digits[x % 36];
        suffix[6] = '\0';
        x = x * 6364136223846793005ull + 1442695040888963407ull + (unsigned)attempt;
        snprintf(tmp, n, "%.*s" KV_FILE_TMP_PREFIX "%s", dir_len, path, suffix);
        const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1; /* errno EEXIST */
}

int kv_file_create(const char *path, kv_file_out *o, kv_err *err)
{
    memset(o, 0, sizeof *o);
    int rc = kv_file_check_target(path, err);
    if (rc) return rc;
    const size_t tn = strlen(path) + 32;
    o->path = strdup(path);
    o->tmp = malloc(tn);
    if (!o->path || !o->tmp) {
        kv_file_abort(o);
        return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    }
    /* Replacing a file keeps its mode and (where permitted) its owner: a 0600 file stays
     * 0600. The temporary is created 0600 then, so it is never more open than the old file
     * while the bytes arrive; a new file gets 0666 less the umask, as open(2) would give. */
    struct stat old;
    const int replacing = stat(path, &old) == 0;
    int fd = open_temp(path, o->tmp, tn, replacing ? 0600 : 0666);
    if (fd >= 0 && replacing) {
        /* best effort: only root may give a file away; the mode below is what matters */
        if (fchown(fd, old.st_uid, old.st_gid) != 0) errno = 0;
        if (fchmod(fd, old.st_mode & 07777) != 0) {
            const int e = errno;
            close(fd);
            unlink(o->tmp);
            errno = e;
            fd = -1;
        }
    }
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(o->tmp);
        }
        free(o->tmp);
        o->tmp = NULL; /* not ours: kv_file_abort must not remove it */
        kv_file_abort(o);
        return kv_fail(err, KV_ERR_IO, "cannot open '%s' for writing: %s", path, strerror(e));
    }
    return KV_OK;
}

int kv_file_commit(kv_file_out *o, kv_err *err)
{
    int rc = KV_OK;
    const int failed = ferror(o->f);
    int e = errno;
    const int closed = fclose(o->f) == 0; /* buffered data is written (and can fail) here */
    if (!closed) e = errno;
    o->f = NULL;
    if (failed || !closed) {
        rc = kv_fail(err, KV_ERR_IO, "writing '%s' failed: %s", o->path, strerror(e));
    } else if (!(rc = kv_file_check_target(o->path, err))) { /* again: it may be new */
        if (rename(o->tmp, o->path) != 0)
            rc = kv_fail(err, KV_ERR_IO, "cannot rename '%s' to '%s': %s", o->tmp, o->path,
                         strerror(errno));
        else {
            free(o->tmp);
            o->tmp = NULL; /* renamed: nothing left to remove */
        }
    }
    kv_file_abort(o);
    return rc;
}

void kv_file_abort(kv_file_out *o)
{
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
}
