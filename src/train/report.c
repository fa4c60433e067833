/* The loop's output: the log set-up (log_file: each rank's own file; quiet), the start lines,
 * the progress bar (a terminal) or line (a pipe or file, every progress_interval_s), the step
 * lines (log_every), the memory report, the end-of-run report (throughput, per-step breakdown,
 * DDP, DataParallel, the SGEMM peak, --profile's op table), the metrics JSON and the trace.
 * Rank 0 prints what is reduced over the ranks. Training thread. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "train/train_impl.h"

/* The log set-up is process-wide (file descriptors 1 and 2, the logger): done once, by
 * mpt_trainer_log_open or the first run, for one log_file. */
/* Where the CPU's fp32 GEMMs go (ops.h, "CPU GEMM library"), for the start line. */
static const char *gemm_choice(void) {
  const mpt_cpu_gemm s = mpt_cpu_gemm_setting();
  if (s == MPT_CPU_GEMM_OPENBLAS) return "GEMMs on OpenBLAS, --gemm openblas";
  if (s == MPT_CPU_GEMM_ONEDNN) return "GEMMs on oneDNN, --gemm onednn";
  if (s == MPT_CPU_GEMM_TUNE) return "GEMMs per shape as timed on this host, --gemm tune";
  const mpt_cpu_gemm small = mpt_cpu_gemm_for(64, 512, 784);
  const mpt_cpu_gemm big = mpt_cpu_gemm_for(1024, 1024, 1024);
  if (small == big)
    return small == MPT_CPU_GEMM_ONEDNN ? "GEMMs on oneDNN, its AVX-512 kernels"
                                        : "GEMMs on OpenBLAS";
  return "GEMMs on OpenBLAS below 2^27 multiply-adds, on oneDNN's AVX2 kernels above";
}

static int log_opened = 0;
static int terminal_fd = -1; /* log_file: the stderr the process started with */
static char log_opened_for[4200];

mpt_status mpt_trainer_log_open(mpt_comm *comm, const mpt_trainer_config *cfg) {
  if (!comm || !cfg) return MPT_FAIL(MPT_EINVAL, "mpt_trainer_log_open: NULL argument");
  const int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
  const char *file = cfg->log_file ? cfg->log_file : "";
  const mpt_log_level level = cfg->quiet ? MPT_LOG_WARN : MPT_LOG_INFO;
  if (log_opened && strcmp(log_opened_for, file) == 0) {
    mpt_log_configure(rank, world, level, file[0] != '\0');
    return MPT_OK;
  }
  if (log_opened && log_opened_for[0])
    return MPT_FAIL(MPT_EINVAL, "--log-file '%s': this process already logs to '%s.%d'", file,
                    log_opened_for, rank);
  if (file[0]) {
    char path[4200];
    if (snprintf(path, sizeof path, "%s.%d", file, rank) >= (int)sizeof path)
      return MPT_FAIL(MPT_EINVAL, "--log-file '%s': path too long", file);
    /* appended: a resubmitted job (resume auto) keeps the interrupted attempt's lines */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
      return MPT_FAIL(MPT_EIO, "--log-file: cannot open '%s' on rank %d: %s", path, rank,
                      strerror(errno));
    fflush(stdout);
    fflush(stderr);
    terminal_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    const int bad = dup2(fd, 1) < 0 || dup2(fd, 2) < 0;
    const int saved = errno;
    close(fd);
    if (bad) return MPT_FAIL(MPT_EIO, "--log-file '%s': %s", path, strerror(saved));
    setvbuf(stdout, NULL, _IOLBF, 0);
  }
  snprintf(log_opened_for, sizeof log_opened_for, "%s", file);
  log_opened = 1;
  mpt_log_configure(rank, world, level, file[0] != '\0');
  return MPT_OK;
}

mpt_status mpt__train_log_setup(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  MPT_RETURN_IF(mpt_trainer_log_open(t->comm, c));
  t->terminal_fd = terminal_fd;
  t->progress_bar = t->rank == 0 && !c->quiet &&
                    (c->progress == 1 || (c->progress == -1 && isatty(2)));
  return MPT_OK;
}

/* faults.md F50: a log lost to a full disk is not an exit status of 0. */
mpt_status mpt__train_log_check(mpt__trainer *t) {
  if (!t->c.log_file[0]) return MPT_OK;
  const int bad = fflush(stdout) != 0 || fflush(stderr) != 0;
  if (!bad && !ferror(stdout) && !ferror(stderr)) return MPT_OK;
  return MPT_FAIL(MPT_EIO, "--log-file: writing '%s.%d' failed on rank %d (a full disk?): its "
                  "log is incomplete", t->c.log_file, t->rank, t->rank);
}

void mpt__train_schedule_str(const mpt_lr_schedule *s, char *out, size_t n) {
  if (s->kind == MPT_LR_STEP)
    snprintf(out, n, "step (x%g every %" PRId64 " steps)", (double)s->gamma,
             (int64_t)s->step_size);
  else if (s->kind == MPT_LR_COSINE)
    snprintf(out, n, "cosine to %g over %" PRId64 " steps", (double)s->min_lr,
             (int64_t)s->total_steps);
  else
    snprintf(out, n, "constant");
}

void mpt__train_log_start(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  const mpt_train_task *task = t->task;
  char dev[32];
  if (!c->quiet) /* every rank: how it was launched */
    fprintf(stderr, "mpitrain: rank %d/%d local rank %d host %s device %s launcher %s\n",
            t->rank, t->world, mpt_comm_local_rank(t->comm), mpt_comm_hostname(t->comm),
            mpt_device_str(t->device, dev, sizeof dev),
            mpt_launcher_name(mpt_comm_launcher(t->comm)));
  mpt_log(MPT_LOG_INFO, "model %s: %" PRId64 " parameters; %" PRId64 " training and %" PRId64
          " %s samples (%s); batch %" PRId64 " per rank x %d rank(s) x %d micro-batch(es); %"
          PRId64 " steps per epoch, %" PRId64 " in all; %d thread(s) per rank (BLAS %s; %s)",
          c->model_name, mpt_model_param_count(t->model),
          mpt_data_source_get_desc(task->train)->count,
          task->eval ? mpt_data_source_get_desc(task->eval)->count : 0,
          task->eval_name ? task->eval_name : "evaluation", task->name ? task->name : "task",
          c->batch_size, t->world, c->accumulate, t->steps_per_epoch, t->total_steps, t->threads,
          mpt_cpu_blas_name(), gemm_choice());
  char bucket_rule[96];
  if (c->ddp.unit_buckets || c->ddp.zero == 3)
    snprintf(bucket_rule, sizeof bucket_rule, "one per unit");
  else
    snprintf(bucket_rule, sizeof bucket_rule, "first cap %g MiB, cap %g MiB",
             c->ddp.first_bucket_cap_mb, c->ddp.bucket_cap_mb);
  if (t->ddp)
    mpt_log(MPT_LOG_INFO, "DDP: %d bucket(s) (%s), overlap %s, gradients %s on the wire, "
            "%s%s%s%s", mpt_ddp_num_buckets(t->ddp), bucket_rule, c->ddp.overlap ? "on" : "off",
            mpt_ddp_grad_comm_name(c->ddp.grad_comm),
            c->ddp.zero == 3 ? "ZeRO-3 (parameters sharded: each unit all-gathered before its "
                               "forward and backward, gradients reduce-scattered into the shards)"
            : c->ddp.zero == 2 ? "ZeRO-2 (reduce-scatter into the gradient shards, all-gather of "
                                 "the parameters)"
            : c->ddp.zero    ? "ZeRO-1 (reduce-scatter, all-gather of the parameters)"
                             : "all-reduce ",
            c->ddp.zero ? "" : mpt_ddp_allreduce_algo_name(c->ddp.allreduce),
            t->grad_comm ? " over " : "",
            t->grad_comm ? mpt_comm_backend_name(mpt_comm_backend_kind(t->grad_comm)) : "");
  if (t->dp)
    mpt_log(MPT_LOG_INFO, "DataParallel over %d devices (%s) in each rank",
            mpt_dp_num_devices(t->dp), c->dp_devices);
  const mpt_optimizer_config *oc = &c->optim;
  char optim[128], sched[160];
  if (oc->kind == MPT_OPTIM_SGD)
    snprintf(optim, sizeof optim, "sgd lr %g, %smomentum %g", (double)oc->lr,
             oc->nesterov ? "Nesterov " : "", (double)oc->momentum);
  else
    snprintf(optim, sizeof optim, "%s lr %g, betas (%g, %g)", mpt_optimizer_kind_name(oc->kind),
             (double)oc->lr, (double)oc->beta1, (double)oc->beta2);
  mpt__train_schedule_str(&t->schedule, sched, sizeof sched);
  const char *buffers = c->ddp.buffers == MPT_DDP_BUFFERS_BROADCAST ? "broadcast"
                        : c->ddp.buffers == MPT_DDP_BUFFERS_AVERAGE ? "average" : "none";
  char par[96] = "one process";
  if (t->ddp)
    snprintf(par, sizeof par, "%s (overlap %s, buffers %s)", t->dp ? "DDP + DP" : "DDP",
             c->ddp.overlap ? "on" : "off", buffers);
  else if (t->dp)
    snprintf(par, sizeof par, "DP");
  char warm[64] = "";
  if (t->schedule.warmup_steps > 0)
    snprintf(warm, sizeof warm, " from %.4g x lr", (double)t->schedule.warmup_start_factor);
  mpt_log(MPT_LOG_INFO, "configuration: model %s; %s, weight decay %g%s; schedule %s, warm-up %"
          PRId64 " steps%s; %" PRId64 " epoch(s) x %" PRId64 " steps, batch %" PRId64 " per rank x "
          "%d micro-batch(es), seed %" PRIu64 "; %s; timeout %g s, check-collectives %s; "
          "checkpoints %s%s%s%s", c->model_name, optim, (double)oc->weight_decay,
          c->no_decay_bias_norm ? " (>= 2-D weights only)" : "", sched,
          (int64_t)t->schedule.warmup_steps, warm, c->epochs, t->steps_per_epoch, c->batch_size,
          c->accumulate, c->seed, par, c->timeout_s, c->check_collectives ? "on" : "off",
          c->checkpoint_dir[0] ? c->checkpoint_dir : "off",
          c->skip_nonfinite ? "; --skip-nonfinite" : "", c->profile ? "; --profile on" : "",
          c->recompute ? "; --recompute (blocks' activations recomputed in backward)" : "");
}

void mpt__train_progress(mpt__trainer *t, int64_t epoch, int64_t step, const double *sums) {
  const mpt_trainer_config *c = &t->c;
  if (t->rank != 0) return;
  const double now = mpt_time_ms();
  const double upr = (double)t->task->units_per_row;
  const char *unit = t->task->unit ? t->task->unit : "samples";
  if (t->progress_bar) {
    if (step % 20 != 0 && step != t->steps_per_epoch) return;
    enum { WIDTH = 30 };
    const int filled = (int)(WIDTH * step / t->steps_per_epoch);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[WIDTH] = '\0';
    const double s = (now - t->loop_start_ms) / 1e3;
    const double done = (double)(t->global_step - t->loop_start_step);
    fprintf(stderr, "\repoch %3" PRId64 " [%s] %5.1f%% loss %.4f %8.0f %s/s", epoch + 1, bar,
            100.0 * (double)step / (double)t->steps_per_epoch,
            sums[2] > 0 ? sums[0] / sums[2] : 0.0,
            s > 0 ? done * (double)c->batch_size * c->accumulate * t->world * upr / s : 0.0,
            unit);
    fflush(stderr);
    return;
  }
  if (c->progress_interval_s <= 0 || c->quiet) return;
  if (t->progress_last_ms < t->loop_start_ms) t->progress_last_ms = t->loop_start_ms;
  if (now - t->progress_last_ms < c->progress_interval_s * 1e3) return;
  t->progress_last_ms = now;
  const int64_t done = t->global_step - t->loop_start_step;
  const double elapsed_s = (now - t->loop_start_ms) / 1e3;
  const double eta_s = done > 0 ? elapsed_s / (double)done * (double)(t->total_steps -
                                                                      t->global_step) : 0;
  const double rate = elapsed_s > 0 ? (double)done * (double)c->batch_size * c->accumulate *
                                          t->world * upr / elapsed_s : 0;
  mpt_log(MPT_LOG_INFO, "progress: epoch %" PRId64 "/%" PRId64 " step %" PRId64 "/%" PRId64
          ", global step %" PRId64 "/%" PRId64 ", train loss %.4f (this epoch, rank 0), %.0f "
          "%s/s, ETA %dh%02dm%02ds (without evaluation)", epoch + 1, c->epochs, step,
          t->steps_per_epoch, t->global_step, t->total_steps,
          sums[2] > 0 ? sums[0] / sums[2] : 0.0, rate, unit, (int)(eta_s / 3600),
          (int)(eta_s / 60) % 60, (int)eta_s % 60);
}

/* Collective: the interval's mean loss over the ranks, the last norm, the learning rate of the
 * last step and the throughput. */
mpt_status mpt__train_step_line(mpt__trainer *t, double loss_rows, double rows) {
  (void)loss_rows;
  (void)rows;
  float f[2] = {(float)t->log_loss_rows, (float)t->log_rows};
  MPT_RETURN_IF(mpt__train_sum(t, f, 2));
  const double now = mpt_time_ms();
  const double units = (double)f[1] * (double)t->task->units_per_row;
  const double secs = (now - t->log_start_ms) / 1e3;
  mpt_log(MPT_LOG_INFO, "step %6" PRId64 "/%" PRId64 "  loss %.4f  norm %.3f  lr %.3e  %.0f "
          "%s/s", t->global_step, t->total_steps, f[1] > 0 ? (double)f[0] / f[1] : NAN,
          (double)t->last_norm, (double)mpt_lr_at(&t->schedule, t->c.optim.lr,
                                                  t->global_step - 1),
          secs > 0 ? units / secs : 0.0, t->task->unit ? t->task->unit : "samples");
  t->log_loss_rows = t->log_rows = 0;
  t->log_steps = 0;
  t->log_start_ms = mpt_time_ms();
  return MPT_OK;
}

double mpt__train_peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  if (f) fclose(f);
  if (kib < 0) {
    struct rusage ru;
    kib = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
  }
  return 1024.0 * (double)kib;
}

enum { REPORT_FIELDS = 5 };

/* Collective: rank 0 logs one line per rank: parameters, gradients and optimizer state (the
 * shard with ZeRO-1), peak resident memory, and bytes sent per step by the DDP engine (ring
 * model): planned (steps 0) or counted over the `steps` steps run. */
mpt_status mpt__train_memory_report(mpt__trainer *t, const char *when, int64_t steps) {
  mpt_optimizer_state os;
  MPT_RETURN_IF(mpt_optimizer_get_state(t->opt, &os));
  /* per rank: the whole model's, or the shard's where the stage shards it (ZeRO-2 the
   * gradients, ZeRO-3 the parameters too; the model state per rank then 16 N / W with AdamW) */
  const int stage = t->ddp && t->world > 1 ? mpt_ddp_zero_stage(t->ddp) : 0;
  const double pbytes = 4.0 * (double)mpt_model_param_count(t->model);
  const double sbytes = t->ddp ? 4.0 * (double)mpt_ddp_shard_count(t->ddp) : pbytes;
  double mine[REPORT_FIELDS] = {
      stage >= 3 ? sbytes : pbytes, stage >= 2 ? sbytes : pbytes, 4.0 * (double)os.nbuffers * (double)os.count, mpt__train_peak_rss_bytes(),
      !t->ddp ? 0.0 : steps > 0 ? mpt_ddp_sent_bytes(t->ddp) / (double)steps
                                : mpt_ddp_step_bytes(t->ddp)};
  double *all = malloc(sizeof mine * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "memory report of %d ranks", t->world);
  mpt_status st = MPT_OK;
  if (t->world > 1)
    st = mpt_comm_allgather_sync(t->comm, mine, all, (int64_t)sizeof mine, MPT_U8);
  else
    memcpy(all, mine, sizeof mine);
  const double mib = 1.0 / 1048576.0;
  for (int r = 0; st == MPT_OK && t->rank == 0 && r < t->world; r++) {
    const double *v = all + (size_t)r * REPORT_FIELDS;
    mpt_log(MPT_LOG_INFO, "memory %s, rank %d: parameters %.2f MiB, gradients %.2f MiB, "
            "optimizer state %.2f MiB%s, peak resident %.1f MiB; sent per step %.2f MiB (%s, "
            "ring model)", when, r, v[0] * mib, v[1] * mib, v[2] * mib,
            !t->ddp || !mpt_ddp_zero_stage(t->ddp) ? ""
            : mpt_ddp_zero_stage(t->ddp) == 1      ? " (ZeRO-1 shard)"
            : mpt_ddp_zero_stage(t->ddp) == 2      ? " (ZeRO-2 shard)"
                                                   : " (ZeRO-3 shard)", v[3] * mib,
            v[4] * mib, steps > 0 ? "counted" : "planned");
  }
  free(all);
  return st;
}

/* The machine's SGEMM rate as these ranks see it: every rank at once (after a barrier) runs
 * N x N x N products on its device (N 1024 on the CPU: mpt_op_gemm, the fp32 GEMM training
 * uses, sharing the cores as training does; N 4096 on a GPU: cuBLAS, each call synchronised) for
 * about 0.4 s (at least PEAK_MIN_CALLS calls) after one untimed call, timing each call. A rank's
 * rate is that of its fastest quarter of calls (on a shared machine a call another process
 * preempted takes longer: one such stretch in a single 0.25 s window read 26 GFLOP/s where the
 * peak is 150, and the model "reached 154 %" of it). Summed over the ranks, GFLOP/s. Not N 512 on
 * the CPU: with its three operands 1 MiB apart, oneDNN's AVX2 sgemm ran that product at 55
 * GFLOP/s on one AMD EPYC core where N 1024 ran at 104 and gpt-mini's Linears at 99-109 (the
 * model then "reached 116 %" of the peak). */
enum { PEAK_MIN_CALLS = 4, PEAK_MAX_CALLS = 1024 };

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static mpt_status measure_sgemm_peak(mpt__trainer *t, double *gflops) {
  const int gpu = t->device.type != MPT_DEVICE_CPU;
  const int64_t N = gpu ? 4096 : 1024, nn = N * N;
  float *buf = NULL;
  mpt_status st = mpt_device_alloc(t->device, 3 * (size_t)nn * sizeof(float), (void **)&buf);
  if (st == MPT_OK && !gpu)
    for (int64_t i = 0; i < 3 * nn; i++) buf[i] = (float)(i % 7) * 0.125f;
  else if (st == MPT_OK)
    st = mpt_op_fill(t->stream, buf, 3 * nn, 0.125f);
  float sync = 0;
  if (st == MPT_OK) st = mpt__train_sum(t, &sync, 1); /* start together */
  double times[PEAK_MAX_CALLS];
  int calls = -1; /* the first call is not timed (cuBLAS's set-up) */
  const double t0 = mpt_time_ms();
  double now = t0;
  while (st == MPT_OK && calls < PEAK_MAX_CALLS && (calls < PEAK_MIN_CALLS || now - t0 < 400)) {
    st = mpt_op_gemm(t->stream, 0, 0, N, N, N, 1.0f, buf, N, buf + nn, N, 0.0f, buf + 2 * nn, N);
    if (st == MPT_OK) st = mpt_stream_synchronize(t->stream, t->c.timeout_s * 1e3);
    const double t1 = mpt_time_ms();
    if (calls >= 0) times[calls] = t1 - now;
    calls++;
    now = t1;
  }
  float rate = 0;
  if (st == MPT_OK) {
    qsort(times, (size_t)calls, sizeof times[0], cmp_double);
    const double quarter_s = times[(calls - 1) / 4] / 1e3;
    rate = (float)(2.0 * (double)nn * (double)N / (quarter_s > 0 ? quarter_s : 1e-9) * 1e-9);
  }
  if (st == MPT_OK) st = mpt__train_sum(t, &rate, 1);
  mpt_device_free(t->device, buf);
  *gflops = rate;
  return st;
}

static int by_total_desc(const void *a, const void *b) {
  const mpt_op_time *x = a, *y = b;
  const double tx = x->forward_ms + x->backward_ms, ty = y->forward_ms + y->backward_ms;
  return tx < ty ? 1 : tx > ty ? -1 : 0;
}

/* --profile: the tape's op times (nn.h mpt_tape_set_profiling) as ms per step, largest first,
 * what the ops do not cover (optimizer, clipping, waiting for the all-reduce, loading), and
 * the GEMMs inside the ops (CPU: counted; a GPU's GEMMs are asynchronous and not counted). */
static void report_op_times(mpt__trainer *t) {
  const int64_t steps = t->prof_steps;
  if (steps < 1) { /* warned at the start when the run was known to be this short */
    mpt_log(MPT_LOG_INFO, "--profile: no step after the first was run, so no op was timed");
    return;
  }
  mpt_op_time rows[MPT_TAPE_PROFILE_MAX_OPS];
  const int n = mpt_tape_op_times(t->tape, rows, MPT_TAPE_PROFILE_MAX_OPS);
  qsort(rows, (size_t)n, sizeof rows[0], by_total_desc);
  const double per = 1.0 / (double)steps, step_ms = t->prof_ms * per;
  mpt_log(MPT_LOG_INFO, "op times on this rank, ms per step (mean of %lld steps after the "
          "first; step %.1f ms):", (long long)steps, step_ms);
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11s %11s %10s %8s", "op", "nodes", "forward", "backward",
          "total", "of step");
  double fwd = 0, bwd = 0;
  for (int i = 0; i < n; i++) {
    const double f = rows[i].forward_ms * per, b = rows[i].backward_ms * per;
    fwd += f;
    bwd += b;
    mpt_log(MPT_LOG_INFO, "  %-24s %8.1f %11.2f %11.2f %10.2f %7.1f%%", rows[i].name,
            (double)rows[i].nodes * per, f, b, f + b, 100 * (f + b) / step_ms);
  }
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11.2f %11.2f %10.2f %7.1f%%", "all ops", "", fwd, bwd,
          fwd + bwd, 100 * (fwd + bwd) / step_ms);
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11s %11s %10.2f %7.1f%%", "rest of the step", "", "", "",
          step_ms - fwd - bwd, 100 * (step_ms - fwd - bwd) / step_ms);
  if (t->gemm_calls > 0)
    mpt_log(MPT_LOG_INFO, "  %-24s %8.1f %11s %11s %10.2f %7.1f%%  (%.1f GFLOP/s)",
            "GEMMs inside the ops", (double)t->gemm_calls * per, "", "", t->gemm_ms * per,
            100 * t->gemm_ms * per / step_ms,
            t->gemm_ms > 0 ? t->gemm_flop / t->gemm_ms * 1e-6 : 0.0);
}

/* Collective: the slowest rank's per-step phase times (max over ranks of the means), the
 * throughput of the run, its arithmetic rate against the SGEMM peak (when the task counts its
 * FLOPs), DDP's and DataParallel's figures, --profile's table. */
mpt_status mpt__train_report_end(mpt__trainer *t, mpt__breakdown *bd) {
  const double n = t->timed_steps ? (double)t->timed_steps : 1;
  const mpt_ddp_stats ds = t->ddp ? mpt_ddp_get_stats(t->ddp) : (mpt_ddp_stats){0};
  /* DP: the all-reduce of the reduced gradients follows backward, so all of it is exposed; on
   * a GPU the backward events include the wait for the last bucket, reported on its own */
  const double exposed = t->dp ? t->sum_dp_allreduce : ds.sum_exposed_comm_ms;
  const double backward =
      t->sum_backward - (t->phase_ev && !t->dp && t->ddp ? ds.sum_exposed_comm_ms : 0);
  const double allreduce = t->dp ? t->sum_dp_allreduce : ds.sum_allreduce_ms;
  float v[6] = {(float)(t->sum_forward / n), (float)(backward / n), (float)(exposed / n),
                (float)(t->sum_optimizer / n), (float)(t->sum_total / n),
                (float)(allreduce / n)};
  if (t->world > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(t->comm, v, v, 6, MPT_F32, MPT_REDUCE_MAX));
  bd->forward_ms = v[0];
  bd->backward_ms = v[1];
  bd->exposed_comm_ms = v[2];
  bd->optimizer_ms = v[3];
  bd->total_ms = v[4];
  bd->allreduce_ms = v[5];
  bd->hidden_fraction = !t->dp && ds.sum_allreduce_ms > 0
                            ? ds.sum_hidden_ms / ds.sum_allreduce_ms : 0;
  bd->steps = t->timed_steps;
  bd->forward_includes_backward = t->dp != NULL;
  const int64_t steps = t->global_step - t->loop_start_step;
  if (steps > 0) {
    const mpt_trainer_config *c = &t->c;
    const double units = (double)steps * (double)c->batch_size * c->accumulate * t->world *
                         (double)t->task->units_per_row;
    const double secs = t->train_ms / 1e3;
    const double rate = secs > 0 ? units / secs : 0;
    char flops[96] = "";
    if (t->task->flops_per_unit > 0)
      snprintf(flops, sizeof flops, " (%.1f GFLOP/s of model arithmetic, all ranks)",
               t->task->flops_per_unit * rate * 1e-9);
    mpt_log(MPT_LOG_INFO, "done: %" PRId64 " steps, %.0f %s/s overall%s; per step on rank 0: "
            "forward %.1f ms, backward (all-reduce included) %.1f ms, clip + optimizer %.1f ms",
            steps, rate, t->task->unit ? t->task->unit : "samples", flops,
            t->sum_forward / n, t->sum_backward / n, t->sum_optimizer / n);
    if (t->task->flops_per_unit > 0) {
      double peak = 0;
      MPT_RETURN_IF(measure_sgemm_peak(t, &peak));
      mpt_log(MPT_LOG_INFO, "SGEMM peak measured now on these ranks: %.1f GFLOP/s; the model's "
              "arithmetic reached %.1f %% of it", peak,
              peak > 0 ? 100 * t->task->flops_per_unit * rate * 1e-9 / peak : 0.0);
    }
  }
  if (t->dp)
    mpt_log(MPT_LOG_INFO, "per-step breakdown (ms, mean over %" PRId64 " steps, slowest rank): "
            "forward+backward %.3f (DP: one pass per device)  exposed comm %.3f  optimizer %.3f"
            "  total %.3f", bd->steps, bd->forward_ms, bd->exposed_comm_ms, bd->optimizer_ms,
            bd->total_ms);
  else
    mpt_log(MPT_LOG_INFO, "per-step breakdown (ms, mean over %" PRId64 " steps, slowest rank): "
            "forward %.3f  backward %.3f  exposed comm %.3f  optimizer %.3f  total %.3f",
            bd->steps, bd->forward_ms, bd->backward_ms, bd->exposed_comm_ms, bd->optimizer_ms,
            bd->total_ms);
  if (t->ddp) {
    const double m = ds.steps > 0 ? (double)ds.steps : 1;
    mpt_log(MPT_LOG_INFO, "all-reduce %.3f ms per step in %d bucket(s), %.0f%% hidden behind "
            "backward (rank 0)", bd->allreduce_ms, mpt_ddp_num_buckets(t->ddp),
            100.0 * bd->hidden_fraction);
    mpt_log(MPT_LOG_INFO, "DDP (rank 0, mean over %lld steps): all-reduce %.1f ms per step in "
            "%d bucket(s), %.0f %% of it hidden behind backward; exposed (waited after "
            "backward) %.1f ms", (long long)ds.steps, ds.sum_allreduce_ms / m,
            mpt_ddp_num_buckets(t->ddp),
            ds.sum_allreduce_ms > 0 ? 100 * ds.sum_hidden_ms / ds.sum_allreduce_ms : 0.0,
            ds.sum_exposed_comm_ms / m);
  }
  if (t->dp) {
    const mpt_dp_stats ps = mpt_dp_get_stats(t->dp);
    const double m = ps.steps ? (double)ps.steps : 1;
    char per[512] = "";
    size_t used = 0;
    for (int k = 0; k < mpt_dp_num_devices(t->dp) && used < sizeof per; k++) {
      char name[32];
      used += (size_t)snprintf(per + used, sizeof per - used, "%s%s %.3f", k ? ", " : "",
                               mpt_device_str(mpt_dp_device(t->dp, k), name, sizeof name),
                               ps.sum_replica_ms[k] / m);
    }
    mpt_log(MPT_LOG_INFO, "DP over %d devices (rank 0): step %.3f ms; replica work (ms) %s; the "
            "first device spends %.3f ms beyond the others (broadcast %.3f, gather %.3f, reduce "
            "%.3f)", mpt_dp_num_devices(t->dp), ps.sum_step_ms / m, per,
            ps.sum_first_extra_ms / m, ps.sum_broadcast_ms / m, ps.sum_gather_ms / m,
            ps.sum_reduce_ms / m);
  }
  if (t->c.profile) report_op_times(t);
  return MPT_OK;
}

/* JSON has no NaN / Infinity: null for them. */
static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

/* "stragglers": the figures of straggler.c (null ratios when there was no interval: one rank,
 * or no step line). The ranks' hosts as the comm gathered them. */
static void write_stragglers(FILE *f, const mpt__trainer *t) {
  const int have = t->strag_intervals > 0;
  fprintf(f, "  \"stragglers\": {\"intervals\": %" PRId64 ", \"warnings\": %" PRId64
          ", \"warn_above\": ", t->strag_intervals, t->strag_warnings);
  json_num(f, t->c.straggler_warn);
  const struct {
    const char *name;
    int slow, fast;
    double ratio, slow_ms, fast_ms;
  } k[2] = {{"last", t->strag_last_slowest, t->strag_last_fastest, t->strag_last_ratio,
             t->strag_last_slow_ms, t->strag_last_fast_ms},
            {"max", t->strag_max_slowest, t->strag_max_fastest, t->strag_max_ratio,
             t->strag_max_slow_ms, t->strag_max_fast_ms}};
  for (int i = 0; i < 2; i++) {
    if (!have) {
      fprintf(f, ", \"%s\": null", k[i].name);
      continue;
    }
    fprintf(f, ", \"%s\": {\"ratio\": ", k[i].name);
    json_num(f, k[i].ratio);
    fprintf(f, ", \"slowest_rank\": %d, \"slowest_host\": \"%s\", \"slowest_compute_ms\": ",
            k[i].slow, mpt_comm_rank_host(t->comm, k[i].slow));
    json_num(f, k[i].slow_ms);
    fprintf(f, ", \"fastest_rank\": %d, \"fastest_host\": \"%s\", \"fastest_compute_ms\": ",
            k[i].fast, mpt_comm_rank_host(t->comm, k[i].fast));
    json_num(f, k[i].fast_ms);
    fprintf(f, "}");
  }
  fprintf(f, "},\n");
}

/* Rank 0: {"config": {...}, "epochs": [...], "final": {...}, "stragglers": {...},
 * "breakdown": {...}}, written to "<path>.tmp.<pid>" and renamed over path once complete
 * (core/atomic_file.h; a failed write leaves an earlier file whole: faults.md F51). The keys name a classifier's figures (train_accuracy, test_loss,
 * test_accuracy, samples_per_sec); for another task they hold its metric, its evaluation loss
 * and its units per second ("unit" says which). */
mpt_status mpt__train_write_metrics(mpt__trainer *t, const mpt__breakdown *b) {
  const mpt_trainer_config *c = &t->c;
  const char *path = c->metrics_json;
  mpt__afile af; /* written whole, then renamed into place (core/atomic_file.h) */
  MPT_RETURN_IF(mpt__afile_open(&af, path, "metrics file"));
  FILE *f = af.f;
  const char *mode = t->dp ? (t->world > 1 ? "dp+ddp" : "dp") : (t->world > 1 ? "ddp" : "single");
  fprintf(f, "{\n  \"config\": {\"model\": \"%s\", \"batch_size\": %" PRId64 ", \"world_size\": "
          "%d, \"seed\": %" PRIu64 ", \"optimizer\": \"%s\", \"lr\": ", c->model_name,
          c->batch_size, t->world, c->seed, mpt_optimizer_kind_name(c->optim.kind));
  json_num(f, c->optim.lr);
  fprintf(f, ", \"epochs\": %" PRId64 ", \"launcher\": \"%s\", \"bucket_cap_mb\": ", c->epochs,
          mpt_launcher_name(mpt_comm_launcher(t->comm)));
  json_num(f, c->ddp.bucket_cap_mb);
  fprintf(f, ", \"overlap\": %s, \"accumulate\": %d, \"mode\": \"%s\", \"unit\": \"%s\"},\n",
          c->ddp.overlap ? "true" : "false", c->accumulate, mode,
          t->task->unit ? t->task->unit : "samples");
  fprintf(f, "  \"model\": \"%s\", \"batch_size\": %" PRId64 ", \"world_size\": %d, \"seed\": %"
          PRIu64 ",\n  \"epochs\": [\n", c->model_name, c->batch_size, t->world, c->seed);
  for (int64_t i = 0; i < t->nepochs; i++) {
    const mpt__epoch_metrics *e = &t->epochs[i];
    fprintf(f, "    {\"epoch\": %" PRId64 ", \"train_loss\": ", e->epoch);
    json_num(f, e->train_loss);
    fprintf(f, ", \"train_accuracy\": ");
    json_num(f, e->train_metric);
    fprintf(f, ", \"test_loss\": ");
    json_num(f, e->eval_loss);
    fprintf(f, ", \"test_accuracy\": ");
    json_num(f, e->eval_metric);
    fprintf(f, ", \"samples_per_sec\": ");
    json_num(f, e->units_per_s);
    fprintf(f, ", \"seconds\": ");
    json_num(f, e->seconds);
    fprintf(f, ", \"lr_first\": ");
    json_num(f, e->lr_first);
    fprintf(f, ", \"lr_last\": ");
    json_num(f, e->lr_last);
    fprintf(f, ", \"steps\": %" PRId64 "}%s\n", e->steps, i + 1 < t->nepochs ? "," : "");
  }
  const mpt__epoch_metrics *last = t->nepochs ? &t->epochs[t->nepochs - 1] : NULL;
  fprintf(f, "  ],\n  \"final\": {\"test_accuracy\": ");
  json_num(f, last ? last->eval_metric : NAN);
  fprintf(f, ", \"test_loss\": ");
  json_num(f, t->eval_loss);
  fprintf(f, ", \"samples_per_sec\": ");
  json_num(f, last ? last->units_per_s : NAN);
  fprintf(f, ", \"global_step\": %" PRId64 ", \"preempted\": %s},\n", t->global_step,
          t->preempted ? "true" : "false");
  write_stragglers(f, t);
  fprintf(f, "  \"breakdown\": {\"forward_ms\": ");
  json_num(f, b->forward_ms);
  fprintf(f, ", \"backward_ms\": ");
  json_num(f, b->backward_ms);
  fprintf(f, ", \"exposed_comm_ms\": ");
  json_num(f, b->exposed_comm_ms);
  fprintf(f, ", \"optimizer_ms\": ");
  json_num(f, b->optimizer_ms);
  fprintf(f, ", \"total_ms\": ");
  json_num(f, b->total_ms);
  fprintf(f, ", \"allreduce_ms\": ");
  json_num(f, b->allreduce_ms);
  fprintf(f, ", \"hidden_fraction\": ");
  json_num(f, b->hidden_fraction);
  fprintf(f, ", \"steps\": %" PRId64 ", \"forward_includes_backward\": %s}\n}\n", b->steps,
          b->forward_includes_backward ? "true" : "false");
  const int bad = fflush(f) != 0 || ferror(f); /* what fprintf could not write */
  const int e = errno;
  mpt_status st = bad ? MPT_EIO : mpt__afile_commit(&af);
  mpt__afile_abort(&af);
  if (bad) return MPT_FAIL(MPT_EIO, "cannot write metrics file '%s': %s", path, strerror(e));
  if (st != MPT_OK) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", mpt_last_error());
    return MPT_FAIL(st, "cannot write metrics file '%s': %s", path, detail);
  }
  return MPT_OK;
}

/* Collective: every rank appends its events to the one file in turn. */
mpt_status mpt__train_write_trace(mpt__trainer *t) {
  if (mpt_trace_dropped(t->trace) > 0)
    mpt_log(MPT_LOG_WARN, "--trace: %" PRId64 " event(s) dropped on rank %d (the trace holds %"
            PRId64 "): the trace is incomplete", mpt_trace_dropped(t->trace), t->rank,
            mpt_trace_count(t->trace));
  for (int r = 0; r < t->world; r++) {
    if (r == t->rank)
      MPT_RETURN_IF(mpt_trace_append(t->trace, t->c.trace, r == 0, r == t->world - 1));
    if (t->world > 1) MPT_RETURN_IF(mpt_comm_barrier_sync(t->comm));
  }
  return MPT_OK;
}
