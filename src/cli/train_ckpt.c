/* Checkpoints of the trainer: the checks at start (--checkpoint-dir), whether the model is fit
 * to be checkpointed (and trained on), writing one, and --resume. Collective where it says so:
 * every rank calls trainer_save_checkpoint and trainer_resume at the same step. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/train_impl.h"
#include "cli/train_zero.h"
#include "mpitrain/ckpt.h"
#include "mpitrain/ops.h"

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

/* mkdir -p: `dir` and its missing parents. 0, or -1 with errno of the failed mkdir (its path in
 * failed[PATH_MAX]). */
static int make_parents(const char *dir, char *failed) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
    errno = ENAMETOOLONG;
    snprintf(failed, PATH_MAX, "%s", dir);
    return -1;
  }
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
      snprintf(failed, PATH_MAX, "%s", p);
      return -1;
    }
    *s = c;
    if (c == '\0') return 0;
  }
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
    char failed[PATH_MAX];
    if (make_parents(dir, failed) != 0)
      return MPT_FAIL(MPT_EIO, "--checkpoint-dir '%s': cannot create it (%s: %s)", dir, failed,
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

/* Steps skipped in a row (--skip-nonfinite) from which the model counts as broken: one NaN batch
 * is an accident, a model that gives non-finite gradients on every batch no longer trains. */
enum { BROKEN_AFTER_SKIPS = 3 };

/* The replicas are identical on every rank, so every rank takes the same decision. Skipping
 * steps (--skip-nonfinite) cannot repair a model whose parameters or buffers (BatchNorm running
 * statistics) stopped being finite, nor one that gives non-finite gradients on every batch (a
 * finite gradient times a far too large learning rate can overflow): stop, rather than train on
 * or checkpoint it. */
mpt_status trainer_check_model_healthy(trainer *t, const char *when) {
  int bad_params = 0, bad_buffers = 0;
  MPT_RETURN_IF(mpt_op_check_finite(t->stream, mpt_model_params(t->model),
                                    mpt_model_param_count(t->model), &bad_params));
  if (mpt_model_buffer_count(t->model) > 0)
    MPT_RETURN_IF(mpt_op_check_finite(t->stream, mpt_model_buffers(t->model),
                                      mpt_model_buffer_count(t->model), &bad_buffers));
  if (bad_params || bad_buffers)
    return MPT_FAIL(MPT_ENONFINITE, "the model's %s are no longer finite %s (global step %" PRId64
                    ", %" PRId64 " step(s) skipped for non-finite gradients): the learning rate "
                    "%g is probably too high", bad_params ? "parameters" : "buffers (BatchNorm "
                    "running statistics)", when, t->global_step, t->skipped_nonfinite,
                    (double)t->o->optim.lr);
  if (t->consecutive_skipped >= BROKEN_AFTER_SKIPS)
    return MPT_FAIL(MPT_ENONFINITE, "the last %" PRId64 " optimizer steps were all skipped for "
                    "non-finite gradients (stopping %s, global step %" PRId64 "): the model no "
                    "longer trains; the learning rate %g is probably too high",
                    t->consecutive_skipped, when, t->global_step, (double)t->o->optim.lr);
  return MPT_OK;
}

/* Writes a checkpoint (rank 0 writes, every rank waits) recording that `step_in_epoch` steps of
 * `epoch` are done (step_in_epoch 0: epoch `epoch` is next, the ones before it are done). */
mpt_status trainer_save_checkpoint(trainer *t, int64_t epoch, int64_t step_in_epoch) {
  const mpt_cli_options *o = t->o;
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, o->timeout_s * 1e3));
  MPT_RETURN_IF(trainer_check_model_healthy(t, "before writing a checkpoint"));
  if (t->consecutive_skipped > 0) {
    /* The model as it stands gave non-finite gradients on its last batch: maybe an accident,
     * maybe the start of a divergence. Do not let it replace (--keep) a good checkpoint. */
    mpt_log(MPT_LOG_WARN, "checkpoint at global step %" PRId64 " not written: the last step was "
            "skipped for non-finite gradients (the next checkpoint is written if training "
            "recovers)", t->global_step);
    return MPT_OK;
  }
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.epoch = epoch;
  meta.global_step = t->global_step;
  meta.step_in_epoch = step_in_epoch;
  meta.sampler_epoch = epoch;
  meta.seed = o->seed;
  meta.world_size = t->world;
  char path[4200];
  mpt_optimizer *whole; /* ZeRO-1: the state gathered from every rank (one file) */
  MPT_RETURN_IF(trainer_opt_whole(t->ddp, t->model, t->opt, 1, t->rank == 0, &whole));
  mpt_status st = mpt_ckpt_save_collective(t->comm, o->checkpoint_dir, o->keep, t->model, whole,
                                           &meta, path, sizeof path);
  trainer_opt_whole_done(t->ddp, t->opt, whole, 0);
  MPT_RETURN_IF(st);
  if (step_in_epoch == 0)
    mpt_log(MPT_LOG_INFO, "checkpoint %s (end of epoch %" PRId64 ", global step %" PRId64 ")",
            path, epoch, t->global_step);
  else
    mpt_log(MPT_LOG_INFO, "checkpoint %s (epoch %" PRId64 ", step %" PRId64 " of it, global step %"
            PRId64 ")", path, epoch + 1, step_in_epoch, t->global_step);
  return MPT_OK;
}

/* --resume: every rank loads the same checkpoint onto its own device, then training continues
 * from the step after it. */
mpt_status trainer_resume(trainer *t) {
  const mpt_cli_options *o = t->o;
  mpt_ckpt_meta meta;
  mpt_optimizer *whole; /* ZeRO-1: the whole state is read, this rank keeps its shard */
  MPT_RETURN_IF(trainer_opt_whole(t->ddp, t->model, t->opt, 0, 1, &whole));
  mpt_status st = mpt_ckpt_load_collective(t->comm, o->resume, t->model, whole, &meta);
  mpt_status sst = trainer_opt_whole_done(t->ddp, t->opt, whole, st == MPT_OK);
  MPT_RETURN_IF(st);
  MPT_RETURN_IF(sst);
  if (meta.world_size != t->world)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' was written by %d rank(s), this job has %d: resuming would "
                    "change the data order (use the same world size)",
                    o->resume, meta.world_size, t->world);
  if (meta.seed != o->seed)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' was written with --seed %" PRIu64 ", this run has %" PRIu64,
                    o->resume, meta.seed, o->seed);
  if (meta.step_in_epoch > t->steps_per_epoch)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' is at step %" PRId64 " of an epoch of %" PRId64
                    " steps: the batch size or data changed",
                    o->resume, meta.step_in_epoch, t->steps_per_epoch);
  if (meta.global_step != meta.epoch * t->steps_per_epoch + meta.step_in_epoch)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' is at global step %" PRId64 " = epoch %" PRId64 " step %"
                    PRId64 ", which does not fit epochs of %" PRId64 " steps: the batch size, "
                    "--accumulate, --max-steps or the data changed since it was written",
                    o->resume, meta.global_step, meta.epoch + 1, meta.step_in_epoch,
                    t->steps_per_epoch);
  if (o->stop_at_step > 0 && o->stop_at_step <= meta.global_step)
    return MPT_FAIL(MPT_EINVAL, "--stop-at-step %" PRId64 " is not after the checkpoint's step %"
                                PRId64,
                    o->stop_at_step, meta.global_step);
  t->global_step = meta.global_step;
  t->start_epoch = meta.epoch;
  t->skip_steps = meta.step_in_epoch;
  if (t->skip_steps == t->steps_per_epoch) { /* the epoch's steps were all done */
    t->start_epoch++;
    t->skip_steps = 0;
  }
  mpt_log(MPT_LOG_INFO, "resumed from %s: epoch %" PRId64 ", global step %" PRId64, o->resume,
          meta.epoch + 1, meta.global_step);
  return MPT_OK;
}
