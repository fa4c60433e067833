/* Whole files (src/core/atomic_file.h): atomic replacement, temporary file + fsync + rename +
 * fsync of the directory, for every writer of whole files (checkpoints, token shards, model
 * files); and the readers'
 * checked open and exact pread. Calling thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "mpitrain/core.h"

mpt_status mpt__afile_open(mpt__afile *af, const char *path, const char *what) {
  memset(af, 0, sizeof *af);
  af->what = what ? what : "file";
  if (!path || !path[0]) return MPT_FAIL(MPT_EINVAL, "%s write: empty path", af->what);
  /* the rename would put a regular file in place of a device, FIFO or symbolic link's target
   * kind (as root, /dev/null itself): only a regular file, or nothing, is replaced */
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return MPT_FAIL(MPT_EINVAL, "%s write: '%s' exists and is not a regular file (%s): it is not "
                    "replaced", af->what, path, S_ISDIR(sb.st_mode) ? "a folder" : "a device, "
                    "FIFO or socket");
  size_t n = strlen(path) + 32;
  af->tmp = malloc(n);
  if (!af->tmp) return MPT_FAIL(MPT_ENOMEM, "%s write %s: out of host memory", af->what, path);
  snprintf(af->tmp, n, "%s.tmp.%ld", path, (long)getpid());
  af->f = fopen(af->tmp, "wbe");
  if (!af->f) {
    mpt_status st = MPT_FAIL(MPT_EIO, "%s write: cannot create %s: %s", af->what, af->tmp,
                             strerror(errno));
    free(af->tmp);
    af->tmp = NULL;
    return st;
  }
  af->path = path;
  return MPT_OK;
}

mpt_status mpt__afile_write(mpt__afile *af, const void *p, size_t n) {
  if (n == 0) return MPT_OK;
  if (!af->f) return MPT_FAIL(MPT_ESTATE, "%s write: the file is not open", af->what);
  if (fwrite(p, 1, n, af->f) != n)
    return MPT_FAIL(MPT_EIO, "%s write %s: write of %zu bytes at offset %llu failed: %s",
                    af->what, af->tmp, n, (unsigned long long)af->nbytes, strerror(errno));
  af->nbytes += n;
  return MPT_OK;
}

/* fsyncs the directory holding `path`; file systems that cannot (EINVAL, ENOTSUP) are fine. */
static mpt_status fsync_dir_of(const char *path, const char *what) {
  char *dir = strdup(path);
  if (!dir) return MPT_FAIL(MPT_ENOMEM, "%s write: out of host memory", what);
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  mpt_status st = MPT_OK;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP))
    st = MPT_FAIL(MPT_EIO, "%s %s: cannot fsync its directory %s: %s (the file was renamed "
                  "into place but may not be on disk)", what, path, dir, strerror(errno));
  if (fd >= 0) close(fd);
  free(dir);
  return st;
}

mpt_status mpt__afile_close(mpt__afile *af) {
  if (!af->f) return MPT_FAIL(MPT_ESTATE, "%s write: the file is not open", af->what);
  mpt_status st = MPT_OK;
  if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) {
    st = MPT_FAIL(MPT_EIO, "%s write: cannot flush %s to disk: %s", af->what, af->tmp,
                  strerror(errno));
    goto fail;
  }
  int rc = fclose(af->f);
  af->f = NULL;
  if (rc != 0) {
    st = MPT_FAIL(MPT_EIO, "%s write: cannot close %s: %s", af->what, af->tmp, strerror(errno));
    goto fail;
  }
  return MPT_OK;

fail:
  mpt__afile_abort(af);
  return st;
}

mpt_status mpt__afile_rename(mpt__afile *af) {
  if (af->f || !af->tmp)
    return MPT_FAIL(MPT_ESTATE, "%s write: the file is %s", af->what,
                    af->f ? "still open" : "not written");
  if (rename(af->tmp, af->path) != 0) {
    mpt_status st = MPT_FAIL(MPT_EIO, "%s write: cannot rename %s to %s: %s", af->what, af->tmp,
                             af->path, strerror(errno));
    mpt__afile_abort(af);
    return st;
  }
  free(af->tmp);
  af->tmp = NULL;
  return fsync_dir_of(af->path, af->what);
}

mpt_status mpt__afile_commit(mpt__afile *af) {
  MPT_RETURN_IF(mpt__afile_close(af));
  return mpt__afile_rename(af);
}

void mpt__afile_abort(mpt__afile *af) {
  if (!af) return;
  if (af->f) fclose(af->f);
  af->f = NULL;
  if (af->tmp) unlink(af->tmp);
  free(af->tmp);
  af->tmp = NULL;
}

mpt_status mpt__file_open_regular(const char *path, const char *what, int *fd_out,
                                  int64_t *nbytes) {
  *fd_out = -1;
  *nbytes = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return MPT_FAIL(MPT_ENOENT, "%s '%s' does not exist", what, path);
    return MPT_FAIL(MPT_EIO, "cannot open %s '%s': %s", what, path, strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return MPT_FAIL(MPT_EIO, "%s '%s' is not a regular file", what, path);
  }
  *fd_out = fd;
  *nbytes = (int64_t)sb.st_size;
  return MPT_OK;
}

mpt_status mpt__file_pread(int fd, const char *what, const char *path, void *buf, int64_t nbytes,
                           int64_t offset) {
  unsigned char *b = buf;
  int64_t got = 0;
  while (got < nbytes) {
    ssize_t n = pread(fd, b + got, (size_t)(nbytes - got), (off_t)(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return MPT_FAIL(MPT_EIO, "%s '%s': read of %lld bytes at byte offset %lld failed: %s", what,
                      path, (long long)(nbytes - got), (long long)(offset + got),
                      strerror(errno));
    if (n == 0)
      return MPT_FAIL(MPT_EIO, "%s '%s': the file ended at byte offset %lld, expected %lld more "
                      "bytes (did it shrink while being read?)", what, path,
                      (long long)(offset + got), (long long)(nbytes - got));
    got += n;
  }
  return MPT_OK;
}
