/* mpitrain ddp: distributed data parallel training, the semantics of PyTorch's
 * DistributedDataParallel (Li et al., "PyTorch Distributed: Experiences on Accelerating Data
 * Parallel Training", VLDB 2020) written against streams and events.
 *
 * Construction verifies that every rank holds the same model (parameter count, names, shapes,
 * dtypes, order), then broadcasts rank 0's parameters and buffers, so replicas start
 * bit-identical, and installs DDP's hooks on the model (nn.h mpt_model_hooks), once. From then
 * on the user's step is the ordinary one, with nothing DDP-specific in it:
 *     mpt_model_zero_grad -> mpt_tape_reset -> mpt_tape_input -> mpt_model_forward -> loss ->
 *     mpt_tape_backward -> mpt_optimizer_step_model
 * and mpt_tape_backward returns with gradients averaged over the ranks:
 *   before a training forward   the buffers are synchronised (buffer mode below);
 *   during backward             each bucket is all-reduced once its parameters are final;
 *   at the end of backward      the remaining buckets are launched, every bucket is waited for
 *                               (deadline), and parameters without a gradient are an error.
 * Misuse is an error naming it (MPT_ESTATE): a second training forward before the backward of
 * the first, a backward without a training forward through mpt_model_forward, a model changed
 * after wrapping (parameters re-initialised, forward replaced); and, from the model's gradient
 * state (nn.h): an optimizer step without a finished backward, a forward after a step without
 * zero_grad, zero_grad over synchronised gradients no step used, an optimizer step on
 * gradients that were not averaged (no_sync left on). After a backward failed on a rank, its
 * DDP refuses every later pass (MPT_ESTATE naming the failure): that rank's collectives would
 * no longer pair with the other ranks'. A forward whose backward never came is forgotten at
 * the next zero_grad. A forward in evaluation mode
 * or with gradients disabled is not seen by DDP (no collective). One DDP wrapper per model.
 *
 * Buckets. Parameters are taken in reverse registration order (the order backward finalises
 * their gradients) and added to the open bucket, which closes as soon as its size reaches its
 * cap: first_bucket_cap_mb (1 MiB) for the first bucket, bucket_cap_mb (25 MiB) for the rest
 * (PyTorch's compute_bucket_assignment_by_size), so a bucket exceeds its cap by at most its last
 * parameter, and a parameter of another dtype starts a new bucket. With config.unit_buckets
 * (always under ZeRO-3) each unit of the model is one bucket instead, the caps unused.
 * Because the model's gradients live in one flat buffer in registration order, each bucket is
 * a contiguous slice {offset, count} of it: no packing copy. Buckets are keyed by parameter
 * (never by arrival order) and launched strictly in index order, so every rank issues the same
 * collectives in the same order.
 *
 * Overlap. The grad-ready hook marks a parameter ready; when every parameter of the next
 * bucket (in index order) is ready, an event is recorded on the compute stream, the comm stream
 * waits on it, and the bucket's reduction is enqueued on the comm stream by its reducer (the
 * all-reduce average by default; see "communication hook" below); backward goes on computing.
 * The end of backward launches what is left (everything, with overlap off) and makes the
 * compute stream wait for the last bucket. Gradients are divided by the world size
 * exactly once: by the all-reduce's average op (sum, then scale by 1/W), nowhere else (with
 * bf16 gradient communication, by the widening after the bfloat16 sum: grad_comm below).
 *
 * Unused parameters. By default a parameter that got no gradient in a backward pass is an error
 * of mpt_tape_backward naming it (MPT_EUNUSED). With find_unused_parameters, parameters the
 * forward did not use are marked ready when backward starts: their gradient counts as zero
 * (whatever the gradient buffer holds: zero after zero_grad) and is still all-reduced.
 *
 * no_sync. mpt_ddp_set_sync(ddp, 0) makes backward passes accumulate locally without any
 * collective (gradient accumulation); the pass after mpt_ddp_set_sync(ddp, 1) synchronises the
 * accumulated gradients.
 *
 * Threads and streams: one thread drives a mpt_ddp (the training thread). All waits have the
 * configured deadline; a collective that does not complete fails the step with MPT_ETIMEOUT
 * naming the operation, its sequence number and the rank. */
#ifndef MPITRAIN_DDP_H
#define MPITRAIN_DDP_H

#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The process group (comm.h) and the DDP engine (opaque: mpt_ddp_init / mpt_ddp_free). */
typedef struct mpt_comm mpt_comm;
typedef struct mpt_ddp mpt_ddp;

/* What happens to the model's buffers before each training forward (config.buffers). */
typedef enum {
  MPT_DDP_BUFFERS_BROADCAST = 0, /* rank 0's buffers before each forward (PyTorch default) */
  MPT_DDP_BUFFERS_AVERAGE = 1,   /* the average over ranks before each forward */
  MPT_DDP_BUFFERS_NONE = 2,      /* left alone */
} mpt_ddp_buffer_mode;

/* What goes on the wire for each gradient bucket (config.grad_comm). */
typedef enum {
  MPT_DDP_GRAD_FP32 = 0, /* the float32 gradients, all-reduced with avg (default) */
  /* bfloat16 compression, as PyTorch's bf16_compress_hook and llm.c's bf16 gradients: each
   * bucket is rounded to bfloat16 (nearest even; NaN stays NaN) into the bucket's own conversion
   * buffer, all-reduced with sum in bfloat16 on the wire, float32 accumulation and one rounding
   * of the sum (comm.h "bfloat16"), then widened back into the float32 gradient buffer and
   * divided by W in float32 (the one division by the world size). Half the bytes on the wire.
   * Error bound per element, against the float32 average g = (1/W) sum_r g_r (exact
   * arithmetic):
   *     |g_bf16 - g| <= c(W) * (1/W) sum_r |g_r| + 2^-24 |g_bf16|,
   *     c(W) = u (2 + u) + (1 + u)^2 gamma_e(W - 1),   u = 2^-8,
   *     gamma_e(k) = k e / (1 - k e),   e = 2^-24
   * (two roundings of relative error <= u, the input's and the sum's, and float32's W - 1
   * additions; the last term is the float32 division): about 2 u whatever W, where a rounding
   * at each hop of the reduction would give W u. When every g_r and their sum are exact in
   * bfloat16 (e.g. small integers) the result equals the float32 path's bit for bit. Ranks get
   * identical results, and the native all-reduce, rs-ag and ZeRO-1 the same bits.
   * Gradients in host memory only (a CPU model and a comm whose stream is a CPU worker: the MPI
   * backend on cpu); others: MPT_ENOTSUP at mpt_ddp_init. */
  MPT_DDP_GRAD_BF16 = 1,
} mpt_ddp_grad_comm;

/* How plain DDP all-reduces a bucket (config.allreduce; ZeRO reduce-scatters, see below). */
typedef enum {
  MPT_DDP_ALLREDUCE_NATIVE = 0, /* the backend's all-reduce (MPI_Allreduce, ncclAllReduce) */
  /* A reduce-scatter of the bucket (average; mpt_comm_shard's layout) followed by the
   * all-gather of the shards: an all-reduce built as NCCL's ring builds it, with the same
   * bytes on the wire (2 (W-1)/W of the bucket). Each element's sum is then computed by the
   * very reduce-scatter that ZeRO-1 issues for the bucket, and mpt_ddp_clip_grad_norm sums
   * the squares in ZeRO-1's partition and order (below), so plain DDP and ZeRO-1 train bit
   * for bit alike at any world size (MPI's MPI_Allreduce and MPI_Reduce_scatter add the ranks
   * in different orders at W > 2). With bf16 gradients the bfloat16 sums are reduce-scattered
   * and all-gathered, then widened. Host memory only (a CPU model and a comm whose stream is a
   * CPU worker: the MPI backend on cpu; others: MPT_ENOTSUP at mpt_ddp_init); at one rank it
   * is NATIVE. Not the default: at 2 ranks over shared memory (Open MPI 4.1) it reached 0.8-1.0x
   * the bus bandwidth of the native all-reduce for 16-64 MiB buckets, not clearly at par
   * (docs/zero.md "Limits"). */
  MPT_DDP_ALLREDUCE_RS_AG = 1,
} mpt_ddp_allreduce_algo;

/* Parses "native" | "rs-ag". Errors: MPT_EINVAL naming the accepted values. */
MPT_API mpt_status mpt_ddp_allreduce_algo_parse(const char *text, mpt_ddp_allreduce_algo *algo);
/* "native", "rs-ag"; "unknown" otherwise. */
MPT_API const char *mpt_ddp_allreduce_algo_name(mpt_ddp_allreduce_algo algo);

/* Parses "fp32" | "bf16". Errors: MPT_EINVAL naming the accepted values. */
MPT_API mpt_status mpt_ddp_grad_comm_parse(const char *text, mpt_ddp_grad_comm *mode);
/* "fp32", "bf16"; "unknown" otherwise. */
MPT_API const char *mpt_ddp_grad_comm_name(mpt_ddp_grad_comm mode);

/* mpt_ddp_init's settings: start from mpt_ddp_config_default(). */
typedef struct mpt_ddp_config {
  double bucket_cap_mb;       /* 25 (MiB, 2^20 bytes) */
  double first_bucket_cap_mb; /* 1 */
  int overlap;                /* 1: all-reduce during backward; 0: after backward */
  int find_unused_parameters; /* 0 */
  mpt_ddp_buffer_mode buffers;
  double timeout_ms;          /* deadline of every wait, > 0 (300000) */
  mpt_ddp_grad_comm grad_comm; /* MPT_DDP_GRAD_FP32 */
  int zero;                    /* ZeRO stage: 0 (off, default), 1, 2 or 3 (see "ZeRO" below) */
  mpt_ddp_allreduce_algo allreduce; /* MPT_DDP_ALLREDUCE_NATIVE (plain DDP; ZeRO ignores it) */
  int prefetch;                /* ZeRO-3: 1 (default) gathers the next unit during the current
                                  one's compute; 0 gathers each unit when it is reached */
  int unit_buckets;            /* 1: one bucket per unit of the model (nn.h mpt_model_units: a
                                  GPT's embeddings, each block, its final LayerNorm; an mlp's or
                                  cnn's layers), the caps unused (a unit whose parameters change
                                  dtype is cut there), as FSDP's one flat parameter per wrapped
                                  module; 0 (default): the size caps (see "Buckets"). ZeRO-3
                                  always plans by unit, whatever this says. */
} mpt_ddp_config;

/* The defaults noted on each field (PyTorch's bucket caps, overlap on, broadcast buffers). */
MPT_API mpt_ddp_config mpt_ddp_config_default(void);
/* Parses "broadcast" | "average" | "none". Errors: MPT_EINVAL. */
MPT_API mpt_status mpt_ddp_buffer_mode_parse(const char *text, mpt_ddp_buffer_mode *mode);

/* Wraps a finalised model for training over `comm`; `compute` is the stream backward runs on
 * (NULL: the CPU, inline). Collective: every rank calls it. Verifies the model signature across
 * ranks (MPT_EMISMATCH naming the first rank and parameter that differ), broadcasts rank 0's
 * parameters and buffers, and installs DDP's hooks on the model (see the top of this file).
 * Finish the model (and load its weights) first. A model whose initialisation is deferred
 * (nn.h mpt_model_init_unit) is initialised here: under ZeRO-3 at W > 1 unit by unit, each
 * unit broadcast from rank 0 and given back outside this rank's shard (no rank holds more than
 * its shard and one unit); otherwise whole, before the broadcast. Errors: MPT_EINVAL (NULL
 * ddp, model or comm; bad config), MPT_ENOTSUP (bf16 gradients, ZeRO or the rs-ag all-reduce
 * with gradients outside host memory), MPT_EMISMATCH (also, under ZeRO-3, some ranks' models
 * deferred and others' not), MPT_ESTATE (the model is not finalised, or already wrapped),
 * MPT_ENOMEM, comm errors (MPT_ECOMM, MPT_ETIMEOUT). */
MPT_API mpt_status mpt_ddp_init(mpt_ddp **ddp, mpt_model *model, mpt_comm *comm,
                                mpt_stream *compute, const mpt_ddp_config *config);
/* Removes the hooks (the model trains alone again) and frees the engine. Free it before the
 * model (it reads the model's hooks). NULL is a no-op. */
MPT_API void mpt_ddp_free(mpt_ddp *ddp);

/* The bucket plan. */
typedef struct mpt_ddp_bucket_info {
  int64_t offset, count;        /* slice of the flat gradient buffer, in floats */
  int first_param, last_param;  /* parameter indices covered: last_param <= first_param */
} mpt_ddp_bucket_info;

/* The number of buckets, and bucket `index` (0 = the first launched; NULL out of range; owned
 * by the engine). */
MPT_API int mpt_ddp_num_buckets(const mpt_ddp *ddp);
MPT_API const mpt_ddp_bucket_info *mpt_ddp_bucket(const mpt_ddp *ddp, int index);
/* Index of the bucket holding parameter `param`; -1 out of range. */
MPT_API int mpt_ddp_param_bucket(const mpt_ddp *ddp, int param);

/* Synchronises buffers as configured now (the hook does it before every training forward;
 * call it yourself only for a forward DDP does not see, e.g. DataParallel's). Collective; the
 * collective runs after the work enqueued on the compute stream and is waited for (deadline).
 * Nothing to do at W = 1 or without buffers. Errors: comm errors (MPT_ECOMM, MPT_ETIMEOUT). */
MPT_API mpt_status mpt_ddp_sync_buffers(mpt_ddp *ddp);
/* 0: following backward passes accumulate locally, without any collective (no_sync: gradient
 * accumulation over micro-batches); 1: synchronise (default). Read when a backward starts. */
MPT_API void mpt_ddp_set_sync(mpt_ddp *ddp, int sync);
/* All-reduces (averages) the model's whole gradient buffer now, outside any backward pass: the
 * buckets are launched in index order on the comm stream after the work enqueued so far on the
 * compute stream, and the call waits for the last one (deadline: config.timeout_ms). For
 * gradients computed without the engine's hooks, e.g. by DataParallel inside the rank (dp.h:
 * hybrid data parallelism): call it once per optimizer step, after mpt_dp_step. Gradients are
 * divided by the world size exactly once, by the all-reduce's average. Collective. Counted in the
 * stats as a pass with no overlap (backward_ms and hidden_ms 0, exposed_comm_ms the whole wait).
 * Errors: MPT_EINVAL (NULL), MPT_ESTATE (called during a backward pass), MPT_ETIMEOUT / MPT_ECOMM
 * from the collectives; on error every launched bucket has completed before the call returns. */
MPT_API mpt_status mpt_ddp_allreduce_grads(mpt_ddp *ddp);
/* The check that every rank has the same number of batches this epoch (uneven inputs: each
 * rank passes its count; MPT_EMISMATCH names the ranks that would run out). Collective.
 * Errors also: MPT_EINVAL (NULL, a count outside [0, INT32_MAX]), MPT_ENOMEM, comm errors. */
MPT_API mpt_status mpt_ddp_check_batches(mpt_ddp *ddp, int64_t local_batches);

/* ---- communication hook: a user-defined reducer ------------------------------------------
 * What the engine does with a gradient bucket once it is ready is a reducer, as in PyTorch's
 * DistributedDataParallel.register_comm_hook. The built-in ones: the all-reduce average
 * (config.allreduce NATIVE), rs-ag (RS_AG), and with ZeRO the reduce-scatter into this rank's
 * shard; each sends float32 or bfloat16 (config.grad_comm). A hook replaces the built-in
 * reducer of plain DDP. */

/* The bucket a hook reduces: a slice of the flat gradient buffer. */
typedef struct mpt_ddp_comm_bucket {
  int index;              /* launch order (0 first; mpt_ddp_bucket(ddp, index)) */
  int64_t offset, count;  /* the slice of the model's gradient buffer, in floats */
  float *grads;           /* its gradients: grads[0 .. count), in the model's memory */
  mpt_comm *comm;         /* the engine's process group */
  mpt_stream *stream;     /* the comm stream: enqueue the reduction here */
} mpt_ddp_comm_bucket;

/* A hook: enqueues on bucket->stream the work (collectives of comm.h on that stream, host
 * functions through mpt_stream_launch_host) that leaves in bucket->grads, once the stream gets
 * there, the gradients the optimizer is to use: normally their average over the ranks (divide
 * by the world size yourself when you sum). Called on the training thread, once per bucket and
 * synchronised pass (and per mpt_ddp_allreduce_grads), in index order, after the stream was
 * made to wait for the bucket's gradients; the gradients of the bucket may not be touched
 * before then on the calling thread. Every rank must enqueue the same collectives in the same
 * order. A returned error fails the backward (as a failing collective does). */
typedef mpt_status (*mpt_ddp_comm_hook)(void *state, const mpt_ddp_comm_bucket *bucket);

/* Installs `hook` (with its `state`, borrowed) as the reducer of every bucket from the next
 * pass on; NULL restores the built-in reducer. The engine's byte counts (mpt_ddp_sent_bytes,
 * mpt_ddp_step_bytes) leave a hook's collectives out. Call it on every rank alike. Errors:
 * MPT_EINVAL (NULL ddp), MPT_ESTATE (during a backward pass), MPT_ENOTSUP (ZeRO, whose
 * sharded reducer belongs to its optimizer; bf16 gradient communication, whose conversion
 * buffers belong to the built-in reducers). */
MPT_API mpt_status mpt_ddp_register_comm_hook(mpt_ddp *ddp, mpt_ddp_comm_hook hook, void *state);

/* Timings of the last synchronised pass and their running sums, in milliseconds. */
typedef struct mpt_ddp_stats {
  double backward_ms;      /* start to end of backward's nodes */
  double exposed_comm_ms;  /* time the end of backward waited for all-reduce */
  double allreduce_ms;     /* sum over buckets of each all-reduce's own duration */
  double hidden_ms;        /* all-reduce time that overlapped backward */
  int64_t steps;           /* synchronised passes counted in the sums */
  double sum_backward_ms, sum_exposed_comm_ms, sum_allreduce_ms, sum_hidden_ms;
} mpt_ddp_stats;

/* The stats, with the last pass counted: on a device the pass's timings (CUDA events) are read
 * only once they exist, so this may wait for the last pass to finish (deadline:
 * config.timeout_ms; a pass whose timings never come is dropped with a warning). */
MPT_API mpt_ddp_stats mpt_ddp_get_stats(mpt_ddp *ddp);
/* Zeroes the stats (the last pass and the sums; a pass whose timings are pending is dropped). */
MPT_API void mpt_ddp_reset_stats(mpt_ddp *ddp);

/* ---- ZeRO (config.zero = 1, 2 or 3): the sharded optimizer ---------------------------------
 * The functions of this section make up the sharded optimizer: they work for every stage (with
 * ZeRO off each does what the plain call does), so a training loop calls them always and is
 * the same whatever the stage:
 *     mpt_ddp_init -> mpt_ddp_optimizer_init -> per step: zero_grad, forward, backward (the
 *     engine's hooks reduce), mpt_ddp_grads_nonfinite, mpt_ddp_clip_grad_norm,
 *     mpt_ddp_optimizer_step -> for checkpoints mpt_ddp_optimizer_gather / _scatter, and with
 *     ZeRO-3 mpt_ddp_gather_params before reading the parameters outside a pass.
 * The shard. Every bucket of the plan (a contiguous slice of the flat buffers) is split over the
 * W ranks as mpt_comm_shard splits a buffer; rank r owns its piece of each bucket
 * (mpt_ddp_shard: the slices by offset; mpt_ddp_shard_count: their elements, about N / W). The
 * same slices are its gradient shard, its optimizer state and, under ZeRO-3, its parameter
 * shard.
 * What each rank holds between steps, and when the collectives run (N parameters, W ranks):
 *                    stage 1             stage 2              stage 3
 *   parameters       whole (N)           whole (N)            shard (N / W)
 *   gradients        whole (N)           shard (N / W)        shard (N / W)
 *   optimizer state  shard               shard                shard
 *   forward          -                   -                    each unit all-gathered when
 *                                                             first taken (the next one
 *                                                             prefetched), given back two
 *                                                             units later
 *   backward         each bucket reduce-scattered (average) into the shards as soon as it is
 *                    ready; stage 2 and 3 give the rest of its gradients back; stage 3
 *                    gathers a unit again if it was given back, and gives it back once its
 *                    gradients are reduce-scattered
 *   clip, check      mpt_ddp_clip_grad_norm, mpt_ddp_grads_nonfinite: over the shards, the W
 *                    partial results all-gathered and combined in rank order (one collective)
 *   step             mpt_ddp_optimizer_step: the shard stepped; stages 1 and 2 then all-gather
 *                    every bucket's parameters (waited for); stage 3 gives the parameters back
 *                    to the shards (the next forward gathers them)
 *   start            mpt_ddp_init broadcasts rank 0's model; stage 3 keeps only the shard, and
 *                    a model whose initialisation was deferred (nn.h, transformer.h
 *                    mpt_model_init_gpt_deferred) is initialised unit by unit, so no rank holds
 *                    more than its shard and one unit
 *   checkpoints      one whole file: mpt_ddp_optimizer_gather to the writer (bucket by bucket),
 *                    mpt_ddp_optimizer_scatter on resume; stage 3 mpt_ddp_gather_params first
 * Counters: mpt_ddp_zero_stage, mpt_ddp_param_gathers (stage 3's all-gathers),
 * mpt_ddp_sent_bytes and mpt_ddp_step_bytes (ring model). The details of each stage follow.
 * Stage 1 of ZeRO (Rajbhandari et al., SC 2020; PyTorch's ZeroRedundancyOptimizer, llm.c's
 * zero_stage 1): parameters and gradients stay whole on every rank, the optimizer state is
 * split.
 * Stage 2 (config.zero = 2; DeepSpeed's ZeRO-2): as stage 1, and once a bucket is
 * reduce-scattered the pages of its gradients outside this rank's shard (and of its bf16
 * conversion buffer) are given back to the system (madvise MADV_DONTNEED, on the comm worker
 * right after the collective): after backward only the owned slices of the gradient buffer are
 * resident (whole pages; a page cut by a shard's edge stays). zero_grad then gives back every
 * page of the buffer instead of writing zeros (the model's zero_grads hook, nn.h), so the next
 * backward finds none resident and each page is written by the backward that computes it. The
 * virtual buffer stays whole; resident at any time are the shards and the buckets computed but
 * not yet reduced (all of them at the end of a backward with overlap off) (docs/zero.md
 * "ZeRO-2").
 * Clipping, the non-finite check, the step, the all-gather and checkpoints are stage 1's: a
 * stage-2 run trains bit for bit as a stage-1 run, and as plain DDP with
 * config.allreduce = MPT_DDP_ALLREDUCE_RS_AG.
 * Stage 1 in detail. Each bucket of the plan is split over the W ranks as mpt_comm_shard splits
 * a buffer (shards of ceil(count / W), the last one shorter, trailing ranks possibly empty):
 * rank r owns its shard of every bucket, i.e. one contiguous slice of the flat buffer per
 * bucket (with a single bucket, the buffer's contiguous 1/W). A slice may cut a parameter
 * anywhere.
 *   backward   each bucket is reduce-scattered (average) on the comm stream as soon as it is
 *              ready, where plain DDP all-reduces it (overlap, no_sync, unused parameters and
 *              bf16 gradients as above; bf16: the whole bucket rounded, reduce-scattered
 *              with float32 accumulation and one rounding, this rank's shard widened and
 *              divided by W). Afterwards only
 *              the owned slices of the gradient buffer hold averaged gradients; the rest is
 *              undefined.
 *   clipping   mpt_ddp_clip_grad_norm: each rank's sum of squares over its shard (double: its
 *              slice of each bucket in increasing offset, 16 lane-wise sums per slice), the
 *              W sums all-gathered once and added in rank order on every rank, so every rank
 *              gets the same norm and scales its shard.
 *   step       mpt_ddp_optimizer_step: the optimizer (mpt_ddp_optimizer_init: state for the
 *              shard only) steps the owned slices; then every bucket's parameters are
 *              all-gathered (mpt_comm_allgather_shards) and waited for, so the replicas are
 *              whole and identical again before the call returns (before the next forward and
 *              before any evaluation or save).
 * Memory per rank: optimizer state sum_b shard_b (about N / W); gradients and parameters
 * whole; with bf16 gradients a 2-byte conversion buffer of N. Bytes sent per step per rank
 * (ring model): (W-1)/W (wire N + 4 N), wire = 4 (fp32) or 2 (bf16), against 2 (W-1)/W wire N
 * for the all-reduce: ZeRO-1 saves memory, not traffic.
 * Checkpoints hold the whole state (one file, as without ZeRO, so a run resumes with or without
 * ZeRO and with another world size's shards): mpt_ddp_optimizer_gather assembles it into a
 * whole optimizer on the writer (collective), the writer saves that; on resume a whole
 * optimizer is loaded and mpt_ddp_optimizer_scatter copies this rank's shard out of it.
 * The ckpt functions refuse a sharded optimizer. mpt_ddp_allreduce_grads reduce-scatters too (the
 * owned slices hold the average afterwards).
 * Plain DDP with config.allreduce = MPT_DDP_ALLREDUCE_RS_AG trains bit for bit as ZeRO-1 at any
 * world size (the same reduce-scatter per bucket, the same norm); with the default native
 * all-reduce, at W > 2 the sums are added in another order (docs/zero.md "Limits").
 * Host memory only (a model on a device: MPT_ENOTSUP at mpt_ddp_init). With ZeRO off every
 * function below does what the plain call does (mpt_optimizer_init, mpt_optimizer_step_model,
 * mpt_clip_grad_norm, a local mpt_op_check_finite), so a trainer can call these always. */

/* Stage 3 (config.zero = 3; DeepSpeed's ZeRO-3, PyTorch's FSDP FULL_SHARD): as stage 2, and
 * the parameters are sharded too: after each optimizer step only this rank's shard of the
 * flat parameter buffer is current and resident (the other pages are given back as stage 2
 * gives back the gradients'). The model's units (nn.h mpt_model_set_units: a GPT's embeddings,
 * each transformer block, its final LayerNorm; an mlp's or cnn's layers by parameter name) are
 * the granularity of everything: stage 3 plans one bucket per unit (config.unit_buckets is
 * forced on), so a unit is one all-gather and one reduce-scatter, and a gather brings no other
 * unit along. When a forward first takes a parameter of unit u, the units other than u and the
 * previous one are given back, and unit u is all-gathered (mpt_comm_allgather_shards, waited
 * for). With config.prefetch (the default) the next unit (u + 1 in forward, u - 1 in backward)
 * is all-gathered on the comm stream as soon as unit u is reached, so the gather overlaps unit
 * u's compute, and waited for when first needed; in backward, a node's unit is gathered again
 * before its backward runs if it was given back, and a unit's parameters are given back as
 * soon as its gradients are reduce-scattered (its last use in the pass). Tied weights (a GPT's
 * wte and head) are one parameter: gathered again for the second use, reduced once. The
 * numbers are stage 1's (the same reduce-scatter, norm and step), so a stage-3 run trains bit
 * for bit as stages 1 and 2 and as plain DDP with config.allreduce RS_AG when those plan the
 * same buckets (config.unit_buckets = 1).
 * Reading the parameters outside a training pass (saving, a checkpoint, evaluation on ranks
 * whose batch counts differ, comparing replicas) needs them whole first:
 * mpt_ddp_gather_params (collective) gathers every bucket that is not whole; the next
 * training forward gives them back unit by unit, or mpt_ddp_release_params at once.
 * A forward with gradients disabled only gathers (gives nothing back), so evaluation after
 * mpt_ddp_gather_params issues no collective. At one rank stage 3 is stage 2. */

/* Makes the parameters whole on every rank (ZeRO-3: every bucket not gathered is all-gathered,
 * waited for; otherwise nothing). Collective with ZeRO-3. Errors: MPT_EINVAL (NULL), comm
 * errors. */
MPT_API mpt_status mpt_ddp_gather_params(mpt_ddp *ddp);
/* ZeRO-3: gives back the pages of every bucket's parameters outside this rank's shard (local;
 * the next use gathers them again); otherwise nothing. Errors: MPT_EINVAL (NULL). */
MPT_API mpt_status mpt_ddp_release_params(mpt_ddp *ddp);
/* Buckets (units: one bucket each) all-gathered by ZeRO-3 since init (forward, backward and
 * mpt_ddp_gather_params); 0 otherwise. */
MPT_API int64_t mpt_ddp_param_gathers(const mpt_ddp *ddp);

/* The configured ZeRO stage (0, 1, 2 or 3); 0 for NULL. */
MPT_API int mpt_ddp_zero_stage(const mpt_ddp *ddp);
/* This rank's shard: *ranges (may be NULL) gets the owned slices sorted by offset, empty ones
 * left out; returns their number (0 with ZeRO off, or when this rank owns nothing). */
MPT_API int mpt_ddp_shard(const mpt_ddp *ddp, const mpt_optim_range **ranges);
/* Elements owned (the model's parameter count with ZeRO off). */
MPT_API int64_t mpt_ddp_shard_count(const mpt_ddp *ddp);
/* Creates the optimizer of this rank: ZeRO, mpt_optimizer_init_ranges over the shard (a
 * rank that owns nothing gets one empty range: no state); off, mpt_optimizer_init of the whole
 * model. Errors: MPT_EINVAL (NULL ddp or opt); those of the optimizer. */
MPT_API mpt_status mpt_ddp_optimizer_init(mpt_ddp *ddp, mpt_optimizer **opt,
                                          const mpt_optimizer_config *cfg, mpt_device device);
/* The optimizer step: ZeRO, mpt_optimizer_step_model (the shard), then the all-gather of
 * every bucket's parameters, waited for (deadline). Collective. Errors: those of the step;
 * MPT_EINVAL (an optimizer not made for this shard); comm errors. */
MPT_API mpt_status mpt_ddp_optimizer_step(mpt_ddp *ddp, mpt_optimizer *opt, mpt_stream *stream,
                                          float lr);
/* mpt_clip_grad_norm over the averaged gradients of all ranks (see above). Collective with
 * ZeRO. Plain DDP with config.allreduce RS_AG: the norm summed as ZeRO-1 sums it (every
 * rank's shard sum computed locally, added in rank order), then the whole buffer scaled; plain
 * DDP otherwise: mpt_clip_grad_norm. A non-finite norm is returned (the same on every rank)
 * and nothing is scaled.
 * Errors: MPT_EINVAL (NULL, max_norm not > 0), MPT_ENOMEM, comm errors. */
MPT_API mpt_status mpt_ddp_clip_grad_norm(mpt_ddp *ddp, mpt_stream *stream, float max_norm,
                                          float *total_norm);
/* *nonfinite = 1 when any averaged gradient is NaN or infinite, on every rank alike
 * (ZeRO: each shard checked, then an all-reduce max: collective; off: local, as
 * mpt_op_check_finite). Errors: MPT_EINVAL (NULL), those of the check, comm errors. */
MPT_API mpt_status mpt_ddp_grads_nonfinite(mpt_ddp *ddp, mpt_stream *stream, int *nonfinite);
/* Checkpoints. gather: fills `whole` (mpt_optimizer_init of the model's parameter count, same
 * kind, host memory) with every rank's shard of `shard`'s state and its step count
 * (collective). `whole` may be NULL on any rank: that rank only takes part (e.g. every rank but
 * the checkpoint's writer); the state travels bucket by bucket through a staging buffer of the
 * largest bucket, so a rank without `whole` holds one bucket more, not the whole state. scatter:
 * copies this rank's shard of `whole`'s state and its step count into `shard` (local). With ZeRO
 * off both copy the whole state. Errors: MPT_EINVAL (optimizers of another kind or size),
 * MPT_ENOMEM (gather's staging buffer), comm errors. */
MPT_API mpt_status mpt_ddp_optimizer_gather(mpt_ddp *ddp, mpt_optimizer *shard,
                                            mpt_optimizer *whole);
MPT_API mpt_status mpt_ddp_optimizer_scatter(mpt_ddp *ddp, mpt_optimizer *whole,
                                             mpt_optimizer *shard);
/* Bytes this rank sent in the engine's gradient and parameter collectives since init, counted
 * per collective issued in the ring model of nccl-tests (all-reduce 2 (W-1)/W bytes,
 * reduce-scatter and all-gather (W-1)/W bytes; 0 at W = 1): what the rank puts on the wire
 * with a ring algorithm, not a measurement of the MPI library. */
MPT_API double mpt_ddp_sent_bytes(const mpt_ddp *ddp);
/* The same for one synchronised step (every bucket once, plus the all-gather with ZeRO). */
MPT_API double mpt_ddp_step_bytes(const mpt_ddp *ddp);

/* A trace of core.h. */
typedef struct mpt_trace mpt_trace;

/* Trace recording (Chrome trace event format, core.h): when `trace` is set, the engine records
 * each bucket's all-reduce (start and end, on the comm thread) into it; NULL turns it off.
 * The trace is borrowed and must outlive the recording. */
MPT_API void mpt_ddp_set_trace(mpt_ddp *ddp, mpt_trace *trace);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_DDP_H */
