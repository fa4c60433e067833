/* Directories of checkpoints and the data-parallel wrappers (include/mpitrain/ckpt.h):
 * mpt_ckpt_save_dir (write, then keep the last K), mpt_ckpt_find_latest, mpt_ckpt_resolve,
 * mpt_ckpt_save_collective (rank 0 writes; its status reaches every rank) and
 * mpt_ckpt_load_collective (every rank validates, the ranks agree, then every rank commits).
 *
 * Invariants: only names "ckpt-step" + decimal digits + ".mpt" are checkpoints; the file just
 * written is never deleted; every rank takes part in the same collectives in the same order
 * whatever happened locally (so a local failure never leaves another rank waiting: it is
 * reported through the collective instead). Runs on the calling thread. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"

#define NAME_PREFIX "ckpt-step"
#define NAME_SUFFIX ".mpt"
/* Bytes of rank 0's status and error detail broadcast by the collective save. */
#define STATUS_MSG_NBYTES 1024

/* "<dir>/ckpt-step%08lld.mpt" into buf[nbytes]. */
static mpt_status dir_path(const char *dir, int64_t step, char *buf, size_t nbytes) {
  size_t len = strlen(dir);
  const char *sep = (len > 0 && dir[len - 1] == '/') ? "" : "/";
  int n = snprintf(buf, nbytes, "%s%s" NAME_PREFIX "%08" PRId64 NAME_SUFFIX, dir, sep, step);
  if (n < 0 || (size_t)n >= nbytes || n >= PATH_MAX)
    return MPT_FAIL(MPT_EINVAL, "checkpoint path in %s for step %" PRId64 " does not fit in %zu "
                    "bytes", dir, step, nbytes < PATH_MAX ? nbytes : (size_t)PATH_MAX);
  return MPT_OK;
}

/* 1 and *step if `name` is a checkpoint's file name. */
static int parse_name(const char *name, int64_t *step) {
  const size_t np = sizeof NAME_PREFIX - 1;
  if (strncmp(name, NAME_PREFIX, np) != 0) return 0;
  const char *p = name + np;
  int64_t v = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9'; p++, digits++) {
    if (v > (INT64_MAX - 9) / 10) return 0;
    v = v * 10 + (*p - '0');
  }
  if (digits == 0 || strcmp(p, NAME_SUFFIX) != 0) return 0;
  *step = v;
  return 1;
}

typedef struct ckpt_file {
  int64_t step;
  char *name; /* owned */
} ckpt_file;

static void files_free(ckpt_file *files, int n) {
  for (int i = 0; i < n; i++) free(files[i].name);
  free(files);
}

/* Highest step first; equal steps by name, descending. */
static int file_cmp(const void *a, const void *b) {
  const ckpt_file *x = a, *y = b;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  return -strcmp(x->name, y->name);
}

/* The checkpoints in dir, sorted by file_cmp. */
static mpt_status scan(const char *dir, ckpt_file **files, int *n) {
  *files = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d)
    return MPT_FAIL(errno == ENOENT ? MPT_ENOENT : MPT_EIO, "checkpoint directory %s: %s", dir,
                    strerror(errno));
  mpt_status st = MPT_OK;
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t step;
    if (!parse_name(e->d_name, &step)) continue;
    if (*n == cap) {
      int ncap = cap ? 2 * cap : 16;
      ckpt_file *grown = realloc(*files, (size_t)ncap * sizeof *grown);
      if (!grown) goto nomem;
      *files = grown;
      cap = ncap;
    }
    char *copy = strdup(e->d_name);
    if (!copy) goto nomem;
    (*files)[*n].step = step;
    (*files)[(*n)++].name = copy;
  }
  closedir(d);
  if (*n > 1) qsort(*files, (size_t)*n, sizeof **files, file_cmp);
  return MPT_OK;
nomem:
  st = MPT_FAIL(MPT_ENOMEM, "checkpoint directory %s: out of host memory", dir);
  closedir(d);
  files_free(*files, *n);
  *files = NULL;
  *n = 0;
  return st;
}

/* mkdir -p. */
static mpt_status make_dirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return MPT_FAIL(MPT_ENOMEM, "checkpoint directory %s: out of host memory", dir);
  mpt_status st = MPT_OK;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
      st = MPT_FAIL(MPT_EIO, "cannot create checkpoint directory %s: %s", p, strerror(errno));
      break;
    }
    *s = c;
    if (c == '\0') break;
  }
  struct stat sb;
  if (st == MPT_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
    st = MPT_FAIL(MPT_EIO, "checkpoint directory %s is not a directory", dir);
  free(p);
  return st;
}

/* Deletes the checkpoints beyond the keep highest steps, except `keep_name`. */
static void prune(const char *dir, int keep, const char *keep_name, int64_t written_step) {
  ckpt_file *files;
  int n;
  if (scan(dir, &files, &n) != MPT_OK) {
    mpt_log(MPT_LOG_WARN, "checkpoint directory %s: cannot list it to keep the last %d: %s", dir,
            keep, mpt_last_error());
    return;
  }
  if (n > 0 && files[0].step > written_step)
    mpt_log(MPT_LOG_WARN, "checkpoint directory %s holds %s, of a later step than the one just "
            "written (%" PRId64 "): resuming from the directory would pick it", dir,
            files[0].name, written_step);
  size_t dlen = strlen(dir);
  for (int i = keep; i < n; i++) {
    if (strcmp(files[i].name, keep_name) == 0) continue;
    char *full = malloc(dlen + strlen(files[i].name) + 2);
    if (full) {
      sprintf(full, "%s/%s", dir, files[i].name);
      if (unlink(full) != 0 && errno != ENOENT)
        mpt_log(MPT_LOG_WARN, "cannot delete old checkpoint %s: %s", full, strerror(errno));
    }
    free(full);
  }
  files_free(files, n);
}

mpt_status mpt_ckpt_save_dir(const char *dir, int keep_last_k, mpt_model *model,
                             mpt_optimizer *optimizer, const mpt_ckpt_meta *meta,
                             char *path_out, size_t path_nbytes) {
  if (!dir || !dir[0] || !model)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save: NULL or empty directory, or NULL model");
  if (path_out && path_nbytes == 0)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save: path_out with 0 bytes");
  int64_t step = meta ? meta->global_step : 0;
  if (step < 0) return MPT_FAIL(MPT_EINVAL, "checkpoint save: global_step %" PRId64 " < 0", step);
  char path[PATH_MAX];
  MPT_RETURN_IF(dir_path(dir, step, path, path_out && path_nbytes < sizeof path ? path_nbytes
                                                                                : sizeof path));
  MPT_RETURN_IF(make_dirs(dir));
  MPT_RETURN_IF(mpt_ckpt_save(path, model, optimizer, meta));
  if (keep_last_k > 0) prune(dir, keep_last_k, strrchr(path, '/') + 1, step);
  if (path_out) snprintf(path_out, path_nbytes, "%s", path);
  return MPT_OK;
}

mpt_status mpt_ckpt_find_latest(const char *dir, char *buf, size_t nbytes) {
  if (!dir || !buf || nbytes == 0)
    return MPT_FAIL(MPT_EINVAL, "checkpoint find_latest: NULL directory or buffer");
  ckpt_file *files;
  int n;
  MPT_RETURN_IF(scan(dir, &files, &n));
  mpt_status st = MPT_OK;
  if (n == 0) {
    st = MPT_FAIL(MPT_ENOENT, "no checkpoint (" NAME_PREFIX "<step>" NAME_SUFFIX ") in %s", dir);
  } else {
    size_t len = strlen(dir);
    const char *sep = (len > 0 && dir[len - 1] == '/') ? "" : "/";
    int w = snprintf(buf, nbytes, "%s%s%s", dir, sep, files[0].name);
    if (w < 0 || (size_t)w >= nbytes)
      st = MPT_FAIL(MPT_EINVAL, "checkpoint path %s%s%s does not fit in %zu bytes", dir, sep,
                    files[0].name, nbytes);
  }
  files_free(files, n);
  return st;
}

mpt_status mpt_ckpt_resolve(const char *path, char *buf, size_t nbytes) {
  if (!path || !buf || nbytes == 0)
    return MPT_FAIL(MPT_EINVAL, "checkpoint resolve: NULL path or buffer");
  struct stat sb;
  if (stat(path, &sb) != 0)
    return MPT_FAIL(errno == ENOENT ? MPT_ENOENT : MPT_EIO, "resume from %s: %s", path,
                    strerror(errno));
  if (S_ISDIR(sb.st_mode)) return mpt_ckpt_find_latest(path, buf, nbytes);
  int w = snprintf(buf, nbytes, "%s", path);
  if (w < 0 || (size_t)w >= nbytes)
    return MPT_FAIL(MPT_EINVAL, "checkpoint path %s does not fit in %zu bytes", path, nbytes);
  return MPT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The background writer                                                                      */

struct mpt__ckpt_async {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;          /* under mu */
  mpt_status status; /* the write's, once done */
  char message[STATUS_MSG_NBYTES];
  char dir[PATH_MAX], path[PATH_MAX];
  int keep;
  int64_t step;
  uint8_t *bytes;
  size_t nbytes;
};

static void *async_main(void *arg) {
  mpt__ckpt_async *a = arg;
  mpt__ckpt_seal(a->bytes, a->nbytes);
  mpt_status st = make_dirs(a->dir);
  if (st == MPT_OK) st = mpt__ckpt_write_bytes(a->path, a->bytes, a->nbytes);
  if (st == MPT_OK && a->keep > 0) prune(a->dir, a->keep, strrchr(a->path, '/') + 1, a->step);
  free(a->bytes);
  a->bytes = NULL;
  pthread_mutex_lock(&a->mu);
  a->status = st;
  if (st != MPT_OK) snprintf(a->message, sizeof a->message, "%s", mpt_last_error());
  a->done = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

mpt_status mpt__ckpt_async_start(mpt__ckpt_async **out, const char *dir, int keep_last_k,
                                 int64_t step, uint8_t *bytes, size_t nbytes) {
  if (!out || !dir || !dir[0] || !bytes || step < 0) {
    free(bytes);
    return MPT_FAIL(MPT_EINVAL, "background checkpoint: NULL or empty argument");
  }
  mpt__ckpt_async *a = calloc(1, sizeof *a);
  if (!a) {
    free(bytes);
    return MPT_FAIL(MPT_ENOMEM, "background checkpoint: out of host memory");
  }
  mpt_status st = MPT_OK;
  if (snprintf(a->dir, sizeof a->dir, "%s", dir) >= (int)sizeof a->dir)
    st = MPT_FAIL(MPT_EINVAL, "checkpoint directory %s: path too long", dir);
  if (st == MPT_OK) st = dir_path(dir, step, a->path, sizeof a->path);
  if (st != MPT_OK) {
    free(bytes);
    free(a);
    return st;
  }
  a->keep = keep_last_k;
  a->step = step;
  a->bytes = bytes;
  a->nbytes = nbytes;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  /* The thread blocks every signal (it inherits the mask): SIGTERM / SIGUSR1 reach the
   * training thread, whose handler asks the loop to stop. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&a->thread, NULL, async_main, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(bytes);
    free(a);
    return MPT_FAIL(MPT_ESTATE, "background checkpoint: cannot start its thread: %s",
                    strerror(rc));
  }
  *out = a;
  return MPT_OK;
}

mpt_status mpt__ckpt_async_wait(mpt__ckpt_async **ap, double timeout_s, char *path_out,
                                size_t path_nbytes) {
  if (!ap) return MPT_FAIL(MPT_EINVAL, "background checkpoint wait: NULL argument");
  mpt__ckpt_async *a = *ap;
  if (!a) return MPT_OK;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  if (timeout_s > 0) {
    double whole = (double)(time_t)timeout_s;
    until.tv_sec += (time_t)timeout_s;
    until.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&a->mu);
  int rc = 0;
  while (!a->done && rc != ETIMEDOUT)
    rc = timeout_s > 0 ? pthread_cond_timedwait(&a->cv, &a->mu, &until)
                       : pthread_cond_wait(&a->cv, &a->mu);
  int done = a->done;
  pthread_mutex_unlock(&a->mu);
  if (!done)
    return MPT_FAIL(MPT_ETIMEOUT, "background checkpoint %s: still being written after %.0f s",
                    a->path, timeout_s);
  pthread_join(a->thread, NULL);
  mpt_status st = a->status;
  if (st != MPT_OK) st = MPT_FAIL(st, "background checkpoint write failed: %s", a->message);
  if (st == MPT_OK && path_out && path_nbytes > 0) snprintf(path_out, path_nbytes, "%s", a->path);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  free(a);
  *ap = NULL;
  return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Collective wrappers                                                                        */

mpt_status mpt_ckpt_save_collective(mpt_comm *comm, const char *dir, int keep_last_k,
                                    mpt_model *model, mpt_optimizer *optimizer,
                                    const mpt_ckpt_meta *meta, char *path_out,
                                    size_t path_nbytes) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "checkpoint save: NULL comm");
  uint8_t msg[STATUS_MSG_NBYTES];
  memset(msg, 0, sizeof msg);
  int rank = mpt_comm_rank(comm);
  if (rank == 0) {
    mpt_status st = mpt_ckpt_save_dir(dir, keep_last_k, model, optimizer, meta, path_out,
                                      path_nbytes);
    mpt__put_u32(msg, (uint32_t)(int32_t)st);
    if (st != MPT_OK) snprintf((char *)msg + 4, sizeof msg - 4, "%s", mpt_last_error());
  }
  /* The broadcast is what makes the other ranks wait for the write; the barrier then tells
   * rank 0 that everyone has the outcome. */
  MPT_RETURN_IF(mpt_comm_broadcast_sync(comm, msg, (int64_t)sizeof msg, MPT_U8, 0));
  MPT_RETURN_IF(mpt_comm_barrier_sync(comm));
  int32_t remote = (int32_t)mpt__get_u32(msg);
  msg[sizeof msg - 1] = '\0';
  if (remote > 0) remote = MPT_ECOMM;
  if (remote != MPT_OK)
    return MPT_FAIL((mpt_status)remote, "rank 0 could not write the checkpoint: %s",
                    (const char *)msg + 4);
  if (rank != 0 && path_out && path_nbytes > 0 && dir)
    MPT_RETURN_IF(dir_path(dir, meta ? meta->global_step : 0, path_out, path_nbytes));
  return MPT_OK;
}

mpt_status mpt_ckpt_load_collective(mpt_comm *comm, const char *path, mpt_model *model,
                                    mpt_optimizer *optimizer, mpt_ckpt_meta *meta) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "checkpoint load: NULL comm");
  int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
  int32_t *all = malloc((size_t)world * 2 * sizeof *all);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "checkpoint load: out of host memory");
  mpt__ckpt_staged staged;
  memset(&staged, 0, sizeof staged);
  char detail[STATUS_MSG_NBYTES] = "", file[PATH_MAX];
  /* A local failure (resolve or stage) is reported through the all-gather, never by leaving. */
  mpt_status st = mpt_ckpt_resolve(path, file, sizeof file);
  if (st == MPT_OK) st = mpt__ckpt_stage(file, model, optimizer, &staged);
  if (st != MPT_OK) snprintf(detail, sizeof detail, "%s", mpt_last_error());
  int32_t mine[2] = {(int32_t)st, (int32_t)staged.crc};

  mpt_status cst = mpt_comm_allgather_sync(comm, mine, all, 2, MPT_I32);
  if (cst != MPT_OK) goto out;
  for (int r = 0; r < world; r++) {
    if (all[2 * r] == MPT_OK) continue;
    cst = r == rank ? MPT_FAIL(st, "rank %d could not load the checkpoint: %s", r, detail)
                    : MPT_FAIL((mpt_status)all[2 * r], "rank %d could not load the checkpoint "
                               "%s (%s; its own log has the detail)", r, path ? path : "(null)",
                               mpt_status_name((mpt_status)all[2 * r]));
    goto out;
  }
  for (int r = 1; r < world; r++) {
    if (all[2 * r + 1] == all[1]) continue;
    cst = MPT_FAIL(MPT_EMISMATCH, "the ranks loaded different checkpoints from %s: CRC-32 "
                   "0x%08" PRIx32 " on rank 0, 0x%08" PRIx32 " on rank %d; this rank read %s "
                   "(is the directory shared by every host?)", path, (uint32_t)all[1],
                   (uint32_t)all[2 * r + 1], r, file);
    goto out;
  }
  /* Every rank holds the same validated file: commit, then agree that every commit worked. */
  int32_t ok = (int32_t)mpt__ckpt_commit(&staged, model, optimizer, meta), worst = 0;
  if (ok != MPT_OK) snprintf(detail, sizeof detail, "%s", mpt_last_error());
  cst = mpt_comm_allreduce_sync(comm, &ok, &worst, 1, MPT_I32, MPT_REDUCE_MIN);
  if (cst == MPT_OK && worst != MPT_OK)
    cst = ok != MPT_OK ? MPT_FAIL((mpt_status)ok, "rank %d could not copy the checkpoint to its "
                                  "device: %s", rank, detail)
                       : MPT_FAIL((mpt_status)worst, "another rank could not copy the checkpoint "
                                  "%s to its device (%s)", path ? path : "(null)",
                                  mpt_status_name((mpt_status)worst));
out:
  mpt__ckpt_staged_free(&staged);
  free(all);
  return cst;
}
