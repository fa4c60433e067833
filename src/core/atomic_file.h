/* Whole files: atomic replacement for the writers, and the checked open and exact pread the
 * readers share. Atomic replacement (checkpoints, token shards, model files): the bytes go to
 * "<path>.tmp.<pid>", which is flushed, fsynced and closed, then renamed over `path`, and the
 * directory is fsynced; so `path` always holds either its old content or the complete new one,
 * never a partial file. Internal (mpt__), used from the calling thread only.
 *
 *   mpt__afile af;
 *   MPT_CHECK(mpt__afile_open(&af, path, "token shard"), out);
 *   MPT_CHECK(mpt__afile_write(&af, bytes, n), out);   // any number of times
 *   MPT_CHECK(mpt__afile_commit(&af), out);
 * out:
 *   mpt__afile_abort(&af);                             // no-op after a commit
 */
#ifndef MPT_CORE_ATOMIC_FILE_H
#define MPT_CORE_ATOMIC_FILE_H

#include <stdio.h>

#include "mpitrain/core.h"

typedef struct mpt__afile {
  FILE *f;
  char *tmp;          /* the temporary file's path, owned */
  const char *path;   /* the final path, borrowed */
  const char *what;   /* "token shard", for messages, borrowed */
  uint64_t nbytes;    /* written so far */
} mpt__afile;

/* Creates the temporary file. On error *af is left so that mpt__afile_abort is a no-op.
 * Errors: MPT_EINVAL empty path; MPT_EIO (names the file and errno's text); MPT_ENOMEM. */
mpt_status mpt__afile_open(mpt__afile *af, const char *path, const char *what);
/* Appends n bytes. Errors: MPT_EIO naming the temporary file and the offset. */
mpt_status mpt__afile_write(mpt__afile *af, const void *p, size_t n);
/* Flushes, fsyncs, closes and renames into place, then fsyncs the directory.
 * Errors: MPT_EIO naming the step that failed (the temporary file is removed). */
mpt_status mpt__afile_commit(mpt__afile *af);
/* The two halves of mpt__afile_commit, for a writer that acts between them (the checkpoint
 * writer's kill point and injected rename failure): _close flushes, fsyncs and closes the
 * temporary file; _rename renames it into place, then fsyncs the directory. On error each
 * removes the temporary file (as mpt__afile_abort). Errors: MPT_EIO naming the step;
 * MPT_ESTATE out of order. */
mpt_status mpt__afile_close(mpt__afile *af);
mpt_status mpt__afile_rename(mpt__afile *af);
/* Closes and removes the temporary file if it is still there; frees what open allocated. */
void mpt__afile_abort(mpt__afile *af);

/* The readers' side (token shards, llm.c model files): opens `path` for reading (O_NONBLOCK, so
 * a FIFO cannot block the open) and checks it is a regular file; *fd (-1 on error) and *nbytes
 * receive the descriptor and the size. Errors: MPT_ENOENT "<what> '<path>' does not exist";
 * MPT_EIO (cannot open, not a regular file). */
mpt_status mpt__file_open_regular(const char *path, const char *what, int *fd, int64_t *nbytes);
/* Reads exactly nbytes at `offset` (64-bit; retried on EINTR and short reads). Errors: MPT_EIO
 * naming <what>, the path and the offset (a failed read, or the file ended early). */
mpt_status mpt__file_pread(int fd, const char *what, const char *path, void *buf, int64_t nbytes,
                           int64_t offset);

#endif
