/* mpitrain dp: DataParallel, one process driving several devices, with the semantics of
 * PyTorch's torch.nn.DataParallel (torch/nn/parallel/data_parallel.py: replicate, scatter,
 * parallel_apply, gather) written against the device table (streams, events, mpt_op_memcpy,
 * mpt_op_axpy), so that it runs on CPU "devices" (cpu:N: a worker thread with its own replica
 * and its own memory; CPU memory is one address space) and on CUDA devices alike.
 *
 * The model lives on the first device of the list. Each step (mpt_dp_step):
 *   1. broadcast: the first device's buffers (BatchNorm running statistics) are copied to the
 *      replicas by the calling thread; each replica's thread then copies the first device's
 *      parameters into its replica (in parallel). Replica 0 IS the model (no copy), as in
 *      PyTorch, where the replica on device_ids[0] shares the module's tensors.
 *   2. scatter: the batch [B, ...] is split along dimension 0 into chunks whose sizes differ by
 *      at most one (mpt_dp_split); with B < K devices only B replicas run; no replica ever gets
 *      an empty chunk. (torch.chunk, which DataParallel uses, makes chunks of ceil(B/K) and so
 *      can leave devices idle even when B >= K; mpitrain spreads the rows evenly instead.)
 *      Each replica's thread copies its rows into memory of its device.
 *   3. parallel apply: every replica runs forward + the loss on its chunk (config.loss, by
 *      default the mean cross-entropy) + backward on its own persistent thread (one per device,
 *      created by mpt_dp_init, woken per step).
 *      The chunk's loss is scaled by count_k / B, so the gradients add up to those of the mean
 *      over the whole batch (not a mean of per-device means).
 *   4. gather: the replicas' outputs (logits [count_k, C], or any [count_k, ...]) are copied, in the original row
 *      order, into one [B, C] tensor on the output device (config.output_device).
 *   5. reduce: the replicas' gradients are added onto the model's gradient buffer by the
 *      calling thread in a fixed order (replica 0's backward accumulated into it directly, then
 *      replica 1, 2, ... are added), so the result does not depend on thread timing.
 * The caller then runs the optimizer on the model (on the first device). BatchNorm buffers
 * follow DataParallel: replica 0 is the model, so after the step the model holds replica 0's
 * running statistics (those of the first chunk); the other replicas' updates are discarded at
 * the next broadcast.
 *
 * Timing. The first device does work the others do not (broadcast, gather, reduce: the known
 * imbalance of DataParallel); mpt_dp_get_stats reports it per step (first_extra_ms) with every
 * replica's own time.
 *
 * Hybrid data parallelism (DP inside each rank, DDP across ranks): each rank runs a mpt_dp over
 * its devices on its share of the batch; after mpt_dp_step the model's gradients (already
 * reduced inside the rank) are all-reduced across ranks with mpt_ddp_allreduce_grads (ddp.h),
 * which averages them exactly once. The batch size is per rank: a rank's batch is split across
 * its devices, so the global batch is world_size * batch.
 *
 * Threads and streams: one thread drives a mpt_dp (the caller). The replicas' threads touch
 * only their replica, its tape, its stream and memory, and read the model's parameters; the
 * calling thread does steps 1, 4 and 5 on the stream given to mpt_dp_init (a stream of the
 * first device). Every wait for a replica has the configured deadline; a replica that misses it
 * fails the step with MPT_ETIMEOUT naming its device and the mpt_dp is unusable afterwards. */
#ifndef MPITRAIN_DP_H
#define MPITRAIN_DP_H

#include "mpitrain/core.h"
#include "mpitrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most devices in one list (CPU device indices must be below it too). */
#define MPT_DP_MAX_DEVICES 64

/* DataParallel over the devices of one process (opaque: mpt_dp_init / mpt_dp_free). */
typedef struct mpt_dp mpt_dp;

/* mpt_dp_init's settings: start from mpt_dp_config_default(). */
typedef struct mpt_dp_config {
  int output_device;  /* index IN THE DEVICE LIST where outputs are gathered (0: the first) */
  int gather_outputs; /* 1: gather the logits every step (DataParallel does); 0: skip it */
  double timeout_ms;  /* deadline of every wait for a replica, > 0 (300000) */
  mpt_precision precision; /* every replica's tape (mpt_tape_set_precision, nn.h): FP32
                            * (default) or BF16; mpt_dp_init fails as that call does */
  mpt_loss_fn loss;        /* each replica's loss of its chunk (nn.h); NULL (default): the mean
                            * cross-entropy of logits [rows, C] against int32 labels [rows] */
  void *loss_ctx;          /* passed to `loss` */
} mpt_dp_config;

/* The defaults noted on each field (output on the first device, gathered, 300 s, FP32). */
MPT_API mpt_dp_config mpt_dp_config_default(void);

/* Parses a device list into devices[0..*n). Items are separated by commas:
 *   "cpu:K"      alone: K CPU devices cpu:0 .. cpu:K-1 (K >= 1; CPU devices are worker
 *                threads, so the number is a count); "cpu" or "cpu:0" alone: the one device
 *                cpu:0;
 *   "cpu:0,cpu:1" or "cpu:0,1,2": an explicit list (a bare number continues the type of the
 *                item before it);
 *   "cuda:0,1", "cuda:0,cuda:2": explicit CUDA devices; "cuda" alone: every visible CUDA
 *                device; "cuda:N" alone: the one device cuda:N.
 * Errors (MPT_EINVAL, naming the text and the item): an empty list or item, an unknown device
 * type, a malformed index, a device named twice, a device that does not exist (CUDA not built
 * or not present, a CUDA ordinal >= the visible count, a CPU index >= MPT_DP_MAX_DEVICES), CPU
 * and CUDA devices mixed in one list, more than `max` devices. *n is 0 on error. */
MPT_API mpt_status mpt_dp_parse_devices(const char *text, mpt_device *devices, int max, int *n);

/* The scatter rule: splits `batch` rows over at most `ndevices` replicas as evenly as possible.
 * Returns the number of chunks m = min(batch, ndevices) (0 when batch < 1 or ndevices < 1) and
 * writes counts[0..m): the first batch % m chunks get batch / m + 1 rows, the rest batch / m.
 * Chunk k starts at row counts[0] + ... + counts[k-1]. counts must hold ndevices entries. */
MPT_API int mpt_dp_split(int64_t batch, int ndevices, int64_t *counts);

/* Creates DataParallel over devices[0..ndevices) for `model` (finalised, on devices[0]; for
 * CPU devices any CPU model, CPU memory being shared). Replicas 1..K-1 are made with
 * mpt_model_replicate and one thread per device is started. `stream` is a stream of devices[0]
 * on which the caller orders its own work on the model (zero_grad before a step, the optimizer
 * after it): the step starts after the work enqueued on it and its gather and reduction are
 * enqueued on it. NULL: the CPU, inline (only when devices are CPU devices). The model must
 * outlive the mpt_dp. Errors: MPT_EINVAL (NULL arguments, ndevices outside [1,
 * MPT_DP_MAX_DEVICES], a device named twice, devices of mixed types, a model or stream not on
 * devices[0], config out of range), MPT_ESTATE (model not finalised), MPT_ENOMEM,
 * MPT_EDEVICE (a thread could not start), errors of the device. */
MPT_API mpt_status mpt_dp_init(mpt_dp **dp, mpt_model *model, const mpt_device *devices,
                               int ndevices, mpt_stream *stream, const mpt_dp_config *config);
/* Stops and joins the threads, frees the replicas (not the model). If a replica's thread is
 * still running past the deadline (a hung device), it is detached and the mpt_dp's memory is
 * leaked rather than freed under it. NULL is a no-op. */
MPT_API void mpt_dp_free(mpt_dp *dp);

/* The number of devices in the list (0 for NULL). */
MPT_API int mpt_dp_num_devices(const mpt_dp *dp);
/* Device `index` of the list (devices[0] for an index out of range; cpu:0 for NULL). */
MPT_API mpt_device mpt_dp_device(const mpt_dp *dp, int index);
/* The replica on device `index`: 0 is the model itself; NULL out of range. Read it only
 * between steps. */
MPT_API mpt_model *mpt_dp_replica(mpt_dp *dp, int index);

/* One training step on a batch: broadcast, scatter, forward + loss + backward on every replica
 * in parallel, gather, reduce (see the top of this file).
 *   images: the input, float32 or int32 [B, ...] (B >= 1; the model's input shape per row: an
 *           image, or a row of token ids), on the CPU (host) or on devices[0];
 *   labels: int32 [B] in [0, C) for the default cross-entropy, or [B, ...] for config.loss (a
 *           row of next tokens), in the same place;
 *   scale:  multiplies the gradient: 1 for a plain step, 1/M for one of M accumulated
 *           micro-batches (as mpt_tape_backward's scale);
 *   seed:   dropout seed of this step (replica k uses seed + k, so dropout masks differ from
 *           one-device training; without dropout the result does not depend on it).
 * The model's gradients are ACCUMULATED (zero them on `stream` before a fresh step). On return
 * the work is enqueued on `stream` (on the CPU: done); *loss (may be NULL) receives the mean
 * loss over the whole batch, sum_k count_k * loss_k / B, and *correct (may be NULL) the number
 * of rows whose argmax is the label (logits [B, C] and labels [B] only; else 0). Replicas run in the model's training mode
 * (mpt_model_set_training on the model applies to all of them).
 * Errors: MPT_EINVAL (NULL arguments, B < 1, a bad dtype, tensors on another device), MPT_ESHAPE
 * (labels not [B, ...], or replicas that disagree on the output's row size), MPT_ESTATE (the mpt_dp
 * failed earlier with a timeout), MPT_ETIMEOUT (a
 * replica missed the deadline: the detail names its device), or the first failing replica's
 * error (in device order), its detail prefixed with the device ("cpu:2: ..."). After an error
 * the model's gradients are undefined; every replica that ran has finished. */
MPT_API mpt_status mpt_dp_step(mpt_dp *dp, const mpt_tensor *images, const mpt_tensor *labels,
                               float scale, uint64_t seed, float *loss, int64_t *correct);

/* Forward + loss only (evaluation), in parallel, without gradients, in the model's training
 * mode (call mpt_model_set_training(model, 0) first for evaluation; in training mode BatchNorm
 * updates replica 0's, i.e. the model's, running statistics as in a step). Same arguments,
 * outputs and errors as mpt_dp_step. Not counted in the stats. */
MPT_API mpt_status mpt_dp_forward(mpt_dp *dp, const mpt_tensor *images,
                                  const mpt_tensor *labels, float *loss, int64_t *correct);

/* The gathered outputs of the last step or forward: [B, ...] (logits [B, C] of a classifier) on
 * the output device, rows in the batch's order. Valid until the next step, forward or free. NULL when gathering is off or
 * nothing has run yet. */
MPT_API const mpt_tensor *mpt_dp_output(const mpt_dp *dp);

/* Timings of the last mpt_dp_step and their running sums, in milliseconds, host clock (on the
 * CPU the work itself; on CUDA the time to enqueue it, plus the waits). */
typedef struct mpt_dp_stats {
  int replicas;           /* replicas that ran in the last step: min(B, devices) */
  double step_ms;         /* the whole mpt_dp_step */
  double broadcast_ms;    /* first device: buffers copied to the replicas before they start */
  double gather_ms;       /* first device: outputs copied to the output device */
  double reduce_ms;       /* first device: replica gradients added onto the model's */
  double first_extra_ms;  /* broadcast + gather + reduce: the first device's work beyond the
                             others' (DataParallel's imbalance) */
  double wait_ms;         /* the caller waiting for replicas to finish */
  double replica_ms[MPT_DP_MAX_DEVICES]; /* each replica's own work (parameter copy, scatter,
                                            forward, loss, backward); 0 for idle devices */
  int64_t steps;          /* steps counted in the sums */
  double sum_step_ms, sum_broadcast_ms, sum_gather_ms, sum_reduce_ms, sum_first_extra_ms,
      sum_wait_ms;
  double sum_replica_ms[MPT_DP_MAX_DEVICES];
} mpt_dp_stats;

/* A copy of the stats (zeroed for NULL); read between steps. */
MPT_API mpt_dp_stats mpt_dp_get_stats(const mpt_dp *dp);
/* Zeroes the stats, the sums included. NULL is a no-op. */
MPT_API void mpt_dp_reset_stats(mpt_dp *dp);

/* When `trace` is set, each step records "dp broadcast", "dp gather", "dp reduce" on lane 0 and
 * each replica's "forward" (scatter, forward and loss) and "backward" (arg = device index) on
 * lane 2 + index: 1 + 4 x devices events per step at most. NULL turns it off. */
MPT_API void mpt_dp_set_trace(mpt_dp *dp, mpt_trace *trace);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_DP_H */
