/* Checkpoints in the loop: the checks at start (the checkpoint folder belongs to this run,
 * run-options.txt), --resume auto, whether the model is fit to be checkpointed (and trained
 * on), writing one, and resuming.
 *
 * - --resume auto: resume from the checkpoint folder's latest checkpoint when it has one,
 *   otherwise start fresh, so one command line serves the first submission of a batch job and
 *   every later one;
 * - DIR/run-options.txt: what changes the meaning of the checkpointed state (the model's sizes
 *   and the data, from the caller's run_options lines; the optimizer, learning rate and
 *   schedule, epochs, batch and data order, from the loop's config). Written by rank 0 at the
 *   start of every run with a checkpoint folder; a resume compares the run's lines with the
 *   file next to the checkpoint and refuses any difference, naming each option and both values
 *   (another --lr or --epochs silently gives another schedule than the checkpoint was trained
 *   with, and the resumed parameters then match neither run).
 *
 * Collective where it says so: every rank resumes and saves at the same step; rank 0 writes.
 * ZeRO-1: a checkpoint holds the whole optimizer state (gathered from the ranks' shards), so a
 * run resumes with or without ZeRO. */
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

#include "ckpt/ckpt_impl.h"
#include "core/atomic_file.h"
#include "mpitrain/gpt_file.h"
#include "train/train_impl.h"

#define RUN_OPTIONS_FILE "run-options.txt"

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

mpt_status mpt__train_check_checkpoint_dir(const mpt_trainer_config *o) {
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
mpt_status mpt__train_check_model_healthy(mpt__trainer *t, const char *when, int64_t step) {
  int bad_params = 0, bad_buffers = 0;
  MPT_RETURN_IF(mpt_op_check_finite(t->stream, mpt_model_params(t->model),
                                    mpt_model_param_count(t->model), &bad_params));
  if (mpt_model_buffer_count(t->model) > 0)
    MPT_RETURN_IF(mpt_op_check_finite(t->stream, mpt_model_buffers(t->model),
                                      mpt_model_buffer_count(t->model), &bad_buffers));
  if (bad_params || bad_buffers)
    return MPT_FAIL(MPT_ENONFINITE, "the model's %s are no longer finite %s (step %" PRId64
                    ", %" PRId64 " step(s) skipped for non-finite gradients): the learning rate "
                    "%g is probably too high", bad_params ? "parameters" : "buffers (BatchNorm "
                    "running statistics)", when, step, t->skipped_nonfinite,
                    (double)t->c.optim.lr);
  if (t->consecutive_skipped >= BROKEN_AFTER_SKIPS)
    return MPT_FAIL(MPT_ENONFINITE, "the last %" PRId64 " optimizer steps were all skipped for "
                    "non-finite gradients (stopping %s, step %" PRId64 "): the model no "
                    "longer trains; the learning rate %g is probably too high",
                    t->consecutive_skipped, when, step, (double)t->c.optim.lr);
  return MPT_OK;
}

/* Rank 0's status reaches every rank (a collective): each returns it, with rank 0's message. */
static mpt_status share_status(mpt__trainer *t, mpt_status st) {
  char msg[1024];
  memset(msg, 0, sizeof msg);
  int32_t code = (int32_t)st;
  if (t->rank == 0) {
    memcpy(msg, &code, 4);
    if (st != MPT_OK) snprintf(msg + 4, sizeof msg - 4, "%s", mpt_last_error());
  }
  MPT_RETURN_IF(mpt_comm_broadcast_sync(t->comm, msg, (int64_t)sizeof msg, MPT_U8, 0));
  memcpy(&code, msg, 4);
  msg[sizeof msg - 1] = '\0';
  if (code == MPT_OK) return MPT_OK;
  if (t->rank == 0) return st; /* its own message is still the last error */
  if (code > 0) code = MPT_ECOMM;
  return MPT_FAIL((mpt_status)code, "rank 0's checkpoint failed: %s", msg + 4);
}

mpt_status mpt__train_ckpt_drain(mpt__trainer *t) {
  if (!t->c.checkpoint_async || !t->c.checkpoint_dir || !t->c.checkpoint_dir[0]) return MPT_OK;
  mpt_status st = MPT_OK;
  if (t->rank == 0 && t->ckpt_writer) {
    char path[4200];
    double t0 = mpt_time_ms();
    st = mpt__ckpt_async_wait(&t->ckpt_writer, t->c.timeout_s, path, sizeof path);
    if (st == MPT_OK)
      mpt_log(MPT_LOG_INFO, "checkpoint %s written in the background (waited %.1f ms for it)",
              path, mpt_time_ms() - t0);
  }
  return share_status(t, st);
}

void mpt__train_ckpt_abandon(mpt__trainer *t) {
  if (!t->ckpt_writer) return;
  if (mpt__ckpt_async_wait(&t->ckpt_writer, t->c.timeout_s, NULL, 0) != MPT_OK)
    mpt_log(MPT_LOG_ERROR, "%s", mpt_last_error());
}

/* Writes a checkpoint (rank 0 writes, every rank waits) recording that `step_in_epoch` steps of
 * `epoch` are done (step_in_epoch 0: epoch `epoch` is next, the ones before it are done). */
mpt_status mpt__train_save_checkpoint(mpt__trainer *t, int64_t epoch, int64_t step_in_epoch) {
  const mpt_trainer_config *o = &t->c;
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, o->timeout_s * 1e3));
  MPT_RETURN_IF(mpt__train_check_model_healthy(t, "before writing a checkpoint", t->global_step));
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
  meta.global_batch = t->global_batch;
  meta.epoch_samples = mpt__train_epoch_samples(t);
  meta.epoch_cursor = step_in_epoch * t->global_batch < meta.epoch_samples
                          ? step_in_epoch * t->global_batch : meta.epoch_samples;
  meta.dataset_count = mpt_data_source_get_desc(t->task->train)->count;
  meta.batch_size = o->batch_size;
  meta.accumulate = o->accumulate;
  char path[4200];
  mpt_optimizer *whole; /* ZeRO-1: the state gathered from every rank (one file) */
  if (o->checkpoint_async) {
    /* One writer: the previous background write ends first (its failure stops the run). */
    MPT_RETURN_IF(mpt__train_ckpt_drain(t));
    MPT_RETURN_IF(mpt__train_opt_whole(t, 1, t->rank == 0, &whole));
    mpt_status st = MPT_OK;
    double t0 = mpt_time_ms();
    size_t nbytes = 0;
    if (t->rank == 0) {
      uint8_t *bytes = NULL;
      st = mpt__ckpt_snapshot(o->checkpoint_dir, t->model, whole, &meta, &bytes, &nbytes);
      if (st == MPT_OK)
        st = mpt__ckpt_async_start(&t->ckpt_writer, o->checkpoint_dir, o->keep, t->global_step,
                                   bytes, nbytes);
    }
    mpt__train_opt_whole_done(t, whole, 0);
    MPT_RETURN_IF(share_status(t, st));
    if (t->rank == 0)
      mpt_log(MPT_LOG_INFO, "checkpoint of global step %" PRId64 ": %.1f MiB snapshot in %.1f "
              "ms, written in the background", t->global_step, (double)nbytes / 1048576.0,
              mpt_time_ms() - t0);
    return MPT_OK;
  }
  MPT_RETURN_IF(mpt__train_opt_whole(t, 1, t->rank == 0, &whole));
  mpt_status st = mpt_ckpt_save_collective(t->comm, o->checkpoint_dir, o->keep, t->model, whole,
                                           &meta, path, sizeof path);
  mpt__train_opt_whole_done(t, whole, 0);
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
mpt_status mpt__train_resume(mpt__trainer *t) {
  const mpt_trainer_config *o = &t->c;
  mpt_ckpt_meta meta;
  mpt_optimizer *whole; /* ZeRO-1: the whole state is read, this rank keeps its shard */
  MPT_RETURN_IF(mpt__train_opt_whole(t, 0, 1, &whole));
  mpt_status st = mpt_ckpt_load_collective(t->comm, o->resume, t->model, whole, &meta);
  mpt_status sst = mpt__train_opt_whole_done(t, whole, st == MPT_OK);
  MPT_RETURN_IF(st);
  MPT_RETURN_IF(sst);
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_release_params(t->ddp)); /* ZeRO-3: keep the shard only */
  if (t->resuming && meta.global_step != t->resume_meta.global_step)
    return MPT_FAIL(MPT_ESTATE, "checkpoint '%s' changed since the start of the run (global step %"
                    PRId64 ", then %" PRId64 "): another job writing into its folder?", o->resume,
                    t->resume_meta.global_step, meta.global_step);
  if (meta.step_in_epoch > t->steps_per_epoch)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' is at step %" PRId64 " of an epoch of %" PRId64
                    " steps: the batch size, --accumulate, --max-steps or the data changed",
                    o->resume, meta.step_in_epoch, t->steps_per_epoch);
  if (meta.global_step != meta.epoch * t->steps_per_epoch + meta.step_in_epoch)
    return MPT_FAIL(MPT_EMISMATCH,
                    "checkpoint '%s' is at global step %" PRId64 " = epoch %" PRId64 " step %"
                    PRId64 ", which does not fit epochs of %" PRId64 " steps: the batch size, "
                    "--accumulate, --max-steps or the data changed since it was written",
                    o->resume, meta.global_step, meta.epoch + 1, meta.step_in_epoch,
                    t->steps_per_epoch);
  t->global_step = meta.global_step;
  t->start_epoch = meta.epoch;
  t->skip_steps = meta.step_in_epoch;
  if (t->skip_steps == t->steps_per_epoch) { /* the epoch's steps were all done */
    t->start_epoch++;
    t->skip_steps = 0;
  }
  mpt_log(MPT_LOG_INFO, "resumed from %s: epoch %" PRId64 ", global step %" PRId64, o->resume,
          meta.epoch + 1, meta.global_step);
  if (meta.global_batch > 0 && (meta.world_size != t->world || meta.batch_size != o->batch_size ||
                                meta.accumulate != o->accumulate))
    mpt_log(MPT_LOG_INFO, "the checkpoint was written by %d rank(s) x %" PRId64 " sample(s) "
            "per micro-batch x accumulate %d, this job runs %d x %" PRId64 " x %d: the same "
            "global batch of %" PRId64 " samples per step, the same samples in each step (%"
            PRId64 " of epoch %" PRId64 " done)", meta.world_size,
            meta.global_batch / ((int64_t)meta.world_size * meta.accumulate), meta.accumulate,
            t->world, t->samples_per_batch, o->accumulate, meta.global_batch,
            meta.epoch_cursor, meta.epoch + 1);
  return MPT_OK;
}

/* The shortest %g text that reads back as the same float (0.05, not 0.0500000007). */
static const char *float_text(float v, char *buf) {
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(buf, 32, "%.*g", prec, (double)v);
    if (strtof(buf, NULL) == v) break;
  }
  return buf;
}

/* The lines the file records, "name value" each: the caller's (model, data), then the loop's,
 * in a fixed order. */
static size_t format_run_options(const mpt__trainer *t, char *buf, size_t n) {
  const mpt_trainer_config *o = &t->c;
  char f[8][32], batch[96];
  /* the global batch, not the per-rank batch and accumulation: a resume on another number of
   * ranks keeps it with other ones (resume.c); the batch stays when it shapes the samples */
  if (t->task->samples_per_batch > 0)
    snprintf(batch, sizeof batch, "batch-size %" PRId64 "\nglobal-batch %" PRId64 "\n",
             o->batch_size, t->global_batch);
  else
    snprintf(batch, sizeof batch, "global-batch %" PRId64 "\n", t->global_batch);
  const mpt_optimizer_config *oc = &o->optim;
  const mpt_lr_schedule *s = &o->schedule;
  int w = snprintf(buf, n,
                   "%s%sepochs %" PRId64 "\n%smax-steps %" PRId64 "\nshuffle %d\ndrop-last %d\n"
                   "optimizer %s\nlr %s\nmomentum %s\n"
                   "nesterov %d\nweight-decay %s\nadam-betas %s,%s\nadam-eps %s\n"
                   "no-decay-bias-norm %d\nschedule %s\nwarmup-steps %" PRId64 "\nstep-size %"
                   PRId64 "\ngamma %s\nmin-lr %s\ngrad-clip %g\nseed %" PRIu64 "\n",
                   o->run_options, o->run_options[0] && o->run_options[strlen(o->run_options) - 1]
                   != '\n' ? "\n" : "", o->epochs, batch, o->max_steps, o->shuffle,
                   o->drop_last, mpt_optimizer_kind_name(oc->kind),
                   float_text(oc->lr, f[0]), float_text(oc->momentum, f[1]), oc->nesterov,
                   float_text(oc->weight_decay, f[2]), float_text(oc->beta1, f[3]),
                   float_text(oc->beta2, f[4]), float_text(oc->eps, f[5]), o->no_decay_bias_norm,
                   mpt_lr_kind_name(s->kind), (int64_t)s->warmup_steps, (int64_t)s->step_size,
                   float_text(s->gamma, f[6]), float_text(s->min_lr, f[7]), o->grad_clip,
                   o->seed);
  return w < 0 ? 0 : (size_t)w < n ? (size_t)w : n - 1;
}

/* Compares the file's lines with ours; appends "--name: A in the checkpointed run, B now" for
 * each difference to diff[n]. Returns the number of differences; *known: how many of our names
 * the file has (0: it is no run-options file). */
static int compare_run_options(const char *theirs, const char *ours, char *diff, size_t n,
                               int *known) {
  int count = 0;
  *known = 0;
  size_t used = 0;
  const char *p = ours;
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    const char *sp = memchr(p, ' ', len);
    if (sp) {
      size_t klen = (size_t)(sp - p);
      const char *q = theirs, *found = NULL;
      while (q && *q) { /* the same name at the start of a line of theirs */
        if (strncmp(q, p, klen) == 0 && q[klen] == ' ') {
          found = q + klen + 1;
          break;
        }
        q = strchr(q, '\n');
        if (q) q++;
      }
      const char *mine = sp + 1;
      size_t mlen = len - klen - 1;
      size_t flen = found ? strcspn(found, "\n") : 0;
      *known += found != NULL;
      if (found && (flen != mlen || strncmp(found, mine, mlen) != 0)) {
        count++;
        if (used < n)
          used += (size_t)snprintf(diff + used, n - used, "%s--%.*s %.*s in the checkpointed "
                                   "run, %.*s now", count > 1 ? "; " : "", (int)klen, p,
                                   (int)flen, found, (int)mlen, mine);
      }
    }
    p += len + (eol ? 1 : 0);
  }
  return count;
}

/* --resume FILE where FILE is an llm.c model file (--save-model's output): refused before
 * anything else is said about it, pointing to --init-from, which reads such files. */
mpt_status mpt__train_refuse_model_file(const char *given, const char *file) {
  FILE *f = fopen(file, "rb");
  if (!f) return MPT_OK; /* the checkpoint reader names what is wrong */
  unsigned char head[4];
  const size_t got = fread(head, 1, sizeof head, f);
  fclose(f);
  const uint32_t magic = got == 4 ? (uint32_t)head[0] | (uint32_t)head[1] << 8 |
                                        (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24
                                  : 0;
  if (magic != MPT_GPT_FILE_MAGIC) return MPT_OK;
  return MPT_FAIL(MPT_EINVAL, "--resume '%s' is an llm.c model file (what --save-model writes), "
                  "not a checkpoint: start from its weights with --init-from '%s' (--resume "
                  "continues a run from a checkpoint file or folder of --checkpoint-dir)", given,
                  given);
}

mpt_status mpt__train_check_run_options(mpt__trainer *t) {
  const mpt_trainer_config *o = &t->c;
  char ours[8192];
  size_t ours_len = format_run_options(t, ours, sizeof ours);
  if (o->resume[0]) {
    char from[PATH_MAX], dir[PATH_MAX], path[PATH_MAX + 32];
    MPT_RETURN_IF(mpt_ckpt_resolve(o->resume, from, sizeof from));
    MPT_RETURN_IF(mpt__train_refuse_model_file(o->resume, from));
    snprintf(dir, sizeof dir, "%s", from);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(path, sizeof path, "%s/%s", dir, RUN_OPTIONS_FILE);
    FILE *f = fopen(path, "r");
    if (!f) {
      mpt_log(MPT_LOG_WARN, "--resume: %s is missing (written by older versions of mpitrain "
              "or removed): the options of this run are not compared with the checkpointed "
              "run's; give the same ones", path);
    } else {
      char theirs[8192];
      size_t got = fread(theirs, 1, sizeof theirs - 1, f);
      theirs[got] = '\0';
      fclose(f);
      char diff[4096] = "";
      int known;
      int count = compare_run_options(theirs, ours, diff, sizeof diff, &known);
      if (known == 0) /* faults.md F49 */
        mpt_log(MPT_LOG_WARN, "--resume: %s records none of the options (empty, or not written "
                "by mpitrain): the options of this run are not compared with the checkpointed "
                "run's; give the same ones", path);
      if (count > 0)
        return MPT_FAIL(MPT_EINVAL, "--resume '%s': %d option(s) differ from the run that "
                        "wrote the checkpoint (%s); they would change what the checkpointed "
                        "state means (learning-rate schedule, data order, model): resume with "
                        "the same options (see %s), or start a new run", o->resume, count, diff,
                        path);
    }
  }
  if (!o->checkpoint_dir[0]) return MPT_OK;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", o->checkpoint_dir, RUN_OPTIONS_FILE);
  mpt__afile af; /* written whole, then renamed into place (core/atomic_file.h) */
  mpt_status st = mpt__afile_open(&af, path, RUN_OPTIONS_FILE);
  if (st == MPT_OK) st = mpt__afile_write(&af, ours, ours_len);
  if (st == MPT_OK) st = mpt__afile_commit(&af);
  mpt__afile_abort(&af);
  return st;
}


mpt_status mpt__train_opt_whole(mpt__trainer *t, int gather, int need, mpt_optimizer **whole) {
  *whole = t->opt;
  if (gather && t->ddp) MPT_RETURN_IF(mpt_ddp_gather_params(t->ddp)); /* ZeRO-3: whole to save */
  if (!t->ddp || !mpt_ddp_zero_stage(t->ddp)) return MPT_OK;
  mpt_optimizer *w = NULL;
  if (!need) { /* this rank only takes part in the gather */
    *whole = NULL;
    return gather ? mpt_ddp_optimizer_gather(t->ddp, t->opt, NULL) : MPT_OK;
  }
  MPT_RETURN_IF(mpt_optimizer_init(&w, mpt_optimizer_get_config(t->opt), mpt_device_cpu(),
                                   mpt_model_param_count(t->model)));
  mpt_status st = gather ? mpt_ddp_optimizer_gather(t->ddp, t->opt, w) : MPT_OK;
  if (st != MPT_OK) {
    mpt_optimizer_free(w);
    return st;
  }
  *whole = w;
  return MPT_OK;
}

mpt_status mpt__train_opt_whole_done(mpt__trainer *t, mpt_optimizer *whole, int scatter) {
  if (whole == t->opt || !whole) return MPT_OK;
  mpt_status st = scatter ? mpt_ddp_optimizer_scatter(t->ddp, whole, t->opt) : MPT_OK;
  mpt_optimizer_free(whole);
  return st;
}

