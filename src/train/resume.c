/* Resuming on any number of ranks (docs/checkpoints.md): the plan of a resume and the checks
 * that the resumed run continues the checkpointed one sample for sample.
 *
 * The global sample order does not depend on the world size: the epoch's permutation (the
 * sampler's, from seed and epoch alone) is cut into global batches of G = ranks x samples per
 * micro-batch x accumulate consecutive positions, and rank r of W takes positions r, r + W, ...
 * of each (the distributed sampler). A job on W' ranks whose per-rank batch and accumulation
 * give the same G therefore takes the same samples in every step, and the checkpoint's cursor
 * (step_in_epoch x G samples of the epoch consumed) is a step boundary for it too.
 *
 * The plan (mpt_trainer_plan_resume): which checkpoint (--resume auto: the latest of the
 * checkpoint folder, if any), its meta read and validated by rank 0 (the whole file, CRC
 * included) and broadcast, and the per-rank batch and accumulation: the ones given, checked
 * against the checkpoint's G, or picked for it where they are "auto" (0). Collective, on the
 * calling thread. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

/* What rank 0 found, broadcast as bytes (every rank runs the same binary). */
typedef struct plan_msg {
  int32_t status; /* rank 0's status reading the checkpoint */
  int32_t found;  /* a checkpoint to resume from */
  mpt_ckpt_meta meta;
  char path[PATH_MAX];
  char error[1024];
} plan_msg;

/* Rank 0: the checkpoint `resume` names (auto: the latest of dir, if any) and its meta. */
static void read_meta_rank0(const mpt_trainer_config *c, plan_msg *m) {
  const int is_auto = strcmp(c->resume, "auto") == 0;
  mpt_status st = is_auto ? mpt_ckpt_find_latest(c->checkpoint_dir, m->path, sizeof m->path)
                          : mpt_ckpt_resolve(c->resume, m->path, sizeof m->path);
  if (is_auto && st == MPT_ENOENT) return; /* a new run */
  if (st == MPT_OK && !is_auto) st = mpt__train_refuse_model_file(c->resume, m->path);
  if (st == MPT_OK) st = mpt_ckpt_read_meta(m->path, &m->meta, NULL);
  m->status = st;
  m->found = st == MPT_OK;
  if (st != MPT_OK) snprintf(m->error, sizeof m->error, "%s", mpt_last_error());
}

/* Appends to buf[n] the settings (--batch-size B --accumulate K) that make `g` samples per
 * step on `world` ranks, K ascending, at most 6; with `fixed_batch` (a window task) only K. */
static void list_settings(int64_t g, int world, int64_t per_micro, int64_t fixed_batch,
                          char *buf, size_t n) {
  size_t used = strlen(buf);
  int listed = 0;
  const int64_t per_rank = g / world; /* samples of a step on each rank */
  for (int64_t k = 1; k <= per_rank && listed < 6 && used < n; k++) {
    if (per_rank % (k * per_micro) != 0) continue;
    if (fixed_batch)
      used += (size_t)snprintf(buf + used, n - used, "%s--accumulate %" PRId64,
                               listed ? ", " : "", k);
    else
      used += (size_t)snprintf(buf + used, n - used, "%s--batch-size %" PRId64
                               " --accumulate %" PRId64, listed ? ", " : "", per_rank / k, k);
    listed++;
  }
}

/* The numbers of ranks (up to 16 of them) that divide g into whole per-rank shares of
 * per_micro samples. */
static void list_worlds(int64_t g, int64_t per_micro, char *buf, size_t n) {
  size_t used = strlen(buf);
  int listed = 0;
  for (int64_t w = 1; w <= g && listed < 16 && used < n; w++)
    if (g % (w * per_micro) == 0) {
      used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, listed ? ", " : "", w);
      listed++;
    }
}

/* Picks or checks the per-rank batch and accumulation for the checkpoint's G on `world`
 * ranks (see trainer.h). `window`: the task's samples_per_batch (0: a row is a sample). */
static mpt_status pick(mpt_trainer_config *c, int world, int64_t window, const char *path,
                       const mpt_ckpt_meta *meta) {
  const int64_t g = meta->global_batch;
  const int64_t b0 = meta->batch_size;
  const int k0 = meta->accumulate;
  const int auto_b = c->batch_size == 0, auto_k = c->accumulate == 0;
  if (window > 0) { /* the batch shapes the samples (B x T token windows): it stays */
    if (auto_b) c->batch_size = b0;
    if (c->batch_size != b0)
      return MPT_FAIL(MPT_EMISMATCH, "--resume '%s': the checkpoint's samples are windows of "
                      "%" PRId64 " rows (--batch-size %" PRId64 "), this run's of %" PRId64
                      ": --batch-size must stay %" PRId64 " (or be auto); change --accumulate "
                      "to keep the global batch on another number of ranks", path, b0, b0,
                      c->batch_size, b0);
  }
  const int64_t per_micro = window > 0 ? window : 0; /* fixed samples per micro-batch */
  int64_t b = c->batch_size, k = c->accumulate;
  if (window > 0) {
    if (auto_k && g % (world * per_micro) == 0) k = g / (world * per_micro);
  } else if (auto_b && auto_k) {
    for (int64_t kk = 1; kk <= g / world; kk++)
      if (g % (world * kk) == 0 && g / (world * kk) <= b0) {
        k = kk;
        b = g / (world * kk);
        break;
      }
  } else if (auto_b) {
    if (g % (world * k) == 0) b = g / (world * k);
  } else if (auto_k) {
    if (g % (world * b) == 0) k = g / (world * b);
  }
  const int64_t spb = window > 0 ? window : b;
  if (b > 0 && k > 0 && k <= INT_MAX && (int64_t)world * spb * k == g) {
    c->batch_size = b;
    c->accumulate = (int)k;
    if ((auto_b && window == 0) || auto_k)
      mpt_log(MPT_LOG_INFO, "%s%s%s: %" PRId64 " x accumulate %" PRId64 " on %d rank(s) keep the "
              "checkpoint's global batch of %" PRId64 " samples per step", auto_b && !window
              ? "--batch-size auto" : "", auto_b && !window && auto_k ? ", " : "",
              auto_k ? "--accumulate auto" : "", b, k, world, g);
    return MPT_OK;
  }
  char alt[768] = "";
  if (g % (world * (per_micro ? per_micro : 1)) == 0) {
    list_settings(g, world, per_micro ? per_micro : 1, window > 0, alt, sizeof alt);
  } else {
    snprintf(alt, sizeof alt, "none on %d rank(s): %" PRId64 " is not a multiple of %" PRId64
             "; ranks that can: ", world, g, world * (per_micro ? per_micro : 1));
    list_worlds(g, per_micro ? per_micro : 1, alt, sizeof alt);
  }
  char mine[96];
  if (auto_b || auto_k)
    snprintf(mine, sizeof mine, "no %s%s%s", auto_b ? "--batch-size" : "",
             auto_b && auto_k ? " and " : "", auto_k ? "--accumulate" : "");
  else
    snprintf(mine, sizeof mine, "%d x %" PRId64 " x %" PRId64 " = %" PRId64, world, spb, k,
             (int64_t)world * spb * k);
  /* the checkpoint's own product: its samples per micro-batch are G / (ranks x accumulate) (a
   * language model's sample is a window of --batch-size rows: its batch size is not a factor) */
  const int64_t spb0 = meta->world_size > 0 && k0 > 0 ? g / ((int64_t)meta->world_size * k0) : b0;
  return MPT_FAIL(MPT_EMISMATCH, "--resume '%s': the checkpoint trains with a global batch of %"
                  PRId64 " %s per step (%d rank(s) x %" PRId64 " x accumulate %d), and %s "
                  "on this job's %d rank(s) makes it%s. Settings that keep it: %s", path, g,
                  window > 0 ? "window(s) of --batch-size x --seq-len tokens" : "samples",
                  meta->world_size, spb0, k0, mine, world,
                  auto_b || auto_k ? "" : " (ranks x samples per micro-batch x accumulate)",
                  alt);
}

mpt_status mpt_trainer_plan_resume(mpt_comm *comm, mpt_trainer_config *cfg,
                                   int64_t samples_per_batch, int64_t new_run_batch,
                                   mpt_ckpt_meta *meta, int *found) {
  if (!comm || !cfg || samples_per_batch < 0 || new_run_batch < 1)
    return MPT_FAIL(MPT_EINVAL, "mpt_trainer_plan_resume: NULL argument or a count < 0");
  const int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
  if (found) *found = 0;
  if (cfg->batch_size < 0 || cfg->accumulate < 0)
    return MPT_FAIL(MPT_EINVAL, "trainer config: batch %" PRId64 ", accumulate %d (0 is auto)",
                    cfg->batch_size, cfg->accumulate);
  const char *resume = cfg->resume ? cfg->resume : "";
  const int is_auto = strcmp(resume, "auto") == 0;
  if (is_auto && (!cfg->checkpoint_dir || !cfg->checkpoint_dir[0]))
    return MPT_FAIL(MPT_EINVAL, "--resume auto needs --checkpoint-dir (the directory to resume "
                    "from)");
  plan_msg *m = calloc(1, sizeof *m);
  if (!m) return MPT_FAIL(MPT_ENOMEM, "the resume plan");
  mpt_status st = MPT_OK;
  if (resume[0]) {
    if (rank == 0) read_meta_rank0(cfg, m);
    if (world > 1)
      st = mpt_comm_broadcast_sync(comm, m, (int64_t)sizeof *m, MPT_U8, 0);
  }
  if (st == MPT_OK && m->status != MPT_OK) {
    st = rank == 0 ? MPT_FAIL((mpt_status)m->status, "%s", m->error)
                   : MPT_FAIL((mpt_status)m->status, "rank 0 could not read the checkpoint to "
                              "resume from (%s): %s", resume, m->error);
  }
  if (st == MPT_OK && is_auto) {
    cfg->resume = m->found ? cfg->checkpoint_dir : "";
    if (m->found)
      mpt_log(MPT_LOG_INFO, "--resume auto: resuming from %s", m->path);
    else
      mpt_log(MPT_LOG_INFO, "--resume auto: no checkpoint in %s: starting a new run",
              cfg->checkpoint_dir);
  }
  if (st == MPT_OK && m->found && m->meta.global_batch == 0) { /* version 1: no G recorded */
    if (cfg->batch_size == 0 || cfg->accumulate == 0)
      st = MPT_FAIL(MPT_EINVAL, "--resume '%s': the checkpoint (format version %u) records no "
                    "global batch: give --batch-size and --accumulate (those it was written "
                    "with) instead of auto", m->path, m->meta.format_version);
    else if (m->meta.world_size != world)
      st = MPT_FAIL(MPT_EMISMATCH, "checkpoint '%s' was written by %d rank(s), this job has %d: "
                    "a checkpoint of format version %u records no global batch, so it resumes "
                    "on the same number of ranks only", m->path, m->meta.world_size, world,
                    m->meta.format_version);
  } else if (st == MPT_OK && m->found) {
    st = pick(cfg, world, samples_per_batch, m->path, &m->meta);
  }
  if (st == MPT_OK && !m->found) { /* a new run: auto is the defaults */
    if (cfg->batch_size == 0) cfg->batch_size = new_run_batch;
    if (cfg->accumulate == 0) cfg->accumulate = 1;
  }
  if (st == MPT_OK && meta && m->found) *meta = m->meta;
  if (st == MPT_OK && found) *found = m->found;
  free(m);
  return st;
}

int64_t mpt__train_epoch_samples(const mpt__trainer *t) {
  const int64_t n = mpt_data_source_get_desc(t->task->train)->count;
  const int64_t per = (int64_t)t->world * t->samples_per_batch;
  const int64_t extent = t->c.drop_last ? n / per * per : n;
  if (t->c.max_steps > 0 && t->c.max_steps * t->global_batch < extent)
    return t->c.max_steps * t->global_batch;
  return extent;
}

mpt_status mpt__train_check_resume_fit(mpt__trainer *t) {
  const mpt_ckpt_meta *m = &t->resume_meta;
  const mpt_trainer_config *c = &t->c;
  if (!t->resuming) return MPT_OK;
  if (m->seed != c->seed)
    return MPT_FAIL(MPT_EMISMATCH, "checkpoint '%s' was written with --seed %" PRIu64 ", this "
                    "run has %" PRIu64, c->resume, m->seed, c->seed);
  if (c->stop_at_step > 0 && c->stop_at_step <= m->global_step)
    return MPT_FAIL(MPT_EINVAL, "--stop-at-step %" PRId64 " is not after the checkpoint's step %"
                    PRId64, c->stop_at_step, m->global_step);
  if (m->global_batch == 0) return MPT_OK; /* version 1: the same world size, checked above */
  const int64_t n = mpt_data_source_get_desc(t->task->train)->count;
  if (m->dataset_count != n)
    return MPT_FAIL(MPT_EMISMATCH, "--resume '%s': the checkpoint was trained on a data set of %"
                    PRId64 " samples, this run's has %" PRId64 ": another data set (or "
                    "--train-limit) would not continue the same run", c->resume,
                    m->dataset_count, n);
  const int64_t e = mpt__train_epoch_samples(t);
  /* --max-steps shorter than the data makes an epoch (max-steps x G samples): another
   * --max-steps, another epoch, which cannot continue the checkpoint's */
  const int64_t was = m->epoch_samples / m->global_batch, now = e / t->global_batch;
  if (m->epoch_samples != e && m->epoch_samples % m->global_batch == 0 && !c->drop_last &&
      ((c->max_steps > 0 && e == c->max_steps * t->global_batch) || m->epoch_samples < n)) {
    char this_run[96], want[160];
    snprintf(this_run, sizeof this_run, c->max_steps > 0 ? "--max-steps %" PRId64 "" :
             "no --max-steps", c->max_steps);
    if (m->epoch_samples < n)
      snprintf(want, sizeof want, "give --max-steps %" PRId64, was);
    else
      snprintf(want, sizeof want, "give the checkpointed run's --max-steps (none, or one of "
               "at least %" PRId64 ": its run-options.txt records it)", was);
    return MPT_FAIL(MPT_EMISMATCH, "--resume '%s': --max-steps changed: the checkpointed run's "
                    "epochs are %" PRId64 " steps of %" PRId64 " sample(s) (%s), this run's, "
                    "with %s, are %" PRId64 " steps: %s to continue the same run", c->resume,
                    was, m->global_batch, m->epoch_samples < n ? "its --max-steps, fewer "
                    "than the data holds" : "the whole data set", this_run, now, want);
  }
  if (m->epoch_samples != e)
    return MPT_FAIL(MPT_EMISMATCH, "--resume '%s': an epoch of the checkpointed run trains on %"
                    PRId64 " samples, on %d rank(s) x %" PRId64 " sample(s) per micro-batch it would "
                    "train on %" PRId64 "%s", c->resume, m->epoch_samples, t->world,
                    t->samples_per_batch, e, c->drop_last ? " (--drop-last drops the tail the "
                    "ranks x batch cannot share: another tail on another number of ranks; "
                    "resume on the same ranks and batch, or train without --drop-last)" : "");
  if (m->epoch_cursor % t->global_batch != 0 && m->epoch_cursor != m->epoch_samples)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint '%s': its epoch cursor %" PRId64 " is not a step "
                    "boundary of its global batch %" PRId64 " (corrupt meta)", c->resume,
                    m->epoch_cursor, t->global_batch);
  return MPT_OK;
}
