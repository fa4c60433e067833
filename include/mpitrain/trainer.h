/* mpitrain trainer: the training loop as a library, one loop for every model.
 *
 * A model family plugs in as a task (mpt_train_task): its data (an mpt_data_source for training
 * and one for evaluation), the loss of a micro-batch given the model's output, and optionally a
 * metric (a classifier's correct answers). The loop (mpt_trainer_run) owns everything above the
 * step, the same for every family: the distributed sampler and loaders, the step (zero_grad,
 * forward, loss, backward through the tape, whose DDP hooks average the gradients, clipping,
 * the optimizer step at the scheduled learning rate) with gradient accumulation (no_sync on all
 * but the last micro-batch), DataParallel inside a rank, ZeRO-1, evaluation, checkpoints and
 * resume (auto included), preemption (SIGTERM / SIGUSR1: every rank stops after the same step,
 * checkpoints, and the run reports it), the ranks' agreement checks (options, data, epoch,
 * replicas), non-finite handling, logging (step lines, epoch lines, the progress line or bar),
 * the memory and DDP reports, --metrics-json, the Chrome trace and --profile. A feature of the
 * loop is a feature of every model.
 *
 * Built-in tasks: mpt_train_task_images (image classifiers: mlp, cnn, a user's) and
 * mpt_train_task_tokens (language models on llm.c token shards: the GPTs, a user's). A user's
 * own family fills an mpt_train_task by hand.
 *
 * The step, per optimizer step of K = accumulate micro-batches (each of `batch` samples on every
 * rank; the last step of an epoch takes the batches left): micro-batch k's loss is scaled by
 * its share of the step's rows (rows_k / rows of the step), so a step equals one step on the
 * combined batch; the backward of the last micro-batch all-reduces the gradient buckets
 * (PyTorch DDP's no_sync for the others). Then, when clipping is on, the gradients are scaled to
 * a global L2 norm of at most grad_clip (torch.nn.utils.clip_grad_norm_; the same norm on every
 * rank), and the optimizer steps with mpt_lr_at(schedule, lr, global step).
 *
 * GEMM tuning: when the process's CPU GEMM setting is MPT_CPU_GEMM_TUNE (ops.h, "CPU GEMM
 * library"; the program's --gemm tune) and the model is on the CPU, rank 0 reads the cache
 * (gemm_cache, else mpt_cpu_gemm_cache_path) and its table is installed on every rank; the first
 * step's product shapes are recorded (mpt_cpu_gemm_record); after it, the shapes the table lacks
 * are timed on every rank at once (mpt_cpu_gemm_time_shapes: median of 5, 0.4 s in all, outside
 * the training time) and rank 0's choices are broadcast and installed everywhere (the same
 * library per shape on every rank); rank 0 logs the table in one line and writes the cache. An
 * unreadable, corrupt or foreign cache, or one that cannot be written, is a warning.
 *
 * Threads: mpt_trainer_run runs on the calling thread (the DDP engine's comm thread, the
 * loaders' prefetch threads and DataParallel's replica threads are the library's own, and block
 * the preemption signals); it is collective over `comm`: every rank calls it with the same
 * configuration. */
#ifndef MPITRAIN_TRAINER_H
#define MPITRAIN_TRAINER_H

#include <stdint.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ckpt.h"
#include "mpitrain/comm.h"
#include "mpitrain/core.h"
#include "mpitrain/data.h"
#include "mpitrain/ddp.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status a program should return for a preempted run (result.preempted): EX_TEMPFAIL
 * of sysexits.h, "try again later"; the Slurm scripts requeue on it. */
#define MPT_TRAIN_EXIT_PREEMPTED 75

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                              */

/* Everything the loop does, as plain data. Strings are borrowed for the duration of
 * mpt_trainer_run; NULL or "" turns the feature off. */
typedef struct mpt_trainer_config {
  /* --- steps and data order --- */
  int64_t epochs;     /* >= 1 (default 1) */
  int64_t batch_size; /* rows per micro-batch per rank, >= 1 (default 64): images, or the B
                         sequences of a token window (the task's samples_per_batch says how many
                         data samples that is); 0: auto (mpt_trainer_plan_resume) */
  int accumulate;     /* micro-batches per optimizer step, >= 1 (default 1); 0: auto */
  int64_t max_steps;  /* optimizer steps per epoch at most; 0 = the whole epoch (default 0) */
  int shuffle;        /* reshuffle every epoch from (seed, epoch) (default 1) */
  int drop_last;      /* drop the tail the ranks cannot share evenly (default 0) */
  uint64_t seed;      /* shuffling and dropout (default 1); the model's initialisation is the
                         caller's */
  /* --- optimizer --- */
  mpt_optimizer_config optim; /* default: mpt_optimizer_config_default() */
  int no_decay_bias_norm;     /* weight decay on >= 2-D weights only (default 0) */
  mpt_lr_schedule schedule;   /* step_size 0: one epoch; total_steps is set by the loop (all the
                                 run's steps) (default constant) */
  double grad_clip;           /* clip the global gradient L2 norm to this; 0 = off (default 0) */
  int skip_nonfinite;         /* skip optimizer steps whose averaged gradients (or loss) are not
                                 finite, on every rank alike; 0: stop at the first (default 0) */
  /* --- parallelism and arithmetic --- */
  mpt_ddp_config ddp;         /* used with more than one rank (default mpt_ddp_config_default) */
  const char *dp_devices;     /* DataParallel inside each rank over these devices ("cpu:2");
                                 NULL: none (default) */
  int threads;                /* CPU threads per rank; 0 = the host's cores / its ranks */
  mpt_precision precision;    /* GEMMs and convolutions (default fp32) */
  int recompute;              /* checkpoint the model's blocks: recompute their activations in
                                 backward (mpt_tape_set_recompute; default 0) */
  double timeout_s;           /* deadline of every collective and wait, > 0 (default 300) */
  int check_collectives;      /* compare collective signatures first (default 0); the loop
                                 tags each collective with the global step and its purpose
                                 (mpt_comm_set_step / mpt_comm_set_purpose), so ranks whose
                                 control flow differs fail at the first mismatch */
  const char *debug_dir;      /* the flight recorder's dumps (comm.h): SIGUSR2, fatal signals;
                                 NULL: checkpoint_dir, else "mpitrain-debug" (relative to the
                                 working folder) */
  double straggler_warn;      /* stragglers: at each step line (log_every) every rank's compute
                                 time per step (forward + backward + optimizer, without waiting
                                 for collectives) is all-gathered; rank 0 logs the slowest and
                                 fastest rank and their ratio, and warns when the ratio is above
                                 this (>= 1; default 1.2) */
  /* --- evaluation --- */
  int64_t eval_every;         /* also every N global steps; 0 = at each epoch's end only */
  int64_t eval_max_batches;   /* per rank and evaluation; 0 = the whole evaluation set */
  int eval_at_start;          /* evaluate before the first step (default 0) */
  /* --- checkpoints --- */
  const char *checkpoint_dir; /* write checkpoints here (rank 0, atomic rename) */
  int64_t checkpoint_every;   /* every N global steps; 0 = at each epoch's end (default 0) */
  int keep;                   /* checkpoints kept in the folder, >= 1 (default 3) */
  int checkpoint_async;       /* 1: rank 0 snapshots the state into host memory and a background
                               * thread writes the file; the next checkpoint and the run's end
                               * wait for it (default 0: written before the step returns) */
  const char *resume;         /* a checkpoint FILE, a DIR (its latest), or "auto" (the latest of
                                 checkpoint_dir if any, else a new run) */
  int64_t stop_at_step;       /* stop (and checkpoint) after this global step; 0 = never */
  int64_t check_replicas;     /* every N steps compare a CRC-32 of the parameters; 0 = off */
  int handle_signals;         /* 1 (default): SIGTERM and SIGUSR1 stop the run after the same
                                 step on every rank (checkpointing when checkpoint_dir is set);
                                 mpt_trainer_catch_signals is called at the start */
  /* --- output --- */
  int64_t log_every;          /* a step line (loss, norm, lr, throughput) every N steps; 0 =
                                 none (default 0) */
  int progress;               /* -1 (default): a bar when stderr is a terminal; 1 on; 0 off */
  double progress_interval_s; /* stderr not a terminal: a progress line every N s; 0 = none
                                 (default 30) */
  int quiet;                  /* warnings and errors only (default 0) */
  const char *log_file;       /* each rank's stdout and stderr appended to LOG_FILE.RANK */
  const char *metrics_json;   /* per-epoch metrics and the run's figures as JSON (rank 0) */
  const char *trace;          /* Chrome trace of every rank's phases */
  const char *save_params;    /* the final flat parameters, raw float32 (rank 0) */
  int profile;                /* each op's time per step at the end (steps after the first) */
  const char *gemm_cache;     /* with mpt_cpu_set_gemm(MPT_CPU_GEMM_TUNE): the tuning cache file
                                 (NULL or "": $MPT_GEMM_CACHE, else the per-host file of
                                 mpt_cpu_gemm_cache_path); see "GEMM tuning" below */
  /* --- identity (logs, checks, checkpoints) --- */
  const char *model_name;     /* in logs and the metrics file (default "model") */
  const char *run_options;    /* "name value" lines recorded in CHECKPOINT_DIR/run-options.txt
                                 besides the loop's own (the model's sizes, the data): a resume
                                 whose lines differ is refused, naming them */
  const char *input_paths;    /* the run's input files, one per line (the data): no output
                                 (save_params, metrics_json, trace) may be one of them */
  int argc;                   /* the command line, compared across ranks before anything else */
  char **argv;                /* (argc 0: not compared) */
} mpt_trainer_config;

/* The defaults documented above. */
MPT_API mpt_trainer_config mpt_trainer_config_default(void);

/* ------------------------------------------------------------------------------------------ */
/* Tasks: what a model family brings                                                          */

/* One micro-batch as the loop hands it to the task's loss: host tensors, rows first. */
typedef struct mpt_train_batch {
  mpt_tensor input;  /* what mpt_tape_input takes: [rows, ...] (float32 images, int32 tokens) */
  mpt_tensor target; /* int32 [rows] labels, or [rows, T] next tokens */
  int64_t rows;      /* rows of input and target: the micro-batch's weight in the step */
  int64_t real_rows; /* rows [0, real_rows) are data; the rest repeat samples (the distributed
                        sampler's padding): evaluation counts the real rows only */
} mpt_train_batch;

/* A model family's part of the loop. Fill it by hand or take a built-in one. The loop borrows
 * it (and what it points to) for the duration of mpt_trainer_run. */
typedef struct mpt_train_task {
  const char *name;          /* the family, in logs ("classifier", "language model") */
  const char *unit;          /* throughput unit ("samples", "tokens") */
  int64_t units_per_row;     /* units in a row of a batch: 1 (an image), T (a sequence) */
  double flops_per_unit;     /* model FLOPs of forward + backward per unit; 0 = unknown (no
                                GFLOP/s line and no SGEMM-peak measurement at the end) */
  const char *eval_name;     /* the evaluation set in logs ("test", "val") */
  const char *metric_name;   /* the metric beside the loss ("acc"); NULL: none */
  const char *loss_unit;     /* the loss's unit in the evaluation lines ("nats/token"); NULL */
  const mpt_data_source *train; /* required: training samples */
  const mpt_data_source *eval;  /* evaluation samples; NULL: no evaluation */
  int64_t samples_per_batch; /* data samples per micro-batch; 0: the config's batch_size (one
                                sample is one row); 1 for sources whose sample is a window of
                                batch_size rows */
  void *ctx;                 /* passed to the callbacks */
  /* Optional, collective, once at the start after the loop's own checks: the family's checks
   * (shapes against the model, the ranks' data agreement, token ids...). An error stops every
   * rank. */
  mpt_status (*check)(void *ctx, mpt_comm *comm, const mpt_trainer_config *cfg, mpt_model *model);
  /* Optional: a loader batch (mpt_loader_next) as input and target; NULL: input = images,
   * target = labels, rows = count, real_rows = num_real. */
  mpt_status (*batch_view)(void *ctx, const mpt_batch *batch, mpt_train_batch *out);
  /* Required: the loss of a micro-batch (nn.h mpt_loss_fn): the mean over its units. Called on
   * the training thread, or on a DataParallel replica's thread with that replica's tape. */
  mpt_loss_fn loss;
  /* Optional: the metric's sum over the batch's first `rows` rows from the model's output
   * (host or device memory of `stream`; a classifier: the rows whose argmax is the label). The
   * loop sums it over batches and ranks and divides by the rows. */
  mpt_status (*metric)(void *ctx, mpt_stream *stream, const mpt_tensor *output,
                       const mpt_tensor *target, int64_t rows, double *sum);
} mpt_train_task;

/* The built-in image-classifier task over `train` and `test` (borrowed; test may be NULL):
 * cross-entropy loss, accuracy as the metric (mpt_op_count_correct), "samples". Its check
 * compares every rank's data (counts, image size, classes, CRC-32 of images and labels as
 * loaded) and the images' shape with the model's input (one forward of a sample on the CPU).
 * `dir`: the folder the IDX files came from, named in its messages (NULL: data made in memory).
 * Free with mpt_train_task_free. Errors: MPT_EINVAL, MPT_ENOMEM. */
MPT_API mpt_status mpt_train_task_images(mpt_train_task **task, const mpt_dataset *train,
                                         const mpt_dataset *test, const char *dir);
/* The built-in language-model task over token windows (llm.c shards, mpitrain/data.h): `train`
 * and `val` (borrowed; val may be NULL) of B x T windows, vocab_size the model's vocabulary:
 * per-token cross-entropy (mpt_nn_cross_entropy_vocab), "tokens", flops_per_unit as given (llm.c
 * counts 6 N + 6 L C T for a GPT). Its check: no shard twice, validation apart from training, the
 * ranks' shards agree (counts and a CRC-32 of a sample of each), every token id below the
 * vocabulary (each rank checks its share). Errors: MPT_EINVAL, MPT_ENOMEM. */
MPT_API mpt_status mpt_train_task_tokens(mpt_train_task **task, mpt_token_data *train,
                                         mpt_token_data *val, int vocab_size,
                                         double flops_per_unit);
/* Frees a built-in task; NULL is a no-op. */
MPT_API void mpt_train_task_free(mpt_train_task *task);

/* ------------------------------------------------------------------------------------------ */
/* Running                                                                                    */

/* What a run did. */
typedef struct mpt_train_result {
  int preempted;         /* stopped by SIGTERM / SIGUSR1 (any rank's) after a common step */
  int stop_signal;       /* the signal this rank received (0: none, or another rank's) */
  int stopped;           /* stop_at_step reached */
  int64_t global_step;   /* optimizer steps taken, resumed ones included */
  int64_t steps_run;     /* optimizer steps this run took */
  int64_t epochs_done;   /* epochs completed (a resumed run counts the earlier ones) */
  double train_loss;     /* the last epoch's mean training loss over all ranks (NAN: none) */
  double eval_loss;      /* the last evaluation's mean loss (NAN: none) */
  double eval_metric;    /* the last evaluation's metric (NAN: none) */
  double units_per_s;    /* training throughput over all ranks (the task's unit) */
} mpt_train_result;

/* The device this rank trains on, for the caller to build the model there: "cpu" (or NULL /
 * "" when no rank sees a GPU) the CPU; "cuda" (or NULL / "" when every rank sees one) the GPU
 * of this rank's local rank (mpt_comm_bind_device). Collective when `device` is NULL or "" and
 * there are several ranks. Errors: MPT_ENOTSUP ("cuda" without a visible GPU or CUDA build),
 * MPT_EINVAL (another name), those of mpt_comm_bind_device. */
MPT_API mpt_status mpt_trainer_device(mpt_comm *comm, const char *device, mpt_device *out);

/* Trains `model` (built on the device of mpt_trainer_device, its parameters initialised; with
 * several ranks every rank's model has the same shape, rank 0's parameters are broadcast) on
 * the task's data as `cfg` says; collective over `comm` (MPI world; more than one rank: DDP).
 * On return the model holds the trained parameters; *result (may be NULL) what was done. A run
 * stopped by a signal or stop_at_step returns MPT_OK with result->preempted / stopped set.
 * Errors (every rank returns one; a rank whose error the others cannot see should abort the job
 * with mpt_comm_abort): MPT_EINVAL (a bad config, or a checkpoint that does not fit), and those
 * of the checks, the data, the collectives (MPT_ETIMEOUT...) and the files written. */
MPT_API mpt_status mpt_trainer_run(mpt_comm *comm, mpt_model *model, const mpt_train_task *task,
                                   const mpt_trainer_config *cfg, mpt_train_result *result);

/* The plan of a resume, for any number of ranks (docs/checkpoints.md): collective over comm,
 * called by mpt_trainer_run at its start (a program may call it before, to know the batch
 * before it opens data whose samples the batch shapes, as the GPT's token windows).
 *
 * The global batch G of a run is ranks x samples per micro-batch x accumulate (samples per
 * micro-batch: cfg->batch_size, or the task's samples_per_batch when > 0, a window of
 * batch_size rows). A checkpoint records its G, and a resume on W' ranks continues with the
 * same G: the same samples in every step, the learning rate at the same global step. With
 * cfg->resume set ("auto": the latest checkpoint of cfg->checkpoint_dir, if any; cfg->resume
 * is then set to the folder, or to "" for a new run), rank 0 reads and validates the
 * checkpoint (mpt_ckpt_read_meta) and broadcasts its meta; then cfg->batch_size and
 * cfg->accumulate are checked against it, or picked where they are 0 ("auto"): the batch
 * given with the accumulation that makes G; the accumulation given with the batch that makes
 * it; both auto: the fewest micro-batches whose per-rank batch is at most the checkpoint's.
 * With samples_per_batch > 0 the batch must stay the checkpoint's (auto: it is). A
 * version-1 checkpoint records no G: it needs both given, and the same number of ranks. A new
 * run takes new_run_batch (>= 1) and accumulate 1 for what is auto. *meta (may be NULL) and
 * *found (may be NULL) receive the checkpoint's meta and whether there is one.
 * Errors (the same on every rank): MPT_EMISMATCH (no setting of the batch and accumulation
 * that was given or can be picked makes G on this many ranks: the message gives G, how the
 * checkpoint made it, and the settings that would, or the numbers of ranks that can; another
 * window size; a version-1 checkpoint of another world size), MPT_EINVAL (auto with a
 * version-1 checkpoint; resume "auto" without checkpoint_dir; NULL arguments), those of
 * mpt_ckpt_resolve and mpt_ckpt_read_meta (a missing, corrupt, partial or newer-format
 * checkpoint: rank 0's detail, on every rank), the comm's. */
MPT_API mpt_status mpt_trainer_plan_resume(mpt_comm *comm, mpt_trainer_config *cfg,
                                           int64_t samples_per_batch, int64_t new_run_batch,
                                           mpt_ckpt_meta *meta, int *found);

/* The parameter file format of cfg.save_params: the flat parameters as raw little-endian
 * float32, written by rank 0 to a temporary file, synced, then renamed. Local. Errors: MPT_EIO
 * naming the path, MPT_EINVAL (path not a regular file). */
MPT_API mpt_status mpt_trainer_save_params(mpt_model *model, mpt_stream *stream,
                                           const char *path);

/* Catches SIGTERM and SIGUSR1 (what Slurm sends before a time limit; mpirun forwards SIGUSR1
 * to every rank, not SIGTERM) so that a run stops after the same step on every rank: blocks
 * both on the calling thread (and so on every thread started after it) and starts a thread
 * that takes them with sigwait and only records them; a recording handler covers threads that
 * other libraries started earlier. SIGUSR2 (also forwarded by mpirun) is taken by the same
 * thread: while mpt_trainer_run runs it writes the flight recorder's dump of the run's comm to
 * the debug folder (comm.h "Flight recorder") and the run goes on; outside a run it is logged
 * and ignored. Each run also installs handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT
 * that write the dump (async-signal-safe) and then pass the signal on to the handler installed
 * before (MPI's) or the default action. No signal handler then runs on a thread that computes (one
 * inside oneDNN's fp32 GEMM kernels corrupted the heap: docs/faults.md F52). Call it first in
 * main, before MPI's initialisation and any thread, so that a signal during a slow start-up
 * stops the run after its first step instead of killing the rank; mpt_trainer_run calls it too
 * (handle_signals). Idempotent; the thread stays until the process ends (a signal after the run
 * is only recorded). Errors: MPT_EIO (sigaction failed), MPT_ENOMEM (no thread). */
MPT_API mpt_status mpt_trainer_catch_signals(void);

/* The run's output as cfg says (log_file: this rank's stdout and stderr appended to
 * LOG_FILE.RANK, a failure also named on the stderr the process started with; quiet: warnings
 * and errors only), set up before mpt_trainer_run so that what the program logs first goes to
 * the same place. Process-wide (file descriptors 1 and 2, the logger) and idempotent for the
 * same file; mpt_trainer_run calls it. Errors: MPT_EIO naming the file, MPT_EINVAL (another
 * log_file than an earlier call's). */
MPT_API mpt_status mpt_trainer_log_open(mpt_comm *comm, const mpt_trainer_config *cfg);

/* An output path a program will write at the end of a run, checked at its start: a new file or
 * a regular one (replaced by rename), never a directory, a device or a symbolic link, in a
 * folder that exists and can be written now. `option` names it in the message. Local. Errors:
 * MPT_EINVAL naming the option, the path and why. */
MPT_API mpt_status mpt_trainer_check_output_path(const char *option, const char *path);

/* Name of a signal the loop stops on ("SIGTERM", "SIGUSR1"), "a signal on another rank" for
 * 0. */
MPT_API const char *mpt_trainer_signal_name(int sig);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_TRAINER_H */
