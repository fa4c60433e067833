/* mpitrain comm: the process group. Bootstrap (rank, world size, local rank, how the job was
 * launched) and asynchronous collectives (all-reduce, broadcast, all-gather, reduce-scatter,
 * all-gather of shards, barrier) on
 * streams. This header is the contract; the design behind it (progress modes, who keeps the
 * deadlines, what a timeout leaves behind, agreement, device backends) is docs/comm.md.
 *
 * Processes. mpirun or srun starts one process per rank; mpt_comm_init initialises MPI with
 * MPI_THREAD_MULTIPLE (the comm's worker thread calls MPI while the caller's thread may too),
 * works on its own duplicate of MPI_COMM_WORLD, and takes the local rank from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). The launcher's variables (OMPI_COMM_WORLD_* under
 * mpirun, SLURM_* under srun) are cross-checked; MPI's answer wins, and a launcher that says
 * N > 1 tasks while MPI sees a world of 1 is an error (docs/faults.md F14).
 *
 * Collectives are asynchronous: each call checks its arguments, takes the next sequence number,
 * enqueues the operation on a stream (the comm's own worker stream when `stream` is NULL) and
 * returns. Completion: record an event on the stream and wait for it, or synchronize the stream.
 *
 * Deadlines. Every collective has one: config.timeout_ms, counted from when it starts running.
 * Every wait on comm work keeps it, whatever deadline the wait itself was given (none
 * included): mpt_event_synchronize and mpt_stream_synchronize (core.h) on a stream that carries
 * the comm's collectives, mpt_comm_wait_event, the *_sync wrappers and mpt_comm_free. Past it
 * the wait returns MPT_ETIMEOUT naming the collective ("all-reduce #17 (count 4096 float32 sum)
 * did not complete within 300 s on rank 1") and the comm becomes unusable. The message goes on
 * to name the ranks of the waiter's host that hold the collective up and those waiting in it
 * ("; on host h (shared-memory progress records): holding it up: rank 2 (never started it;
 * process running; last collective started #16, completed #16); waiting in it: ranks 0, 1"),
 * from records every rank publishes in an MPI-3 shared-memory window that the others read
 * without its help (src/comm/comm_progress.c; MPI backends, not NCCL).
 *
 * Progress (config.blocking, the same on every rank). Blocking (default, fast): the worker makes
 * the blocking MPI call, which cannot be interrupted; after a timeout it may stay inside MPI for
 * ever, so mpt_comm_free abandons it and leaks the comm, mpt_comm_finalize refuses (MPT_ESTATE),
 * and the program must end the job with mpt_comm_abort. Polling: the non-blocking call polled
 * with MPI_Test; the worker keeps the deadline itself and is free again after a timeout
 * (slower: about 0.3-0.5 of the blocking mode's bandwidth here).
 *
 * Failures. Any failure makes the comm unusable (later calls return the same status) and the
 * stream that ran the collective sticky-failed (core.h), except a checked-mode mismatch, which
 * every rank skips alike. The program should print the error and call mpt_comm_abort; the library
 * never calls MPI_Abort.
 *
 * Ordering: every rank must issue the same collectives in the same order on a comm. Sequence
 * numbers are taken at enqueue; MPI matches collectives in the order they start running, so use
 * one stream per comm at a time or order several streams with events.
 *
 * Agreement (config.confirm_collectives, default on): after each collective the ranks all-reduce
 * an error flag and a hash of its signature, so that no rank reports success for a collective
 * that failed or disagreed on another (Open MPI 4.1 can complete mismatched all-reduces
 * "successfully" on one rank). Checked mode (config.check_collectives, or
 * MPT_CHECK_COLLECTIVES=1) compares (kind, count, dtype, op or root, sequence number, and the
 * caller's tag: global step and purpose, mpt_comm_set_step / mpt_comm_set_purpose) across
 * ranks before each collective and fails with MPT_EMISMATCH naming the ranks and both
 * signatures, before any data moves (docs/faults.md F09): a rank that skipped a step fails at
 * the first collective of the next one, on every rank. The agreement leaves the tag out.
 *
 * Devices (config.device), where the buffers live: MPI backend on cpu (host memory, default) or
 * cuda:N (device memory staged through pinned host buffers on the comm's CPU worker stream; a
 * CUDA stream passed as `stream` gives MPT_EINVAL); NCCL backend on cuda:N, this rank's own GPU
 * (built when configure found NCCL, else MPT_ENOTSUP), with a watchdog that aborts the NCCL
 * communicator on an asynchronous error or a timeout (docs/faults.md F13). Both device backends
 * also take small host buffers (control messages); with NCCL such a call blocks until done.
 *
 * Buffers must stay valid and untouched (recvbuf) or unmodified (sendbuf) until the collective
 * has completed on its stream. After a timeout the collective may still be pending inside MPI
 * and may still write into recvbuf: do not reuse or free the buffers; abort. */
#ifndef MPITRAIN_COMM_H
#define MPITRAIN_COMM_H

#include <stdint.h>

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A process group (opaque): mpt_comm_init / mpt_comm_free. */
typedef struct mpt_comm mpt_comm;

/* Reductions of all-reduce. AVG is SUM followed by a division by the world size on every rank
 * (float32 only), the convention of Horovod's Average and torch.distributed ReduceOp.AVG.
 * A float32 NaN on any rank gives NaN in every reduction, MIN and MAX included, whatever the
 * number of ranks (the MPI backend's own MIN / MAX; MPI_MIN / MPI_MAX may drop it), and MIN / MAX
 * of -0 and +0 are -0 / +0, so every rank gets the same bits. */
typedef enum {
  MPT_REDUCE_SUM = 0,
  MPT_REDUCE_AVG = 1,
  MPT_REDUCE_MIN = 2,
  MPT_REDUCE_MAX = 3,
} mpt_reduce_op;

/* "sum", "avg", "min", "max"; "unknown" otherwise. */
MPT_API const char *mpt_reduce_op_name(mpt_reduce_op op);

/* How the processes were started. */
typedef enum {
  MPT_LAUNCHER_PLAIN = 0,  /* no launcher: a single process (MPI singleton) */
  MPT_LAUNCHER_MPIRUN = 1, /* Open MPI's mpirun / mpiexec (OMPI_COMM_WORLD_SIZE set) */
  MPT_LAUNCHER_SRUN = 2,   /* a Slurm job step (SLURM_STEP_ID set) */
} mpt_launcher;

/* "plain process", "mpirun", "srun"; "unknown" otherwise. */
MPT_API const char *mpt_launcher_name(mpt_launcher launcher);

/* Which library runs the collectives (config.backend). */
typedef enum {
  MPT_COMM_BACKEND_MPI = 0,  /* collectives over MPI: host memory or staged CUDA memory */
  MPT_COMM_BACKEND_NCCL = 1, /* NCCL on one CUDA device per rank (MPT_ENOTSUP if not built) */
} mpt_comm_backend;

/* "mpi", "nccl"; "unknown" otherwise. */
MPT_API const char *mpt_comm_backend_name(mpt_comm_backend backend);

/* The flight recorder's size: default entries, the most a comm takes, and the bytes of a
 * collective's purpose tag (mpt_comm_set_purpose; the terminating NUL included). */
#define MPT_COMM_FLIGHT_DEFAULT 2000
#define MPT_COMM_FLIGHT_MAX 10000000
#define MPT_COMM_PURPOSE_MAX 24

/* mpt_comm_init's settings: start from mpt_comm_config_default() and change fields. */
typedef struct mpt_comm_config {
  mpt_comm_backend backend; /* MPT_COMM_BACKEND_MPI */
  /* Deadline of each collective, counted from when it starts running on its stream; also the
   * deadline of the bootstrap (every rank must reach mpt_comm_init within it). Default
   * 300000 (the trainer's --timeout flag feeds it). Must be > 0. */
  double timeout_ms;
  /* Checked mode: compare every collective's signature across ranks before it runs. Default 0;
   * the environment variable MPT_CHECK_COLLECTIVES=1 turns it on too. If any rank asks for it,
   * every rank uses it (agreed at init). */
  int check_collectives;
  /* Agreement after every collective (see above). Default 1; on for all ranks if on for any.
   * Turning it off saves one small all-reduce per collective (benchmarks of latency). In
   * blocking mode it is one more blocking MPI_Allreduce of 3 int64 per collective. */
  int confirm_collectives;
  /* Progress mode ("Progress" above, docs/comm.md): 1 (default) blocking MPI calls on the
   * worker, the deadline kept by the waiters, and a timeout means the job must abort; 0
   * non-blocking calls polled by the worker with MPI_Test, the deadline kept by the worker. If
   * any rank asks for polling, every rank polls (agreed at init: MPI does not match blocking
   * collectives with non-blocking ones). */
  int blocking;
  /* Largest element count handed to one MPI call: MPI counts are int, so larger collectives are
   * split into chunks of at most this many elements. Default and maximum INT_MAX / 2; smaller
   * values exist for tests. The smallest value over the ranks is used. */
  int64_t max_chunk_count;
  /* If non-zero (default 1), mpt_comm_init calls mpt_log_configure(rank, world, log_level, 0)
   * so that log lines and error details carry the rank. */
  int configure_log;
  mpt_log_level log_level; /* MPT_LOG_INFO */
  /* Where the collectives' buffers live (see "Devices" above). Default cpu:0 (host memory).
   * MPI backend: cpu, or cuda:N (staged through pinned host memory). NCCL backend: cuda:N, this
   * rank's own GPU (the comm's stream is created on it). Other combinations: MPT_EINVAL. */
  mpt_device device;
  /* Deadline of MPI's initialisation (MPI_Init_thread, when this call makes it), in ms; 0
   * (default): none. MPI_Init_thread blocks until every process of the job has started and
   * initialised MPI, and nothing interrupts it: a process of the job that never does (an
   * mpirun ':' part that is not this program, one stopped or crashed before MPI_Init, a
   * launcher whose PMI does not connect the processes) would hang it for ever. With a deadline a
   * watchdog thread prints what the bootstrap waits for (mpt_comm_bootstrap_stage) and this
   * process's place in the job, and ends the process with status 1 (the only place the library
   * ends a process: the thread that would return the error is inside MPI). */
  double init_timeout_ms;
  /* Flight recorder: how many of the last collectives the comm keeps (see "Flight recorder"
   * below), in [0, MPT_COMM_FLIGHT_MAX]; 0 turns it off. Default MPT_COMM_FLIGHT_DEFAULT (about
   * 100 bytes each). Per rank, not agreed: ranks may differ. */
  int64_t flight_recorder;
} mpt_comm_config;

/* The defaults noted on each field (MPI backend on cpu:0, 300 s, blocking, agreement on). */
MPT_API mpt_comm_config mpt_comm_config_default(void);

/* ---- lifetime ---------------------------------------------------------------------------- */

/* Creates the process group over all ranks of MPI_COMM_WORLD. Initialises MPI with
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) unless it already is; sets MPI_ERRORS_RETURN on
 * MPI_COMM_WORLD (Open MPI 4.1 reports errors of non-blocking collectives through it) and on the
 * comm's own duplicate. Collective: every rank must call it, within config->timeout_ms.
 * config NULL means the defaults.
 * Errors: MPT_EINVAL (bad config, or a device the backend cannot use); MPT_ENOTSUP (NCCL
 * backend or a CUDA device in a build without them); MPT_ECOMM (an MPI or NCCL call failed,
 * or MPI provides a thread level below MPI_THREAD_MULTIPLE: the detail names both levels);
 * MPT_EMISMATCH (the launcher says N > 1 tasks but MPI sees a world of 1: srun without a working
 * PMI plugin, or mpirun from a different MPI; the detail names the variable, N and the fix);
 * MPT_ETIMEOUT (not every rank reached the bootstrap in time); MPT_ESTATE (MPI was already
 * finalized); MPT_ENOMEM.
 * On error *comm is NULL and MPI stays initialised (call mpt_comm_finalize or mpt_comm_abort).
 * When it initialises MPI it first sets OMPI_MCA_mpi_yield_when_idle=1 in the environment unless
 * the variable is set (mpirun --mca mpi_yield_when_idle 0 or the variable keeps Open MPI's
 * default): Open MPI's progress loop then yields the core while a blocking collective waits
 * instead of spinning, so the comm worker, busy during the backward pass, does not take the
 * compute threads' cores (docs/cluster.md, "Cores and the comm thread"). Other MPIs ignore it.
 * Thread rules: call from one thread, before the program's other threads read the environment;
 * not concurrently with other MPI use. */
MPT_API mpt_status mpt_comm_init(mpt_comm **comm, const mpt_comm_config *config);

/* What an mpt_comm_init running in this process waits for right now, as a phrase naming the MPI
 * call and who it waits for ("MPI_Init_thread, which returns once every process of the job has
 * started and initialised MPI"), or "" when none runs. MPI_Init_thread itself has no deadline
 * (it blocks until every process arrives, and nothing can interrupt it), so a program that must
 * not hang watches the bootstrap from another thread with its own deadline, and names this on
 * expiry (mpitrain does, with --timeout). A static string; any thread. */
MPT_API const char *mpt_comm_bootstrap_stage(void);

/* Drains the comm's own stream (each queued collective ends by its deadline), frees it, and
 * frees the communicator. Streams the caller passed to collectives must have been synchronized
 * first. NULL is a no-op. Does not finalize MPI. Blocking mode: it waits for the stream with
 * the waiters' deadline; if a collective is still inside MPI past its deadline (this one or an
 * earlier timeout), it marks the comm failed, abandons the worker thread (mpt_stream_abandon)
 * and leaks the comm's state instead of hanging: MPI can then not be finalized (see
 * mpt_comm_finalize); abort. */
MPT_API void mpt_comm_free(mpt_comm *comm);

/* Calls MPI_Finalize if mpt_comm_init initialised MPI and it was not finalized yet; otherwise
 * does nothing. Call after every comm was freed. Errors: MPT_ESTATE (comms still alive, or a
 * comm was freed with a collective stuck inside MPI after a blocking-mode timeout: MPI_Finalize
 * would hang, so it is not called; end the job with mpt_comm_abort), MPT_ECOMM. */
MPT_API mpt_status mpt_comm_finalize(void);

/* Flushes stdout and stderr, then MPI_Abort(MPI_COMM_WORLD, code): ends every rank of the job
 * (comm may be NULL; it only documents which group failed). exit(code) when MPI is not
 * initialised. For programs (cli, bench, tests) after printing the error: the library never
 * calls it. Does not return. */
MPT_API void mpt_comm_abort(const mpt_comm *comm, int code);

/* ---- properties (constant after init; any thread) ---------------------------------------- */

/* This rank in the comm (= its MPI_COMM_WORLD rank) and the number of ranks. comm must not be
 * NULL (as for every property below). */
MPT_API int mpt_comm_rank(const mpt_comm *comm);
MPT_API int mpt_comm_world_size(const mpt_comm *comm);
/* Rank among the processes of this host (from MPI_COMM_TYPE_SHARED) and their number. */
MPT_API int mpt_comm_local_rank(const mpt_comm *comm);
MPT_API int mpt_comm_local_size(const mpt_comm *comm);
/* This host's name (gethostname); owned by the comm. */
MPT_API const char *mpt_comm_hostname(const mpt_comm *comm);
/* How the processes were started ("Processes" above). */
MPT_API mpt_launcher mpt_comm_launcher(const mpt_comm *comm);
/* config.backend. */
MPT_API mpt_comm_backend mpt_comm_backend_kind(const mpt_comm *comm);
/* The agreed settings (after the env variable and the agreement across ranks): 1 when checked
 * mode is on. */
MPT_API int mpt_comm_checked(const mpt_comm *comm);
/* 1 in blocking mode, 0 in polling mode (config.blocking as agreed). */
MPT_API int mpt_comm_blocking(const mpt_comm *comm);
/* config.timeout_ms: each collective's deadline, in milliseconds. */
MPT_API double mpt_comm_timeout_ms(const mpt_comm *comm);
/* The comm's own worker stream, where collectives go when no stream is given. */
MPT_API mpt_stream *mpt_comm_stream(mpt_comm *comm);
/* The number of collectives enqueued so far = the sequence number the next one gets (the first
 * is #0). Ranks that issued the same collectives have equal values. */
MPT_API uint64_t mpt_comm_sequence(const mpt_comm *comm);
/* MPT_OK, or the status of the collective that left the comm unusable. */
MPT_API mpt_status mpt_comm_error(const mpt_comm *comm);
/* Names the collective of this comm that has been running longest, in either mode, as text in
 * buf (nbytes including the terminating NUL; longer text is cut):
 * "all-reduce #17 (count 4096 float32 sum) running for 300.2 s on rank 1" (with "the agreement
 * after " or "checked mode: the signature exchange before " in front when it is in those
 * steps, and "; N more in flight" when several run on different streams), or
 * "no collective in flight". A collective is in flight from its first MPI call to its last, so
 * one still queued behind others is not. For a waiter whose own event wait expired (blocking
 * mode): print this, then abort. The NCCL backend keeps no such list (it names the collective
 * in its own timeout and error details): "no collective in flight".
 * Errors: MPT_EINVAL (NULL comm or buf, nbytes 0).
 * Thread rules: any thread, at any time (it takes the comm's internal lock briefly). */
MPT_API mpt_status mpt_comm_describe_inflight(const mpt_comm *comm, char *buf, size_t nbytes);
/* Waits for `event` (recorded on a stream that carries this comm's collectives) with the comm's
 * deadline, the way the *_sync wrappers do in blocking mode: MPT_ETIMEOUT once the oldest
 * collective in flight has run for timeout_ms, or once no collective has started on the comm
 * for timeout_ms while the event is pending, with the same words as the polling mode's detail
 * ("all-reduce #17 (count 4096 float32 sum) did not complete within 300 s on rank 1"), and the
 * comm is marked unusable (then abort). Otherwise the event's own status (that of its stream).
 * In polling mode the workers keep the deadlines and this wait only backs them up, after
 * max(1 s, timeout_ms / 10) more. mpt_event_synchronize(event, -1) on the same event keeps the
 * same deadline (docs/comm.md); this wait adds the idle rule above and, with NCCL, polls its
 * asynchronous errors. Errors: MPT_EINVAL (NULL comm or event), MPT_ETIMEOUT, the stream's
 * error.
 * Thread rules: any thread; several may wait at once. */
MPT_API mpt_status mpt_comm_wait_event(mpt_comm *comm, mpt_event *event);

/* ---- collectives (asynchronous) ----------------------------------------------------------
 * Common rules: stream NULL = mpt_comm_stream(comm). count is in elements (>= 0); count 0
 * returns MPT_OK at once without a sequence number (in checked mode it still takes part in the
 * signature check, so a rank with 0 against a rank with 8 is caught). dtype: MPT_F32, MPT_I32,
 * MPT_U8, MPT_BF16 (see "bfloat16" below). Returns after enqueueing; errors of the collective
 * itself arrive on the stream:
 * MPT_ECOMM (an MPI error: the detail names the MPI call, its error string, the collective and
 * its sequence number, and the rank), MPT_ETIMEOUT, MPT_EMISMATCH (checked mode or agreement).
 * Immediate errors: MPT_EINVAL (NULL comm, negative count, NULL buffer with count > 0, bad dtype,
 * op or root, overlapping buffers that are not exactly in place; no sequence number is taken);
 * the comm's error if it is unusable; the stream's sticky error (the sequence number was taken:
 * the comm is of no further use on this stream); MPT_ENOMEM.
 * Thread rules: callable from any thread, but see "Ordering" above. */

/* recvbuf[i] = op over ranks of sendbuf[i], for i < count, on every rank. sendbuf == recvbuf
 * means in place. AVG: float32 only; the sum divided by the world size. Algorithm: MPI's
 * (Open MPI coll/tuned MPI_Allreduce in blocking mode, libnbc MPI_Iallreduce in polling
 * mode). */
MPT_API mpt_status mpt_comm_allreduce(mpt_comm *comm, mpt_stream *stream, const void *sendbuf,
                                      void *recvbuf, int64_t count, mpt_dtype dtype,
                                      mpt_reduce_op op);

/* buf[0..count) of rank `root` is copied to buf on every other rank. */
MPT_API mpt_status mpt_comm_broadcast(mpt_comm *comm, mpt_stream *stream, void *buf,
                                      int64_t count, mpt_dtype dtype, int root);

/* recvbuf (world_size * count elements, rank-major: rank r's block at r * count) receives
 * every rank's sendbuf (count elements). In place when sendbuf == recvbuf + rank * count
 * (element offset). */
MPT_API mpt_status mpt_comm_allgather(mpt_comm *comm, mpt_stream *stream, const void *sendbuf,
                                      void *recvbuf, int64_t count, mpt_dtype dtype);

/* ---- sharded collectives (ZeRO-1: each rank owns one contiguous shard of a flat buffer) ----
 * Shards of `count` elements over W ranks: S = ceil(count / W); rank r owns the elements
 * [r * S, min((r + 1) * S, count)), so every shard but the trailing ones has S elements, the
 * last non-empty shard may be shorter, and when count < W * S - S some last ranks own none
 * (count 5 over 4 ranks: 2, 2, 1, 0). The layout of PyTorch's ZeroRedundancyOptimizer over a
 * flat buffer and of llm.c's ZeRO-1 (which pads instead). */

/* Pure: this rank's shard, *offset (elements; count when the shard is empty) and *shard_count
 * (>= 0). world_size > 0, 0 <= rank < world_size, count >= 0; otherwise both are 0. */
MPT_API void mpt_comm_shard(int64_t count, int world_size, int rank, int64_t *offset,
                            int64_t *shard_count);

/* Reduce-scatter: recvbuf[i] = op over ranks of sendbuf[offset + i], for i < shard_count, where
 * (offset, shard_count) = mpt_comm_shard(count, W, rank): sendbuf holds `count` elements on
 * every rank, recvbuf this rank's shard_count. op: SUM or AVG (AVG as in all-reduce: the sum
 * divided by W), dtype float32, int32 (SUM) or bfloat16 (see "bfloat16" below). In place when
 * recvbuf == sendbuf + offset (elements); the other elements of sendbuf are then undefined
 * afterwards. Any other overlap is MPT_EINVAL.
 * Algorithm: MPI_Reduce_scatter with per-rank counts (blocking mode) or MPI_Ireduce_scatter
 * (polling mode) for a buffer of at most 1 Mi elements (and max_chunk_count); a larger one is
 * reduced in pieces of that many elements of each shard, one MPI_Reduce per owner and piece
 * (Open MPI's MPI_Reduce_scatter allocated temporaries of about twice the message per call:
 * docs/zero.md "Memory and traffic"). bfloat16: MPI_Alltoallv and one rounding ("bfloat16").
 * Backends: MPI on host memory; NCCL on device buffers (a grouped ncclReduce per rank, so
 * uneven shards need no padding); MPI with device buffers: MPT_ENOTSUP.
 * The checked mode and the agreement compare (kind, count, dtype, op, sequence number). */
MPT_API mpt_status mpt_comm_reduce_scatter(mpt_comm *comm, mpt_stream *stream,
                                           const void *sendbuf, void *recvbuf, int64_t count,
                                           mpt_dtype dtype, mpt_reduce_op op);

/* All-gather of shards, in place: on entry each rank's shard of buf (mpt_comm_shard(count, W,
 * rank)) holds its data; on completion every rank's buf holds every shard, count elements in
 * all (no padding: the last shard shorter). What ZeRO-1 does with the parameters after each
 * rank stepped its shard. Algorithm: MPI_Allgatherv in place (MPI_Iallgatherv polling); chunked
 * by shard above max_chunk_count. Backends as mpt_comm_reduce_scatter (NCCL: a grouped
 * ncclBroadcast per rank). */
MPT_API mpt_status mpt_comm_allgather_shards(mpt_comm *comm, mpt_stream *stream, void *buf,
                                             int64_t count, mpt_dtype dtype);

/* bfloat16 (MPT_BF16). All-reduce and reduce-scatter take bfloat16 buffers with SUM or AVG
 * (MIN and MAX: MPT_EINVAL). MPI backend: bfloat16 on the wire, float32 accumulation, one
 * rounding. Every rank sends each shard's owner (mpt_comm_shard) its piece of the buffer
 * (MPI_Alltoallv, (W-1)/W of the buffer per rank, as a ring reduce-scatter); the owner widens
 * the W pieces, adds them in float32 in rank order (0, 1, ..., W-1), divides by W in float32
 * for AVG, and rounds once to bfloat16 (nearest even; NaN stays NaN); the all-reduce then
 * all-gathers the shards. So all-reduce and reduce-scatter give the same bits for an element,
 * whatever MPI's algorithms, and no partial sum is rounded to bfloat16 (an MPI_Op on bfloat16
 * would round at each hop: eight ranks holding 1, 1/512, ..., 1/512 would read 1.0078125
 * instead of 1.015625, an error growing with W; tests/test_comm_bf16.c). Error bound, per
 * element, for inputs x_r already bfloat16 with sum s = sum_r x_r, u = 2^-8 (the one
 * rounding) and e = 2^-24 (float32):
 *     |result - s| <= u |s| + gamma_e(W - 1) (1 + u) sum_r |x_r|,   gamma_e(k) = k e / (1 - k e)
 * (AVG: the same over W, plus a float32 division). The W-dependent term is float32's: for any
 * practical W the bound is about u |s|. Rounding float32 inputs g_r to bfloat16 first
 * (mpt_bf16_round_array) adds u |g_r| each. When the sum is representable in bfloat16 and
 * float32 adds it exactly (small integers) the result is exact. The temporaries are a send and
 * a receive buffer of at most 512 Ki bfloat16 elements each per call (rounds of 512 Ki / W
 * elements per rank, and of max_chunk_count / W at most). NCCL backend: the same
 * arithmetic, so the same bits: one NCCL group of ncclSend / ncclRecv per round moves the
 * bfloat16 pieces to their owners, a CUDA kernel widens the W pieces of the owner's shard, adds
 * them in float32 in rank order, divides by W for AVG and rounds once; the all-reduce then
 * all-gathers the shards (grouped ncclBroadcast). Its temporary is one device buffer of W
 * pieces (at most 512 Ki elements in all), stream-ordered (cudaMallocAsync / cudaFreeAsync on
 * the collective's stream). Never NCCL's own bfloat16 reduction, which rounds each partial sum
 * (per hop: gamma(W - 1) sum_r |x_r| with u as above, gamma(k) = k u / (1 - k u)).
 * Broadcast and all-gather move bfloat16 as 2-byte elements. */

/* Completes on each rank once every rank has reached it. */
MPT_API mpt_status mpt_comm_barrier(mpt_comm *comm, mpt_stream *stream);

/* ---- synchronous wrappers (for setup code) ----------------------------------------------
 * Enqueue on the comm's own stream, record an event, and wait for it. Return the collective's
 * status with its detail. Deadline: polling mode, none of their own (every collective ends by
 * its own deadline on the worker, so the wait ends by the deadlines of the work queued ahead
 * of it). Blocking mode, the comm's timeout as their own deadline: MPT_ETIMEOUT once the oldest
 * collective in flight (theirs, or one queued ahead of it) has run for timeout_ms, or once the
 * stream has started no collective for timeout_ms, with "all-reduce #17 (count 4096 float32
 * sum) did not complete within 300 s on rank 1" (the same words as polling mode), and the comm
 * is marked unusable; then abort (see "Progress"). Concurrent calls are serialised. Not for the
 * training step (they block), and never from a host function running on the comm's own stream
 * (mpt_comm_stream: the comm thread), which they would wait for. */
MPT_API mpt_status mpt_comm_allreduce_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                           int64_t count, mpt_dtype dtype, mpt_reduce_op op);
MPT_API mpt_status mpt_comm_broadcast_sync(mpt_comm *comm, void *buf, int64_t count,
                                           mpt_dtype dtype, int root);
MPT_API mpt_status mpt_comm_allgather_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                           int64_t count, mpt_dtype dtype);
MPT_API mpt_status mpt_comm_reduce_scatter_sync(mpt_comm *comm, const void *sendbuf,
                                                void *recvbuf, int64_t count, mpt_dtype dtype,
                                                mpt_reduce_op op);
MPT_API mpt_status mpt_comm_allgather_shards_sync(mpt_comm *comm, void *buf, int64_t count,
                                                  mpt_dtype dtype);
MPT_API mpt_status mpt_comm_barrier_sync(mpt_comm *comm);

/* ---- flight recorder (src/comm/flight.c; docs/hangs.md) ------------------------------------
 * Every comm keeps its last config.flight_recorder collectives in a ring buffer allocated at
 * init: sequence number, op, dtype, count, root or reduction, the caller's tag (global step and
 * purpose, below), the times it was enqueued, started and finished (mpt_time_ms, this host's
 * monotonic clock), and its state (queued, running, done, failed). The MPI backend records all
 * four states; the NCCL backend records the enqueue only. No lock and no allocation after init
 * (PyTorch's NCCL Flight Recorder keeps the same kind of ring). At bootstrap every rank's host
 * name and process id are gathered once, so one rank's dump names all the others.
 *
 * A dump (mpt_comm_flight_dump) writes "DIR/flight-rankR.txt": a header (format line, "rank R
 * of W", host, pid, reason, now_ms, wall_s, timeout_ms, capacity, next_seq), one "peer R pid P
 * host H" line per rank, one line per recorded collective ("c seq=17 op=all-reduce
 * dtype=float32 count=4096 arg=1 step=12 state=done enq=... start=... end=... purpose=grad
 * bucket 0", times in ms of now_ms's clock, 0 for not yet), and "end N" (N collective lines):
 * a file without it was cut short. `mpitrain hang-report DIR` merges the dumps of every rank. */

/* Tags the collectives this thread enqueues from now on with `purpose` (what they are for:
 * "grad bucket 3", "stop vote", "eval"; NULL or "" for none): at most MPT_COMM_PURPOSE_MAX - 1
 * bytes are kept (longer text is cut), control characters become '_'. The tag goes into the
 * flight recorder and, in checked mode, into the signature compared across ranks, so ranks
 * must tag the same collective alike. Thread rules: call from the thread that enqueues the
 * collectives (the tag is the comm's, not per thread; the trainer's thread for the loop's
 * comm). Errors: MPT_EINVAL (NULL comm). */
MPT_API mpt_status mpt_comm_set_purpose(mpt_comm *comm, const char *purpose);

/* Tags the collectives enqueued from now on with the global training step `step` (a negative
 * value: none, recorded as -1). Checked mode compares it across ranks, so a rank that skipped
 * a step (or synced alone) fails at its first collective, on every rank, naming the ranks and
 * their steps. Thread rules as mpt_comm_set_purpose. NULL comm: no-op. */
MPT_API void mpt_comm_set_step(mpt_comm *comm, int64_t step);

/* The host name of `rank` (gathered at bootstrap, at most 59 bytes), "" for a rank out of
 * range or a NULL comm. Owned by the comm. Any thread. */
MPT_API const char *mpt_comm_rank_host(const mpt_comm *comm, int rank);

/* Entries the flight recorder keeps (0: off, or NULL comm). Any thread. */
MPT_API int64_t mpt_comm_flight_capacity(const mpt_comm *comm);

/* Where this comm's dumps go: DIR/flight-rankR.txt (the folder is made at the first dump);
 * NULL or "" forgets the folder (dumps then return MPT_ESTATE). The trainer sets it for its
 * run (trainer.h debug_dir) and dumps on SIGUSR2 and fatal signals. Errors: MPT_EINVAL (NULL
 * comm, a path longer than 4000 bytes). Call from one thread while no dump runs. */
MPT_API mpt_status mpt_comm_set_debug_dir(mpt_comm *comm, const char *dir);

/* The path of this rank's dump (DIR/flight-rankR.txt) into buf (nbytes with the NUL). Errors:
 * MPT_EINVAL (NULL arguments, too small a buffer), MPT_ESTATE (no debug folder set). */
MPT_API mpt_status mpt_comm_flight_path(const mpt_comm *comm, char *buf, size_t nbytes);

/* Writes the flight recorder's dump (format above) with `reason` ("SIGUSR2", "collective
 * timeout"...; a line of text) to DIR/flight-rankR.txt: written to DIR/flight-rankR.txt.tmp
 * line by line, then renamed, so a rank killed mid-write leaves the .tmp with every line
 * written so far and readers never see a half-written .txt. Async-signal-safe: only mkdir, open,
 * write, close and rename, no allocation, no lock, so a fatal-signal handler may call it; it
 * reads the ring while collectives run (an entry being refilled is left out). Errors (the code
 * only, no detail text: it runs in signal handlers): MPT_EINVAL (NULL comm), MPT_ESTATE (no
 * debug folder set), MPT_EIO (the file could not be written). Any thread. */
MPT_API mpt_status mpt_comm_flight_dump(const mpt_comm *comm, const char *reason);

/* ---- device binding (src/comm/devmap.c; docs/faults.md F11, F12) -------------------------------
 * One GPU per rank: a rank uses the device whose index is its local rank (the rank among the
 * processes of its host, from MPI_COMM_TYPE_SHARED, never a launcher variable such as a stale
 * SLURM_LOCALID) among the devices visible to it. A local rank at or beyond the number of
 * visible devices is an error, never a silent modulo (which would put two ranks on one GPU).
 * Before NCCL init, every rank's (host, device) pair is gathered and two ranks of one host on
 * one device are named. The convention of torchrun's LOCAL_RANK and Horovod's local_rank.
 *
 * Physical identity. CUDA ordinals are relative to each process's CUDA_VISIBLE_DEVICES, which
 * launchers often set per rank (srun --gpus-per-task=1, --gpu-bind): then every rank sees one
 * device, "cuda:0", and ordinals say nothing about which GPU it is. So when the devices' UUIDs
 * (or PCI bus ids) are known, every rank gathers the list of its visible devices' identities
 * and the ranks of a host are assigned in local-rank order, each to the first device of its own
 * list that no lower local rank of the host took (mpt_device_assign): with one shared list in
 * one order that is device <local rank>, as before; with per-rank lists each rank gets its own;
 * with one visible device a rank uses it; lists in different orders cannot put two ranks on one
 * GPU. Only ranks left without a free device fail: two ranks whose only device is the same
 * physical GPU (a true duplicate), or more local ranks than devices. */

/* Pure: *index = local_rank when local_rank < visible_count.
 * Errors: MPT_EINVAL naming the local rank and the count ("local rank 2 (of 4 on this host) has
 * no device: 2 visible devices"), or for arguments out of range (negative, local_rank >=
 * local_size). */
MPT_API mpt_status mpt_device_pick(int local_rank, int local_size, int visible_count,
                                   int *index);

/* Sizes of a claim's device identities. */
enum {
  MPT_DEVICE_UID_NBYTES = 16, /* a CUDA device UUID; a PCI bus id when the UUID is unknown */
  MPT_DEVICE_LIST_MAX = 16,   /* visible devices whose identity a claim carries */
};
/* One rank's claim on a device, as gathered across ranks (a plain, fixed-size record). */
typedef struct mpt_device_claim {
  int32_t rank;
  int32_t local_rank;
  int32_t local_size;
  int32_t index;         /* device index; -1: the rank has no device (its pick failed) */
  int32_t visible_count; /* devices the rank could see */
  int32_t type;          /* mpt_device_type */
  uint64_t host_hash;    /* 64-bit FNV-1a of the full host name */
  char host[64];         /* host name, truncated, NUL-terminated */
  int32_t nids;          /* identities in visible_ids (0: unknown, bind by ordinal) */
  int32_t reserved;      /* 0 */
  /* Physical identity of each visible device, in the rank's own visible order, and of the
   * device claimed (all zero: unknown; duplicates are then found by index). */
  uint8_t visible_ids[MPT_DEVICE_LIST_MAX][MPT_DEVICE_UID_NBYTES];
  uint8_t uid[MPT_DEVICE_UID_NBYTES];
} mpt_device_claim;

/* Pure: fills a claim (host name hashed in full, stored truncated). */
MPT_API void mpt_device_claim_fill(mpt_device_claim *claim, int rank, int local_rank,
                                   int local_size, mpt_device_type type, int index,
                                   int visible_count, const char *host);

/* Pure: records the physical identities of the rank's visible devices (ids[k]: visible device
 * k, MPT_DEVICE_UID_NBYTES bytes each; at most MPT_DEVICE_LIST_MAX are kept), and sets
 * visible_count to n. */
MPT_API void mpt_device_claim_set_ids(mpt_device_claim *claim,
                                      const uint8_t (*ids)[MPT_DEVICE_UID_NBYTES], int n);

/* Pure: assigns devices to the claims of n ranks (the gathered claims, any order). Claims with
 * identities (nids > 0) are assigned per host in local-rank order: each takes the first device
 * of its own visible list that no lower local rank of its host took (index = its position in
 * the rank's list, uid = its identity), or none (index -1). Claims without identities keep
 * index = local rank when below visible_count, else -1 (mpt_device_pick). Every rank that
 * assigns the same claims gets the same result. Errors: MPT_EINVAL for NULL claims with n > 0
 * or n < 0; MPT_ENOMEM. */
MPT_API mpt_status mpt_device_assign(mpt_device_claim *claims, int n);

/* Pure: checks the claims of n ranks, in this order, and reports every offender of the first
 * kind found, lowest ranks first, so that every rank that checks the same claims reports the
 * same words:
 *   - MPT_EINVAL: ranks without a device ("no cuda device for local rank 2 (rank 2) and local
 *     rank 3 (rank 3) on host node7: 2 visible cuda devices for 4 local ranks; ...");
 *     A rank whose only candidates were taken by lower local ranks is named with the rank
 *     that holds its device ("its only device GPU-... is used by rank 0").
 *   - MPT_EMISMATCH: two ranks on one host with the same device ("ranks 0 and 2 both use
 *     cuda:0 on host node7 ..."; the host is the same when hash and truncated name agree; the
 *     device is the same when both uids are known and equal, else when the indices are).
 * Errors also: MPT_EINVAL for NULL claims with n > 0 or n < 0. MPT_OK otherwise. */
MPT_API mpt_status mpt_device_claims_check(const mpt_device_claim *claims, int n);

/* Collective over a comm whose collectives take host memory (MPI backend, device cpu): gathers
 * every rank's (host, device) claim (one all-gather of fixed-size records, with the comm's
 * deadline) and checks them with mpt_device_claims_check, so every rank returns the same
 * verdict and words. `device` is this rank's device; its index may be anything (fake devices
 * in tests); its type must be the same on every rank. Errors: those of the check, and of the
 * all-gather (MPT_ECOMM, MPT_ETIMEOUT); MPT_EINVAL for a NULL comm or a comm on a device;
 * MPT_ENOMEM. */
MPT_API mpt_status mpt_comm_check_devices(mpt_comm *comm, mpt_device device);

/* Collective (same comm rules): binds this rank to a device of `type`. CUDA: with
 * visible_count negative, the real devices: their identities (UUID, else PCI bus id) are
 * gathered and assigned by mpt_device_assign (see "Physical identity"). Other values are for
 * tests and for callers that restrict the devices: picks cuda:<local rank> among
 * `visible_count` devices by ordinal. Then gathers and
 * checks every rank's claim (a rank whose pick failed takes part with no device, so that every
 * rank fails together, with the same words, instead of waiting for it), and, when the count
 * was the real one, makes the device current on the calling thread (mpt_device_set_current:
 * CUDA contexts then appear on this device only). CPU: *device = cpu:0, no collective.
 * Errors: as mpt_device_claims_check (MPT_EINVAL: a local rank beyond the visible devices;
 * MPT_EMISMATCH: two ranks on one device of one host), of the all-gather, of set_current;
 * MPT_EINVAL for NULL arguments; MPT_ENOMEM. On error *device is cpu:0. Call before creating the
 * NCCL comm (config.device = *device). */
MPT_API mpt_status mpt_comm_bind_device(mpt_comm *comm, mpt_device_type type, int visible_count,
                                        mpt_device *device);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_COMM_H */
