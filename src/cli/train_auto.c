/* What a resumed run must share with the run it continues, and how a batch job that is
 * resubmitted finds out whether it continues one:
 * - --resume auto: resume from --checkpoint-dir's latest checkpoint when it has one, otherwise
 *   start fresh, so one command line serves the first submission and every later one;
 * - DIR/run-options.txt: the options that change what the checkpointed state means (model,
 *   optimizer, learning rate and schedule, epochs, batch, data). Written by rank 0 at the start
 *   of every run with --checkpoint-dir; a --resume compares the run's options with the file
 *   next to the checkpoint and refuses any difference, naming each option and both values (a
 *   different --lr or --epochs silently gives another schedule than the one the checkpoint was
 *   trained with, and the resumed parameters then match neither run);
 * - the configuration as it takes effect, logged once, and a warning for every option given
 *   that has no effect in this run. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/train_impl.h"
#include "mpitrain/ckpt.h"

#define RUN_OPTIONS_FILE "run-options.txt"

mpt_status trainer_resolve_resume_auto(trainer *t) {
  if (strcmp(t->o->resume, "auto") != 0) return MPT_OK;
  t->resolved = *t->o;
  const char *dir = t->o->checkpoint_dir;
  int32_t found = 0;
  char latest[PATH_MAX] = "";
  if (t->rank == 0) {
    mpt_status st = mpt_ckpt_find_latest(dir, latest, sizeof latest);
    if (st != MPT_OK && st != MPT_ENOENT) return st;
    found = st == MPT_OK;
  }
  if (t->world > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(t->comm, &found, &found, 1, MPT_I32, MPT_REDUCE_MAX));
  if (found) {
    snprintf(t->resolved.resume, sizeof t->resolved.resume, "%s", dir);
    mpt_log(MPT_LOG_INFO, "--resume auto: resuming from %s", t->rank == 0 ? latest : dir);
  } else {
    t->resolved.resume[0] = '\0';
    mpt_log(MPT_LOG_INFO, "--resume auto: no checkpoint in %s: starting a new run", dir);
  }
  t->o = &t->resolved;
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

/* The options the file records, "name value" per line, in a fixed order. */
static size_t format_run_options(const mpt_cli_options *o, char *buf, size_t n) {
  char f[6][32];
  char hidden[256] = "";
  size_t used = 0;
  for (int i = 0; i < o->mlp.num_hidden && used < sizeof hidden; i++)
    used += (size_t)snprintf(hidden + used, sizeof hidden - used, "%s%" PRId64, i ? "," : "",
                             (int64_t)o->mlp.hidden[i]);
  int w = snprintf(buf, n,
                   "model %s\nhidden %s\nbatchnorm %d\ndropout %s\nepochs %" PRId64
                   "\nbatch-size %" PRId64 "\naccumulate %d\nmax-steps %" PRId64
                   "\ntrain-limit %" PRId64 "\nsynthetic %d\nshuffle %d\ndrop-last %d\n"
                   "optimizer %s\nlr %s\nmomentum %s\nnesterov %d\nweight-decay %s\n"
                   "no-decay-bias-norm %d\nschedule %s\nwarmup-steps %" PRId64 "\nstep-size %" PRId64 "\ngamma %s\n"
                   "min-lr %s\nseed %" PRIu64 "\n",
                   o->model, strcmp(o->model, "mlp") == 0 ? hidden : "-",
                   strcmp(o->model, "cnn") == 0 ? o->cnn.batchnorm : 0, float_text(o->mlp.dropout, f[0]),
                   o->epochs, o->batch_size, o->accumulate, o->max_steps, o->train_limit,
                   o->synthetic, o->shuffle, o->drop_last, mpt_optimizer_kind_name(o->optim.kind),
                   float_text(o->optim.lr, f[1]), float_text(o->optim.momentum, f[2]),
                   o->optim.nesterov, float_text(o->optim.weight_decay, f[3]),
                   o->no_decay_bias_norm, mpt_lr_kind_name(o->schedule.kind), (int64_t)o->schedule.warmup_steps,
                   (int64_t)o->schedule.step_size, float_text(o->schedule.gamma, f[4]),
                   float_text(o->schedule.min_lr, f[5]), o->seed);
  if (w >= 0 && (size_t)w < n && mpt_cli_is_gpt(o)) /* sizes that keep the tensors' shapes */
    w += snprintf(buf + w, n - (size_t)w,
                  "n-layer/n-head/n-embd/seq-len/vocab-size %d/%d/%d/%d/%d\n", o->gpt.num_layers,
                  o->gpt.num_heads, o->gpt.channels, o->gpt.max_seq_len, o->gpt.vocab_size);
  return w < 0 ? 0 : (size_t)w;
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

mpt_status trainer_check_run_options(const mpt_cli_options *o) {
  char ours[2048];
  size_t ours_len = format_run_options(o, ours, sizeof ours);
  if (o->resume[0]) {
    char from[PATH_MAX], dir[PATH_MAX], path[PATH_MAX + 32];
    MPT_RETURN_IF(mpt_ckpt_resolve(o->resume, from, sizeof from));
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
      char theirs[4096];
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
  char path[PATH_MAX + 32], tmp[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", o->checkpoint_dir, RUN_OPTIONS_FILE);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return MPT_FAIL(MPT_EIO, "cannot write '%s': %s", tmp, strerror(errno));
  int bad = fwrite(ours, 1, ours_len, f) != ours_len;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return MPT_FAIL(MPT_EIO, "cannot write '%s': %s", path, strerror(e));
  }
  return MPT_OK;
}

/* Whether `name` (without the dashes) was given on the command line, also abbreviated as
 * getopt_long allows ("--dev cpu:2"). */
static int given(const mpt_cli_options *o, const char *name) {
  for (int i = 1; i < o->argc; i++) {
    const char *a = o->argv[i], *opt;
    if (strcmp(a, "--") == 0) break;
    if ((opt = mpt_cli_option_name(a)) != NULL && strcmp(opt, name) == 0) return 1;
  }
  return 0;
}

static void warn_unused(const mpt_cli_options *o, const char *name, const char *why) {
  if (given(o, name)) mpt_log(MPT_LOG_WARN, "--%s has no effect: %s", name, why);
}

void trainer_schedule_str(const mpt_lr_schedule *s, char *sched, size_t n) {
  if (s->kind == MPT_LR_STEP)
    snprintf(sched, n, "step (x%g every %" PRId64 " steps)", (double)s->gamma,
             (int64_t)s->step_size);
  else if (s->kind == MPT_LR_COSINE)
    snprintf(sched, n, "cosine to %g over %" PRId64 " steps", (double)s->min_lr,
             (int64_t)s->total_steps);
  else
    snprintf(sched, n, "constant");
}

void trainer_log_configuration(trainer *t) {
  const mpt_cli_options *o = t->o;
  if (t->rank != 0) return;
  int cnn = strcmp(o->model, "cnn") == 0, sgd = o->optim.kind == MPT_OPTIM_SGD;
  if (o->mode != MPT_MODE_DP) warn_unused(o, "devices", "it needs --mode dp");
  if (cnn) warn_unused(o, "hidden", "it sets the mlp's hidden sizes (--model cnn)");
  else warn_unused(o, "batchnorm", "the mlp has no convolutions (--model cnn adds BatchNorm2d)");
  if (!cnn) warn_unused(o, "conv-algo", "the mlp has no convolutions");
  if (!sgd) {
    warn_unused(o, "momentum", "AdamW has no momentum option (its betas are fixed)");
    warn_unused(o, "nesterov", "it applies to SGD only");
  }
  if (o->schedule.kind != MPT_LR_STEP) {
    warn_unused(o, "step-size", "it applies to --schedule step only");
    warn_unused(o, "gamma", "it applies to --schedule step only");
  }
  if (o->schedule.kind != MPT_LR_COSINE) warn_unused(o, "min-lr", "it applies to --schedule cosine only");
  if (!o->checkpoint_dir[0]) {
    warn_unused(o, "checkpoint-every", "no --checkpoint-dir");
    warn_unused(o, "keep", "no --checkpoint-dir");
  }
  if (!t->ddp) {
    const char *why = "one rank: there is no DDP engine (run under mpirun -np N)";
    warn_unused(o, "bucket-cap-mb", why);
    warn_unused(o, "first-bucket-cap-mb", why);
    warn_unused(o, "no-overlap", why);
    warn_unused(o, "find-unused-parameters", why);
    warn_unused(o, "buffers", why);
    warn_unused(o, "grad-comm", why);
    warn_unused(o, "zero", why);
    warn_unused(o, "check-collectives", "one rank: no collective to compare");
  }
  if (t->ddp && (!cnn || !o->cnn.batchnorm))
    warn_unused(o, "buffers", "the model has no BatchNorm statistics");
  if (t->progress) warn_unused(o, "progress-interval", "the progress bar is drawn instead");
  char hidden[128] = "";
  size_t used = 0;
  for (int i = 0; i < o->mlp.num_hidden && used < sizeof hidden; i++)
    used += (size_t)snprintf(hidden + used, sizeof hidden - used, "%s%" PRId64, i ? "," : "",
                             (int64_t)o->mlp.hidden[i]);
  char optim[128];
  if (sgd)
    snprintf(optim, sizeof optim, "sgd lr %g, %smomentum %g", (double)o->optim.lr,
             o->optim.nesterov ? "Nesterov " : "", (double)o->optim.momentum);
  else
    snprintf(optim, sizeof optim, "%s lr %g", mpt_optimizer_kind_name(o->optim.kind),
             (double)o->optim.lr);
  char sched[256];
  const mpt_lr_schedule *s = &t->schedule;
  trainer_schedule_str(s, sched, sizeof sched);
  mpt_log(MPT_LOG_INFO,
          "configuration: model %s%s%s%s, dropout %g; %s, weight decay %g%s; schedule "
          "%s, warm-up %" PRId64 " steps; %" PRId64 " epoch(s) x %" PRId64 " steps, batch %"
          PRId64 " per rank x %d micro-batch(es), seed %" PRIu64 "; %s%s%s; timeout %g s, "
          "check-collectives %s; checkpoints %s",
          o->model, cnn ? "" : " hidden ", cnn ? "" : hidden,
          cnn ? (o->cnn.batchnorm ? " with BatchNorm2d" : " without BatchNorm") : "",
          (double)o->mlp.dropout, optim, (double)o->optim.weight_decay,
          o->no_decay_bias_norm ? " (>= 2-D weights only)" : "", sched, (int64_t)s->warmup_steps, o->epochs,
          t->steps_per_epoch, o->batch_size, o->accumulate, o->seed,
          t->ddp ? "DDP" : (t->dp ? "DP" : "one process"),
          t->ddp ? (o->ddp.overlap ? " (overlap on" : " (overlap off") : "",
          t->ddp ? (o->ddp.buffers == MPT_DDP_BUFFERS_BROADCAST ? ", buffers broadcast)"
                    : o->ddp.buffers == MPT_DDP_BUFFERS_AVERAGE ? ", buffers average)"
                    : ", buffers none)") : "",
          o->timeout_s, o->check_collectives ? "on" : "off",
          o->checkpoint_dir[0] ? o->checkpoint_dir : "off");
}
