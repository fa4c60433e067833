/* The trainer's state, shared by train.c (the training loop) and train_checks.c (agreement
 * checks across ranks, fault injection for the tests, and host copies of the parameters). */
#ifndef MPT_CLI_TRAIN_IMPL_H
#define MPT_CLI_TRAIN_IMPL_H

#include "cli/metrics.h"
#include "cli/options.h"
#include "mpitrain/comm.h"
#include "mpitrain/data.h"
#include "mpitrain/ddp.h"
#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

#define EVAL_BATCH 1000

typedef struct trainer {
  const mpt_cli_options *o;
  mpt_comm *comm;
  int rank, world;
  mpt_device device;
  mpt_stream *stream;
  mpt_model *model;
  mpt_tape *tape;
  mpt_optimizer *opt;
  mpt_ddp *ddp;
  mpt_dp *dp; /* --mode dp: DataParallel over this rank's devices (hybrid with ddp) */
  mpt_comm *grad_comm; /* on a GPU: the gradient comm (NCCL, else MPI staged); t->comm stays
                          the host comm for metrics, votes and checkpoints */
  void *dev_x, *dev_y; /* on a GPU: the batch copied to the device ([rows, C, H, W], [rows]) */
  int64_t dev_rows;
  float *host_params;  /* on a GPU: a host copy of the parameters (replica check, save) */
  mpt_dataset train, test;
  mpt_sampler *train_sampler, *test_sampler;
  mpt_loader *train_loader, *test_loader;
  mpt_trace *trace;
  mpt_lr_schedule schedule;
  int64_t steps_per_epoch, global_step;
  mpt_epoch_metrics *epochs;
  int64_t nepochs;
  /* sums of per-step times (ms) for the breakdown */
  double sum_forward, sum_backward, sum_optimizer, sum_total, sum_dp_allreduce;
  int64_t timed_steps;
  /* on a GPU (not DP): the phases timed by events on the compute stream, read after the step's
   * synchronisation (host times would be enqueue times): [3k] forward start, [3k+1] forward
   * end, [3k+2] backward end of micro-batch k; [3K] optimizer start, [3K+1] its end */
  mpt_event **phase_ev;
  int phase_nev;
  int progress;
  /* preemption (SIGTERM): the local flag is all-reduced (max) on the comm stream during each
   * step, so every rank stops after the same step */
  int32_t stop_local, stop_global;
  mpt_event *stop_event;
  int preempted;
  int stopped;            /* --stop-at-step reached */
  int64_t start_epoch;    /* resume: first epoch to run */
  int64_t skip_steps;     /* resume: steps of start_epoch already taken */
  int64_t skipped_nonfinite; /* --skip-nonfinite: optimizer steps skipped */
  int64_t consecutive_skipped; /* ... of them in a row, up to the last step */
  int step_nonfinite;     /* a micro-batch of the running step had a non-finite loss */
  /* log_setup.c: the one-line progress when stderr is not a terminal */
  double progress_last_ms, loop_start_ms;
  int terminal_fd; /* --log-file: the stderr the rank was started with (else -1 or 0) */
  int64_t loop_start_step;
  mpt_cli_options resolved; /* train_auto.c: the options after --resume auto was resolved */
} trainer;

mpt_status trainer_params_on_host(trainer *t, float **host);
void trainer_maybe_poison(trainer *t, mpt_batch *b, int k);
void trainer_maybe_perturb(trainer *t);
mpt_status trainer_check_replicas(trainer *t);
void trainer_maybe_kill_self(trainer *t);
mpt_status trainer_check_epoch(trainer *t, int64_t epoch);
mpt_status trainer_check_output_path(const char *option, const char *path);
/* --checkpoint-dir at start (rank 0): a directory, created if missing, that can be written, and
 * that holds no checkpoint of another run. Its checkpoints belong to this run only when --resume
 * names it or a file in it; otherwise --keep would rotate them away and the directory's latest
 * would mix two runs. Errors: MPT_EINVAL (not a directory, holds another run's checkpoints,
 * naming the latest and the way out), MPT_EIO (cannot create or write it). */
mpt_status trainer_check_checkpoint_dir(const mpt_cli_options *o);
/* Before allocating a model on the CPU: parameters, gradients and optimizer state (1 buffer for
 * SGD momentum, 2 for AdamW), per DP replica (ndev), must fit in this host's available memory
 * shared by its ranks; otherwise the kernel's OOM killer ends the job with no message (seen with
 * --hidden 100000,100000). A rough lower bound: activations and the data come on top. Errors:
 * MPT_ENOMEM naming both sizes. */
mpt_status trainer_check_model_fits(trainer *t, int ndev);
mpt_status trainer_save_params(trainer *t, const char *path);
mpt_status trainer_check_same_options(trainer *t);
/* The same, for a trainer without a `trainer` (the GPT's): every rank of `comm`. */
mpt_status trainer_check_same_options_on(mpt_comm *comm, const mpt_cli_options *o);

/* train_watchdog.c */
typedef struct trainer_watchdog trainer_watchdog;
/* Starts a thread that, unless trainer_watchdog_stop comes first, prints what the comm bootstrap
 * waits for (mpt_comm_bootstrap_stage) after timeout_s and ends the process with status 1: the
 * deadline of MPI_Init_thread, which has none. Errors: MPT_ENOMEM. */
mpt_status trainer_watchdog_start(double timeout_s, trainer_watchdog **w);
/* Stops and joins it; NULL is a no-op. */
void trainer_watchdog_stop(trainer_watchdog *w);

/* train_data.c */
/* Collective, after loading the data: every rank must have loaded the same training and test
 * sets (sample counts, image size, classes, CRC-32 of images and labels as loaded). Errors:
 * MPT_EMISMATCH on every rank, naming what differs, the first rank that differs from rank 0 and
 * the file each of the two read; MPT_ENOMEM. */
mpt_status trainer_check_same_data(trainer *t);
/* Local, after loading the data: the training and test images have the shape --model takes
 * (cnn: [C, H, W] of its configuration; mlp: C x H x W values, its input size), so a folder
 * whose test images differ fails at start-up, not after the first epoch. Errors: MPT_ESHAPE
 * naming the file, its image shape and the model's. */
mpt_status trainer_check_data_shape(trainer *t);
/* Rank 0, at start-up: --save-params, --metrics-json and --trace are none of the run's inputs
 * (the four --data files, the --resume checkpoint) and no two of them the same file (by device
 * and inode, or by path for files not yet there): each is replaced at the end of the run.
 * Errors: MPT_EINVAL naming the option, the path and what it holds. */
mpt_status trainer_check_outputs(const mpt_cli_options *o);

/* train_ckpt.c */
/* Stops (MPT_ENONFINITE, naming `when` and the learning rate) a model no longer fit to train or
 * be checkpointed: non-finite parameters or buffers, or 3 optimizer steps in a row skipped for
 * non-finite gradients. Every rank decides the same (the replicas are identical). */
mpt_status trainer_check_model_healthy(trainer *t, const char *when);
/* Collective: writes a checkpoint recording that `step_in_epoch` steps of `epoch` are done
 * (step_in_epoch 0: epoch `epoch` is next). Not written, with a warning, right after a step
 * skipped for non-finite gradients. */
mpt_status trainer_save_checkpoint(trainer *t, int64_t epoch, int64_t step_in_epoch);
/* Collective: --resume, every rank loads the same checkpoint and the loop continues after it;
 * a checkpoint of another world size, seed or epoch length is refused. */
mpt_status trainer_resume(trainer *t);

/* log_setup.c */
/* After the comm is up: --log-file (this rank's stdout and stderr to FILE.RANK, info lines on
 * every rank), --quiet (warnings and errors only). Errors: MPT_EIO naming the file. */
mpt_status trainer_log_setup(trainer *t);
/* Every rank's line of how it was launched: rank, world, local rank, host, device, launcher
 * (stderr; nothing with --quiet). */
void trainer_log_rank_line(mpt_comm *comm, mpt_device device, int quiet);
/* Rank 0, stderr not a terminal: one progress line (steps, samples/s, ETA) at most every
 * --progress-interval seconds. `sums` are this epoch's (loss * rows, correct, rows) so far. */
void trainer_progress_line(trainer *t, int64_t epoch, int64_t step, const double *sums);
/* --log-file: the failure's one line also on the stderr the rank was started with (the
 * launcher's), naming the log file, so that a failed job does not end silently there. */
void trainer_log_failure_note(trainer *t, mpt_status st);
/* At the end of a run with --log-file: MPT_EIO when a write to this rank's log failed (stdio's
 * error flags on stdout and stderr, after a flush), so that a log lost to a full disk is not
 * an exit status of 0; trainer_log_failure_note then names it on the launcher's stderr. */
mpt_status trainer_log_check(trainer *t);

/* train_gpt_checks.c */
/* Before the GPT's allocations: MPT_ENOMEM (naming the sizes, the bound and the host's memory)
 * when a lower bound of one rank's memory (parameters, gradients, optimizer state, forward
 * activations, the samplers' 8 bytes for each of the training and validation `windows`) times
 * `local_ranks` exceeds the host's memory limit; MPT_OK when it fits or the limit is unknown.
 * MPT_EINVAL for an invalid config. */
mpt_status trainer_gpt_check_memory(const mpt_cli_options *o, const mpt_gpt_config *cfg,
                                    int world, int local_ranks, int64_t windows);
/* mpitrain generate, before the model's allocations: MPT_ENOMEM (naming the file, the sizes,
 * the bound and the host's memory) when a lower bound of what sampling from `cfg` with a context
 * of `context` tokens takes (parameters, gradients, the loader's staging copy, the logits)
 * exceeds the host's memory limit (as trainer_gpt_check_memory); MPT_EINVAL for a bad config. */
mpt_status trainer_gpt_check_generate_memory(const char *path, const mpt_gpt_config *cfg,
                                             int64_t context);
/* MPT_EINVAL, naming the file, when a shard of `val` is also one of `train` (the same device
 * and inode); MPT_ENOMEM. */
mpt_status trainer_gpt_check_disjoint(const mpt_token_data *train, const mpt_token_data *val);
/* --save-model's path, if it exists, must hold an llm.c model file (or nothing): MPT_EINVAL,
 * naming what it holds (a token shard, a checkpoint, anything else), so that a slip of the
 * path does not replace the training data. Call after trainer_check_output_path. */
mpt_status trainer_gpt_check_save_model(const char *path);
/* MPT_EINVAL, naming both paths, when two shards of `d` are one file (the same device and
 * inode: a symbolic or hard link that the glob took too); `option` names the set. MPT_ENOMEM. */
mpt_status trainer_gpt_check_distinct(const mpt_token_data *d, const char *option);
/* Every token id the windows can read, checked against the vocabulary before training: rank r
 * checks the shards i with i % world == r (mpt_token_data_check_ids), then the ranks agree
 * (one all-reduce), so all stop together; a failing rank returns its own error, the others one
 * naming the lowest failing rank. */
mpt_status trainer_gpt_check_token_ids(mpt_comm *comm, int rank, int world,
                                       const mpt_token_data *train, const mpt_token_data *val);
/* A warning for each option given that has no effect in a GPT run of `world` ranks. */
void trainer_gpt_warn_unused(const mpt_cli_options *o, int world);

/* train_gpt_data.c */
/* With several ranks: every rank fingerprints its training and validation shards (counts and
 * a CRC-32 of a sample of each shard) and the ranks compare. MPT_EMISMATCH on every rank,
 * naming the rank, what differs and the shards each read, when they differ; MPT_EIO when this
 * rank cannot read a shard. Collective over `comm`. */
mpt_status trainer_gpt_check_same_data(mpt_comm *comm, const mpt_cli_options *o,
                                       const mpt_token_data *train, const mpt_token_data *val);

/* train_auto.c */
/* --resume auto: rank 0 looks into --checkpoint-dir; when it holds a checkpoint every rank
 * resumes from it (t->o then points at t->resolved with --resume DIR), otherwise the run starts
 * fresh (--resume cleared). Collective. */
mpt_status trainer_resolve_resume_auto(trainer *t);
/* Rank 0: the options that change what a checkpoint means (model, optimizer, learning rate and
 * schedule, epochs, batch, data) are written next to the checkpoints (DIR/run-options.txt) at
 * the start of a run; on --resume they are compared with those of the checkpoint's directory and
 * a difference is refused, naming each option and both values. Errors: MPT_EINVAL, MPT_EIO. */
mpt_status trainer_check_run_options(const mpt_cli_options *o);
/* Warnings (rank 0) for options given on the command line that have no effect in this run, and
 * one log line with the effective configuration. */
void trainer_log_configuration(trainer *t);
/* The schedule in words ("cosine to 0 over 500 steps"), into sched[n] (train_auto.c). */
void trainer_schedule_str(const mpt_lr_schedule *s, char *sched, size_t n);

/* --profile: logs the tape's op times (mpt_tape_op_times) as a table, per step over `steps`
 * profiled steps that took `wall_ms` in all, sorted by total time, with the rest of the step,
 * and the GEMMs inside the ops (mpt_op_gemm_counted over those steps: calls, ms, FLOPs; none
 * counted on a GPU) (train_profile.c). */
void trainer_report_op_times(const mpt_tape *tape, int64_t steps, double wall_ms,
                             int64_t gemm_calls, double gemm_ms, double gemm_flop);
/* --precision: sets the tape's arithmetic (fp32: nothing to do); bf16 fails with the reason
 * where the device cannot run it natively (train_precision.c). */
mpt_status trainer_set_precision(mpt_tape *tape, mpt_precision precision);
/* t->tape for t->model on t->stream, with --precision (train_precision.c). */
mpt_status trainer_tape_init(trainer *t);
/* --mode dp's configuration: --timeout and --precision (train_precision.c). */
mpt_dp_config trainer_dp_config(const mpt_cli_options *o);

#endif
