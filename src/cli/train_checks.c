/* Checks that every rank agrees (options, epoch, parameters), output-path and parameter-file
 * helpers, and the fault injection the tests use (MPT_TEST_* variables). Run on the training
 * thread; the checks are collective over the trainer's host comm. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "cli/train_impl.h"
#include "core/error.h"
#include "mpitrain/ckpt.h"
#include "mpitrain/ops.h"

/* The parameters on the host: the flat buffer itself on the CPU, else a copy (synchronised). */
mpt_status trainer_params_on_host(trainer *t, float **host) {
  if (t->device.type == MPT_DEVICE_CPU) {
    *host = mpt_model_params(t->model);
    return MPT_OK;
  }
  size_t nbytes = (size_t)mpt_model_param_count(t->model) * sizeof(float);
  if (!t->host_params && !(t->host_params = malloc(nbytes ? nbytes : 1)))
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate a host copy of the parameters");
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, mpt_device_cpu(), t->host_params, t->device,
                              mpt_model_params(t->model), nbytes));
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, t->o->timeout_s * 1e3));
  *host = t->host_params;
  return MPT_OK;
}

/* Fault injection for the tests: MPT_TEST_NAN_RANK=r and MPT_TEST_NAN_STEP=s put a NaN into
 * rank r's first micro-batch of global step s. */
void trainer_maybe_poison(trainer *t, mpt_batch *b, int k) {
  const char *r = getenv("MPT_TEST_NAN_RANK"), *s = getenv("MPT_TEST_NAN_STEP");
  if (k == 0 && r && s && atoi(r) == t->rank && atoll(s) == t->global_step)
    ((float *)b->images.data)[0] = NAN;
}

/* Fault injection for the tests: MPT_TEST_PERTURB_RANK=r and MPT_TEST_PERTURB_STEP=s change one
 * parameter of rank r after global step s, so that its replica diverges. */
void trainer_maybe_perturb(trainer *t) {
  const char *r = getenv("MPT_TEST_PERTURB_RANK"), *s = getenv("MPT_TEST_PERTURB_STEP");
  if (!(r && s && atoi(r) == t->rank && atoll(s) == t->global_step)) return;
  float v;
  float *p = mpt_model_params(t->model);
  if (mpt_op_memcpy(t->stream, mpt_device_cpu(), &v, t->device, p, sizeof v) != MPT_OK ||
      mpt_stream_synchronize(t->stream, t->o->timeout_s * 1e3) != MPT_OK)
    return;
  v += 1e-3f;
  mpt_op_memcpy(t->stream, t->device, p, mpt_device_cpu(), &v, sizeof v);
  mpt_stream_synchronize(t->stream, t->o->timeout_s * 1e3);
}

/* --check-replicas: a CRC-32 of the parameter bytes, all-gathered; names the first rank whose
 * replica differs from rank 0's. */
mpt_status trainer_check_replicas(trainer *t) {
  if (t->world == 1) return MPT_OK;
  uLong crc = crc32(0L, Z_NULL, 0);
  float *host;
  MPT_RETURN_IF(trainer_params_on_host(t, &host));
  const unsigned char *p = (const unsigned char *)host;
  size_t left = (size_t)mpt_model_param_count(t->model) * sizeof(float);
  while (left > 0) {
    uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  int32_t mine = (int32_t)(uint32_t)crc, *all = malloc(sizeof(int32_t) * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the replica check");
  mpt_status st = mpt_comm_allgather_sync(t->comm, &mine, all, 1, MPT_I32);
  for (int r = 1; st == MPT_OK && r < t->world; r++)
    if (all[r] != all[0])
      st = MPT_FAIL(MPT_EMISMATCH,
                    "replicas diverged after step %" PRId64 ": rank %d's parameters (CRC-32 "
                    "%08x) differ from rank 0's (%08x)",
                    t->global_step, r, (unsigned)all[r], (unsigned)all[0]);
  free(all);
  return st;
}

/* Fault injection for the tests of the failure model (FAULTS.md F10): MPT_TEST_KILL_RANK=r and
 * MPT_TEST_KILL_STEP=s make rank r kill itself with SIGKILL before global step s. */
void trainer_maybe_kill_self(trainer *t) {
  const char *r = getenv("MPT_TEST_KILL_RANK"), *s = getenv("MPT_TEST_KILL_STEP");
  if (r && s && atoi(r) == t->rank && atoll(s) == t->global_step) {
    fprintf(stderr, "mpitrain: rank %d: killing itself at step %" PRId64 " (MPT_TEST_KILL_*)\n",
            t->rank, t->global_step);
    raise(SIGKILL);
  }
}

/* Fault case F02: every rank must be at the same epoch (the sampler's shuffle depends on it).
 * For the tests, MPT_TEST_EPOCH_SKEW_RANK=r makes rank r report one epoch ahead. */
mpt_status trainer_check_epoch(trainer *t, int64_t epoch) {
  if (t->world == 1) return MPT_OK;
  const char *skew = getenv("MPT_TEST_EPOCH_SKEW_RANK");
  if (skew && atoi(skew) == t->rank) epoch++;
  int32_t mine = (int32_t)epoch, *all = malloc(sizeof(int32_t) * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the epoch check");
  mpt_status st = mpt_comm_allgather_sync(t->comm, &mine, all, 1, MPT_I32);
  for (int r = 1; st == MPT_OK && r < t->world; r++)
    if (all[r] != all[0])
      st = MPT_FAIL(MPT_EMISMATCH, "ranks disagree on the epoch: rank %d is at epoch %d, rank 0 "
                                   "at epoch %d",
                    r, all[r] + 1, all[0] + 1);
  free(all);
  return st;
}

/* An output path may be a new file or a regular file (replaced by rename); never a device, a
 * directory or a symbolic link, which a rename would destroy. */
mpt_status trainer_check_output_path(const char *option, const char *path) {
  struct stat sb;
  if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return MPT_FAIL(MPT_EINVAL, "%s '%s' exists and is not a regular file (%s): refusing to "
                                "replace it",
                    option, path,
                    S_ISDIR(sb.st_mode) ? "a directory" : S_ISLNK(sb.st_mode) ? "a symbolic link"
                                                                             : "a device or special file");
  return MPT_OK;
}

/* realpath of the directory part of path ("." when it has none) into out[PATH_MAX]. */
static int dir_of(const char *path, char *out) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  char *slash = strrchr(buf, '/');
  if (!slash) return realpath(".", out) ? 0 : -1;
  if (slash == buf) slash[1] = '\0';
  else *slash = '\0';
  return realpath(buf, out) ? 0 : -1;
}

/* A writer killed mid-checkpoint (SIGKILL, a node lost) leaves "<checkpoint>.tmp.<pid>": never a
 * checkpoint (the rename did not happen), only clutter. Those whose writer is no longer alive on
 * this host are removed, each named in the log; one whose process still exists (another job
 * writing here right now) is left alone. */
static void remove_dead_writers_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name, *tmp = strstr(name, ".mpt.tmp.");
    if (strncmp(name, "ckpt-step", 9) != 0 || !tmp) continue;
    char *end = NULL;
    long pid = strtol(tmp + 9, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) continue;
    if (unlink(path) == 0)
      mpt_log(MPT_LOG_INFO, "removed %s: an incomplete checkpoint left by a writer (pid %ld) "
              "that was killed", path, pid);
  }
  closedir(d);
}

mpt_status trainer_check_checkpoint_dir(const mpt_cli_options *o) {
  const char *dir = o->checkpoint_dir;
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    if (errno != ENOENT)
      return MPT_FAIL(MPT_EIO, "--checkpoint-dir '%s': %s", dir, strerror(errno));
    if (lstat(dir, &sb) == 0 && S_ISLNK(sb.st_mode))
      return MPT_FAIL(MPT_EINVAL, "--checkpoint-dir '%s' is a symbolic link to nothing (a "
                      "dangling link): create its target or give another directory", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
      return MPT_FAIL(MPT_EIO, "--checkpoint-dir '%s': cannot create it: %s", dir,
                      strerror(errno));
  } else if (!S_ISDIR(sb.st_mode)) {
    return MPT_FAIL(MPT_EINVAL, "--checkpoint-dir '%s' exists and is not a directory", dir);
  }
  if (access(dir, W_OK | X_OK) != 0)
    return MPT_FAIL(MPT_EIO, "--checkpoint-dir '%s' cannot be written: %s", dir, strerror(errno));
  remove_dead_writers_files(dir);
  char latest[PATH_MAX];
  mpt_status st = mpt_ckpt_find_latest(dir, latest, sizeof latest);
  if (st == MPT_ENOENT) return MPT_OK; /* empty: a new run */
  if (st != MPT_OK) return st;
  if (o->resume[0]) { /* continuing the run whose checkpoints these are? */
    char from[PATH_MAX], from_real[PATH_MAX], from_dir[PATH_MAX], here[PATH_MAX];
    char latest_real[PATH_MAX];
    MPT_RETURN_IF(mpt_ckpt_resolve(o->resume, from, sizeof from)); /* names a missing file */
    if (realpath(from, from_real) && dir_of(from_real, from_dir) == 0 && realpath(dir, here) &&
        strcmp(from_dir, here) == 0) {
      if (realpath(latest, latest_real) && strcmp(latest_real, from_real) == 0) return MPT_OK;
      return MPT_FAIL(MPT_EINVAL, "--resume '%s' is not the latest checkpoint of --checkpoint-dir "
                      "'%s' (%s is): continuing from it would overwrite or rotate away the later "
                      "ones. Give a new --checkpoint-dir to branch off from it", o->resume, dir,
                      latest);
    }
  }
  return MPT_FAIL(MPT_EINVAL, "--checkpoint-dir '%s' already holds checkpoints of another run "
                  "(latest: %s). Continue that run with --resume '%s', or give an empty or new "
                  "directory: this run would otherwise rotate them away (--keep %d)",
                  dir, latest, dir, o->keep);
}

mpt_status trainer_save_params(trainer *t, const char *path) {
  if (t->rank != 0) return MPT_OK;
  MPT_RETURN_IF(trainer_check_output_path("--save-params", path));
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return MPT_FAIL(MPT_EIO, "cannot open '%s' for writing", tmp);
  size_t n = (size_t)mpt_model_param_count(t->model);
  float *host;
  mpt_status st = trainer_params_on_host(t, &host);
  if (st != MPT_OK) {
    fclose(f);
    remove(tmp);
    return st;
  }
  size_t w = fwrite(host, sizeof(float), n, f);
  int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
  if (fclose(f) != 0 || bad || w != n) {
    remove(tmp);
    return MPT_FAIL(MPT_EIO, "cannot write parameters to '%s'", tmp);
  }
  if (rename(tmp, path) != 0) {
    remove(tmp);
    return MPT_FAIL(MPT_EIO, "cannot rename '%s' to '%s'", tmp, path);
  }
  return MPT_OK;
}

/* Every rank must run with the same options: a rank started with other options would issue
 * other collectives (a hang until the deadline) or train another model (a silent wrong answer).
 * The command lines are compared; the first option that differs from rank 0's is named. */
mpt_status trainer_check_same_options(trainer *t) {
  if (t->world == 1) return MPT_OK;
  enum { LINE = 4096 };
  char *mine = calloc(1, LINE), *all = calloc((size_t)t->world, LINE);
  mpt_status st = MPT_OK;
  if (!mine || !all) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the option check");
    goto done;
  }
  size_t used = 0;
  for (int i = 1; i < t->o->argc && used < LINE - 1; i++)
    used += (size_t)snprintf(mine + used, LINE - used, "%s%c", t->o->argv[i], '\0') ;
  MPT_CHECK(mpt_comm_allgather_sync(t->comm, mine, all, LINE, MPT_U8), done);
  for (int r = 1; r < t->world; r++) {
    const char *a = all, *b = all + (size_t)r * LINE;
    if (memcmp(a, b, LINE) == 0) continue;
    /* walk both NUL-separated lists to the first differing word */
    const char *prev = NULL;
    while (*a && *b && strcmp(a, b) == 0) {
      prev = a;
      a += strlen(a) + 1;
      b += strlen(b) + 1;
    }
    st = MPT_FAIL(MPT_EMISMATCH,
                  "ranks were started with different options: rank %d has '%s' where rank 0 "
                  "has '%s'%s%s%s (every rank must run the same command line)",
                  r, *b ? b : "(end of options)", *a ? a : "(end of options)",
                  prev ? " (after '" : "", prev ? prev : "", prev ? "')" : "");
    goto done;
  }
done:
  free(mine);
  free(all);
  return st;
}
