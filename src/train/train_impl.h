/* The training loop's state, shared by the files of src/train (trainer.h is the public side).
 * Everything here runs on the training thread; the functions marked collective are called by
 * every rank at the same point. */
#ifndef MPT_TRAIN_IMPL_H
#define MPT_TRAIN_IMPL_H

#include <stdio.h>

#include "mpitrain/ckpt.h"
#include "mpitrain/dp.h"
#include "mpitrain/ops.h"
#include "mpitrain/trainer.h"

/* Rows of an evaluation batch when a sample is one row (the classifier's test set). */
#define MPT__TRAIN_EVAL_ROWS 1000

/* One epoch's figures, reduced over the ranks. */
typedef struct mpt__epoch_metrics {
  int64_t epoch; /* from 1 */
  int64_t steps;
  double train_loss, train_metric; /* NAN: none */
  double eval_loss, eval_metric;   /* NAN: none */
  double units_per_s;              /* training units over all ranks / training seconds */
  double seconds;                  /* wall time of the epoch, evaluation included */
  double lr_first, lr_last;        /* the scheduled learning rate of its first and last step */
} mpt__epoch_metrics;

/* Per-step phase times (ms, mean over the timed steps, max over the ranks). */
typedef struct mpt__breakdown {
  double forward_ms, backward_ms, exposed_comm_ms, optimizer_ms, total_ms;
  double allreduce_ms, hidden_fraction;
  int64_t steps;
  int forward_includes_backward; /* DP: each device runs both in one pass */
} mpt__breakdown;

typedef struct mpt__trainer {
  mpt_trainer_config c; /* the caller's config, defaults filled in and resume auto resolved */
  const mpt_train_task *task;
  mpt_comm *comm;
  int rank, world;
  mpt_model *model;
  mpt_device device;
  mpt_stream *stream;  /* the model's compute stream (inline on the CPU) */
  mpt_tape *tape;
  mpt_optimizer *opt;
  struct mpt__ckpt_async *ckpt_writer; /* rank 0, --checkpoint-async: the write in flight */
  mpt_ddp *ddp;        /* more than one rank */
  mpt_dp *dp;          /* dp_devices: DataParallel over this rank's devices */
  mpt_comm *grad_comm; /* on a GPU: the gradients' comm (NCCL, else MPI staged) */
  int threads;
  /* a GPU's copy of the current batch (grown when a batch is larger) */
  void *dev_x, *dev_y;
  size_t dev_x_nbytes, dev_y_nbytes;
  float *host_params;  /* on a GPU: a host copy of the parameters */
  /* data */
  mpt_sampler *train_sampler, *eval_sampler;
  mpt_loader *train_loader, *eval_loader;
  int64_t samples_per_batch; /* loader batch: task's, else batch_size */
  int64_t batches_per_epoch; /* micro-batches per epoch per rank */
  int64_t steps_per_epoch, total_steps;
  int64_t global_batch;      /* G: data samples per optimizer step over all ranks */
  int64_t start_epoch, skip_steps; /* resume: first epoch, and steps of it already taken */
  int resuming;              /* resume_meta is the checkpoint's (mpt_trainer_plan_resume) */
  mpt_ckpt_meta resume_meta;
  int64_t global_step, loop_start_step;
  mpt_lr_schedule schedule;
  /* non-finite handling */
  int64_t skipped_nonfinite, consecutive_skipped;
  int step_nonfinite;
  float last_norm; /* the last step's gradient norm before clipping (NAN: clipping off) */
  /* preemption: a local flag, all-reduced (max) on the comm stream while the step computes */
  int32_t stop_local, stop_global;
  mpt_event *stop_event;
  int preempted, stopped;
  /* timing: sums over the timed steps (ms) */
  double sum_forward, sum_backward, sum_optimizer, sum_total, sum_dp_allreduce;
  int64_t timed_steps;
  double train_ms;      /* training wall time (evaluation and checkpoints excluded) */
  double loop_start_ms, progress_last_ms;
  /* on a GPU (not DP): phase events, [3k] forward start, [3k+1] forward end, [3k+2] backward
   * end of micro-batch k; [3K] optimizer start, [3K+1] its end */
  mpt_event **phase_ev;
  int phase_nev;
  /* output */
  int progress_bar;
  int terminal_fd;      /* log_file: the stderr the rank started with */
  mpt_trace *trace;
  mpt__epoch_metrics *epochs;
  int64_t nepochs;
  /* the step lines (log_every): this interval's sums */
  double log_loss_rows, log_rows;
  int64_t log_steps;
  double log_start_ms;
  /* --profile */
  double prof_ms;
  int64_t prof_steps, gemm_calls;
  double gemm_ms, gemm_flop;
  /* stragglers (straggler.c): the sums at the last step line, and the figures so far */
  double strag_busy, strag_wait, strag_start_ms;
  int64_t strag_steps, strag_intervals, strag_warnings;
  double strag_last_ratio, strag_max_ratio;
  int strag_max_slowest, strag_max_fastest, strag_last_slowest, strag_last_fastest;
  double strag_last_slow_ms, strag_last_fast_ms, strag_max_slow_ms, strag_max_fast_ms;
  /* the last evaluation */
  double eval_loss, eval_metric;
  /* --gemm tune (gemm_tune.c): recording the first step's shapes; the cache file */
  int gemm_tune_pending;
  char gemm_cache_path[4200];
} mpt__trainer;

/* A built-in task (task_images.c, task_tokens.c): the public part first, then its destructor,
 * which mpt_train_task_free calls. */
typedef struct mpt__builtin_task {
  mpt_train_task task;
  void (*destroy)(void *self);
} mpt__builtin_task;

/* ---- step.c ---- */
/* One optimizer step over the micro-batches of the epoch's step `step`; sums[3] (loss x rows,
 * metric, rows, this epoch) grow. *ran_out: the epoch had no batch left for the step. */
mpt_status mpt__train_step(mpt__trainer *t, int64_t step, double *sums, int *ran_out);
/* The micro-batches of step `step`, the samples they hold together on this rank, and the
 * real samples (not the sampler's padding) of the step over all ranks. */
void mpt__train_step_group(const mpt__trainer *t, int64_t step, int *k, int64_t *samples,
                           int64_t *real_global);
/* A loader batch as the task's input and target (task->batch_view or the default). */
mpt_status mpt__train_view(const mpt__trainer *t, const mpt_batch *b, mpt_train_batch *out);
/* The first `rows` rows of a host batch on the model's device (the batch itself on the CPU). */
mpt_status mpt__train_stage(mpt__trainer *t, const mpt_train_batch *b, int64_t rows,
                            mpt_tensor *x, mpt_tensor *y);
mpt_status mpt__train_phase_events_init(mpt__trainer *t);

/* ---- signals.c ---- */
/* The signal received (0: none). */
int mpt__train_signal(void);
/* The comm dumped on SIGUSR2 and fatal signals (NULL: none). Any thread. */
void mpt__train_set_dump_comm(mpt_comm *comm);
/* Installs the fatal-signal handlers that dump it (once per process, after MPI's). */
void mpt__train_catch_fatal(void);
/* SIGUSR2 dumps written so far. */
int mpt__train_dumps(void);
/* The stop vote: started before a step (asynchronous on the comm stream), finished after it. */
mpt_status mpt__train_stop_vote_start(mpt__trainer *t);
mpt_status mpt__train_stop_vote_finish(mpt__trainer *t);

/* ---- eval.c ---- */
/* Collective: the evaluation set in evaluation mode, at most eval_max_batches per rank; the
 * mean loss and metric over all ranks' real rows into t->eval_loss / eval_metric. */
mpt_status mpt__train_evaluate(mpt__trainer *t);
/* Collective: sums n floats over the ranks, in place. */
mpt_status mpt__train_sum(mpt__trainer *t, float *v, int n);

/* ---- ckpt.c ---- */
mpt_status mpt__train_check_checkpoint_dir(const mpt_trainer_config *c);
/* Stops a run whose model is no longer finite; `step` names the step just run (from 1, as the
 * step lines and checkpoints number them). */
mpt_status mpt__train_check_model_healthy(mpt__trainer *t, const char *when, int64_t step);
mpt_status mpt__train_save_checkpoint(mpt__trainer *t, int64_t epoch, int64_t step_in_epoch);
/* Collective: rank 0 waits (deadline timeout_s) for the background checkpoint in flight, if any,
 * and every rank returns its outcome. MPT_OK at once without --checkpoint-async. */
mpt_status mpt__train_ckpt_drain(mpt__trainer *t);
/* Rank 0, on the way out after an error: waits for the write in flight and logs a failure. */
void mpt__train_ckpt_abandon(mpt__trainer *t);
mpt_status mpt__train_resume(mpt__trainer *t);
mpt_status mpt__train_check_run_options(mpt__trainer *t);
/* MPT_EINVAL naming --init-from when `file` (what --resume `given` resolved to) is an llm.c model
 * file, not a checkpoint; MPT_OK otherwise (also when it cannot be opened: the reader says why). */
mpt_status mpt__train_refuse_model_file(const char *given, const char *file);
/* The optimizer's whole state for a checkpoint (ZeRO-1: gathered), and back. */
mpt_status mpt__train_opt_whole(mpt__trainer *t, int gather, int need, mpt_optimizer **whole);
mpt_status mpt__train_opt_whole_done(mpt__trainer *t, mpt_optimizer *whole, int scatter);

/* ---- resume.c ---- */
/* The real data samples an epoch trains on: the data set (less the tail drop_last drops),
 * at most max_steps x G. The same on every number of ranks that keeps G (but drop_last). */
int64_t mpt__train_epoch_samples(const mpt__trainer *t);
/* Every rank, before anything is written: the checkpoint of the plan fits this run (seed,
 * stop_at_step, data set, the epoch's samples, the cursor): a clear error otherwise. */
mpt_status mpt__train_check_resume_fit(mpt__trainer *t);

/* ---- checks.c ---- */
mpt_status mpt__train_check_same_options(mpt_comm *comm, int argc, char **argv);
mpt_status mpt__train_check_outputs(const mpt__trainer *t);
mpt_status mpt__train_check_epoch(mpt__trainer *t, int64_t epoch);
mpt_status mpt__train_check_replicas(mpt__trainer *t);
mpt_status mpt__train_params_on_host(mpt__trainer *t, float **host);
void mpt__train_maybe_poison(mpt__trainer *t, mpt_train_batch *b, int k);
void mpt__train_maybe_perturb(mpt__trainer *t);
void mpt__train_maybe_kill_self(mpt__trainer *t);
/* Fault injection: 1 when this rank skips the global step (MPT_TEST_SKIP_STEP_RANK / _STEP);
 * global_step is then advanced. */
int mpt__train_maybe_skip_step(mpt__trainer *t);
/* Fault injection: MPT_TEST_STOP_RANK / MPT_TEST_STOP_STEP: this rank raises SIGSTOP. */
void mpt__train_maybe_stop_self(mpt__trainer *t);
/* Fault injection: MPT_TEST_SLOW_RANK / MPT_TEST_SLOW_PCT: this rank sleeps PCT % of `ms` (the
 * forward it just computed). */
void mpt__train_maybe_slow(mpt__trainer *t, double ms);

/* ---- straggler.c ---- */
/* Collective, at each step line: the ranks' compute time per step, rank 0's line. */
mpt_status mpt__train_stragglers(mpt__trainer *t);

/* ---- gemm_tune.c ---- */
/* Collective, at set-up after the thread count is set: under MPT_CPU_GEMM_TUNE on the CPU, rank
 * 0's cache (when it holds for this host) becomes every rank's table, and the shapes of the
 * first step are recorded (gemm_tune_pending). Nothing otherwise. */
mpt_status mpt__train_gemm_tune_begin(mpt__trainer *t);
/* Collective, after the first step: the recorded shapes the table lacks are timed on every rank
 * at once, rank 0's choices become every rank's table, rank 0 logs them and writes the cache. */
mpt_status mpt__train_gemm_tune_end(mpt__trainer *t);

/* ---- report.c ---- */
mpt_status mpt__train_log_setup(mpt__trainer *t);
mpt_status mpt__train_log_check(mpt__trainer *t);
void mpt__train_log_start(mpt__trainer *t);
void mpt__train_progress(mpt__trainer *t, int64_t epoch, int64_t step, const double *sums);
mpt_status mpt__train_step_line(mpt__trainer *t, double loss_rows, double rows);
mpt_status mpt__train_memory_report(mpt__trainer *t, const char *when, int64_t steps);
mpt_status mpt__train_report_end(mpt__trainer *t, mpt__breakdown *bd);
mpt_status mpt__train_write_metrics(mpt__trainer *t, const mpt__breakdown *bd);
mpt_status mpt__train_write_trace(mpt__trainer *t);
void mpt__train_schedule_str(const mpt_lr_schedule *s, char *out, size_t n);
double mpt__train_peak_rss_bytes(void);

#endif
