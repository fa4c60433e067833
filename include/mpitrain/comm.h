/* mpitrain comm: the process group. Bootstrap (rank, world size, local rank, how the job was
 * launched) and asynchronous collectives (all-reduce, broadcast, all-gather, barrier) on
 * streams.
 *
 * Processes. mpirun or srun starts one process per rank; mpt_comm_init initialises MPI (asking
 * for MPI_THREAD_MULTIPLE, because the comm worker thread calls MPI while the caller's thread
 * may too), duplicates MPI_COMM_WORLD into the comm's own communicator, and takes the local rank
 * from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). The launcher's variables
 * (OMPI_COMM_WORLD_SIZE / _RANK / _LOCAL_RANK under mpirun, SLURM_NTASKS / SLURM_PROCID /
 * SLURM_LOCALID under srun) are cross-checked; MPI's answer wins, and a launcher that says N > 1
 * tasks while MPI sees a world of 1 is an error (FAULTS.md F14).
 *
 * Collectives are asynchronous: each call checks its arguments, takes the next sequence number
 * and enqueues the operation on a stream (the comm's own worker stream when `stream` is NULL),
 * then returns. Completion is observed the usual way: record an event on the stream and wait on
 * it (or mpt_stream_synchronize). Every collective has a deadline (config.timeout_ms, counted
 * from when it starts running). A failure makes the comm unusable (later calls return the same
 * status), except for a checked-mode mismatch (which every rank skips alike): the program
 * should print the error and call mpt_comm_abort. The library itself never calls MPI_Abort.
 *
 * Progress (config.blocking). The stream's worker thread runs each collective in one of two
 * modes, the same on every rank:
 *   - blocking (default): the blocking MPI call (MPI_Allreduce, MPI_Bcast, MPI_Allgather,
 *     MPI_Barrier) on the worker, a thread dedicated to communication as in Horovod's
 *     background thread. This is the fast path: Open MPI's blocking collectives progress inside
 *     the call, its non-blocking ones only inside MPI_Test. A blocking MPI call cannot be
 *     interrupted, so the worker cannot keep the deadline; whoever waits does. The *_sync
 *     wrappers, mpt_comm_wait_event and mpt_comm_free do so themselves: when the oldest
 *     collective in flight has run for timeout_ms they return MPT_ETIMEOUT with "all-reduce #17
 *     (count 4096 float32 sum) did not complete within 300 s on rank 1" and mark the comm
 *     unusable. A caller waiting with mpt_event_synchronize(event, its deadline) gets a plain
 *     event timeout instead and should name the collective with mpt_comm_describe_inflight (or
 *     wait with mpt_comm_wait_event); a wait without a deadline (-1) on comm work can hang
 *     forever in blocking mode. After such a timeout the
 *     worker thread may sit inside MPI forever: mpt_comm_free then abandons it
 *     (mpt_stream_abandon) and leaks the comm instead of hanging, and MPI can no longer be
 *     finalized cleanly (mpt_comm_finalize refuses with MPT_ESTATE). A program must end the
 *     job with mpt_comm_abort after a timeout in blocking mode (the trainer does).
 *   - polling (blocking = 0): the non-blocking call (MPI_Iallreduce, ...) polled with MPI_Test
 *     until it completes or its deadline passes; the worker keeps the deadline itself, so the
 *     stream fails with MPT_ETIMEOUT and the same detail, and every wait on it returns that.
 *     Slower (Open MPI 4.1, 2 ranks on one host, 1-64 MiB: 0.3-0.5 of raw MPI_Allreduce's
 *     bandwidth, against 0.9-1.0 in blocking mode), but a timed-out collective leaves the
 *     worker free, so mpt_comm_free does not leak and MPI can still be finalized.
 * In both modes a failure makes the stream sticky-failed (core.h) once its collective returns.
 *
 * Ordering: every rank must issue the same collectives in the same order on a comm. Use one
 * stream per comm at a time, or order several streams with events: sequence numbers are taken
 * when a collective is enqueued, MPI matches them in the order they start running.
 *
 * Agreement (on by default, config.confirm_collectives): after each collective the ranks
 * all-reduce one small record (an error flag and a hash of the collective's signature), so that
 * no rank reports success for a collective that failed or disagreed on another rank. This
 * matters with Open MPI 4.1: an all-reduce with mismatched counts completes "successfully" with
 * a partial result on the rank with the larger count while the others get MPI_ERR_TRUNCATE.
 * Checked mode (config.check_collectives, or MPT_CHECK_COLLECTIVES=1) also all-gathers
 * (kind, count, dtype, op or root, sequence number) before each collective and fails with
 * MPT_EMISMATCH naming the ranks and both signatures ("rank 0 all-reduces 8 float32 (sum) as
 * collective #3, rank 1 all-reduces 4 float32 (sum) as collective #3") on every rank, before any
 * data moves (FAULTS.md F09). Its exchange has the collective's deadline too.
 *
 * Backends are tables of functions (src/comm/comm_impl.h): MPI (host memory, or CUDA memory
 * staged through pinned host buffers) and NCCL (CUDA memory, one GPU per rank; built when
 * configure found NCCL, else MPT_ENOTSUP). See "Devices" below.
 *
 * Devices (config.device). The buffers of a comm's collectives live on one device:
 *   - MPI backend, cpu (default): host memory, as above.
 *   - MPI backend, cuda:N: device memory of cuda:N. Each collective runs on the comm's CPU
 *     worker stream as: copy the device buffer into a pinned host buffer (cudaMemcpyAsync on a
 *     private stream of cuda:N, waited for with the collective's deadline), the MPI collective
 *     on the host copy, copy back. Several ranks may share one GPU (tests on one GPU). Stream
 *     ordering: a producer on a CUDA stream records an event there and makes the comm stream
 *     wait for it (mpt_stream_wait_event: the worker polls the CUDA event with the deadline);
 *     a consumer on a CUDA stream waits on an event recorded on the comm stream (the CUDA
 *     backend's host-function wait). The DDP engine does exactly this. Only CPU worker streams
 *     may carry such collectives (a CUDA stream passed as `stream` gives MPT_EINVAL).
 *     Pinned buffers are cached per comm (no allocation once the sizes repeat).
 *   - NCCL backend, cuda:N (required): ncclAllReduce / ncclBroadcast / ncclAllGather on the
 *     comm's own stream (a non-blocking CUDA stream of cuda:N) or a CUDA stream of cuda:N given
 *     by the caller. Bootstrap: rank 0 calls ncclGetUniqueId, the 128 bytes are broadcast over
 *     the comm's MPI communicator, a barrier, then ncclCommInitRankConfig with a non-blocking
 *     config polled with ncclCommGetAsyncError until ready or timeout_ms (then ncclCommAbort and
 *     MPT_ETIMEOUT; FAULTS.md F13). A watchdog thread polls ncclCommGetAsyncError and the age of
 *     the collectives in flight: an asynchronous NCCL error, or a collective not complete
 *     timeout_ms after it was enqueued, aborts the NCCL communicator (its kernels stop), marks
 *     the comm unusable and the comm's own stream failed with MPT_ECOMM / MPT_ETIMEOUT naming
 *     the collective and the rank. mpt_comm_wait_event and the *_sync wrappers poll the same
 *     checks. Barrier = an all-reduce of one float. Checked mode exchanges the signatures over
 *     MPI on the caller's thread before enqueueing (a mismatch is returned at once, nothing is
 *     enqueued, the comm stays usable); the agreement after each collective (confirm) is an MPI
 *     matter and does not apply. Every rank must use a different GPU (NCCL does not support two
 *     ranks on one device): bind first with mpt_comm_bind_device on an MPI comm.
 *   - Both device backends also take small HOST buffers (control messages, such as the DDP
 *     engine's model and batch checks): MPI staging copies them like device buffers; NCCL
 *     stages them through a device scratch buffer and the call then BLOCKS until the result is
 *     in the host buffer (with the comm's deadline and failure checks). Bulk data belongs on
 *     the device.
 *
 * Buffers: a buffer must stay valid and untouched (recvbuf) or
 * unmodified (sendbuf) until the collective has completed on its stream. After a timeout the
 * collective may still be pending inside MPI (MPI cannot cancel a collective) and may still
 * write into recvbuf if the peers arrive late: do not reuse or free the buffers; abort. */
#ifndef MPITRAIN_COMM_H
#define MPITRAIN_COMM_H

#include <stdint.h>

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpt_comm mpt_comm;

/* Reductions of all-reduce. AVG is SUM followed by a division by the world size on every rank
 * (float32 only), the convention of Horovod's Average and torch.distributed ReduceOp.AVG. */
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

typedef enum {
  MPT_COMM_BACKEND_MPI = 0,  /* collectives over MPI: host memory or staged CUDA memory */
  MPT_COMM_BACKEND_NCCL = 1, /* NCCL on one CUDA device per rank (MPT_ENOTSUP if not built) */
} mpt_comm_backend;

/* "mpi", "nccl"; "unknown" otherwise. */
MPT_API const char *mpt_comm_backend_name(mpt_comm_backend backend);

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
  /* Progress mode (see "Progress" above): 1 (default) blocking MPI calls on the worker, the
   * deadline kept by the waiter, and a timeout means the job must abort; 0 non-blocking calls
   * polled by the worker with MPI_Test, the deadline kept by the worker. If any rank asks for
   * polling, every rank polls (agreed at init: MPI does not match blocking collectives with
   * non-blocking ones). */
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
} mpt_comm_config;

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
 * MPT_ETIMEOUT (not every rank reached the bootstrap in time); MPT_ENOMEM.
 * On error *comm is NULL and MPI stays initialised (call mpt_comm_finalize or mpt_comm_abort).
 * Thread rules: call from one thread; not concurrently with other MPI use. */
MPT_API mpt_status mpt_comm_init(mpt_comm **comm, const mpt_comm_config *config);

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

MPT_API int mpt_comm_rank(const mpt_comm *comm);
MPT_API int mpt_comm_world_size(const mpt_comm *comm);
/* Rank among the processes of this host (from MPI_COMM_TYPE_SHARED) and their number. */
MPT_API int mpt_comm_local_rank(const mpt_comm *comm);
MPT_API int mpt_comm_local_size(const mpt_comm *comm);
/* This host's name (gethostname). */
MPT_API const char *mpt_comm_hostname(const mpt_comm *comm);
MPT_API mpt_launcher mpt_comm_launcher(const mpt_comm *comm);
MPT_API mpt_comm_backend mpt_comm_backend_kind(const mpt_comm *comm);
/* The agreed settings (after the env variable and the agreement across ranks). */
MPT_API int mpt_comm_checked(const mpt_comm *comm);
/* 1 in blocking mode, 0 in polling mode (config.blocking as agreed). */
MPT_API int mpt_comm_blocking(const mpt_comm *comm);
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
 * max(1 s, timeout_ms / 10) more. Use it instead of mpt_event_synchronize(event, -1) on comm
 * work. Errors: MPT_EINVAL (NULL comm or event), MPT_ETIMEOUT, the stream's error.
 * Thread rules: any thread; several may wait at once. */
MPT_API mpt_status mpt_comm_wait_event(mpt_comm *comm, mpt_event *event);

/* ---- collectives (asynchronous) ----------------------------------------------------------
 * Common rules: stream NULL = mpt_comm_stream(comm). count is in elements (>= 0); count 0
 * returns MPT_OK at once without a sequence number (in checked mode it still takes part in the
 * signature check, so a rank with 0 against a rank with 8 is caught). dtype: MPT_F32, MPT_I32,
 * MPT_U8. Returns after enqueueing; errors of the collective itself arrive on the stream:
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
 * training step (they block). */
MPT_API mpt_status mpt_comm_allreduce_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                           int64_t count, mpt_dtype dtype, mpt_reduce_op op);
MPT_API mpt_status mpt_comm_broadcast_sync(mpt_comm *comm, void *buf, int64_t count,
                                           mpt_dtype dtype, int root);
MPT_API mpt_status mpt_comm_allgather_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                           int64_t count, mpt_dtype dtype);
MPT_API mpt_status mpt_comm_barrier_sync(mpt_comm *comm);

/* ---- device binding (src/comm/devmap.c; FAULTS.md F11, F12) -------------------------------
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

/* One rank's claim on a device, as gathered across ranks (a plain, fixed-size record). */
enum {
  MPT_DEVICE_UID_NBYTES = 16, /* a CUDA device UUID; a PCI bus id when the UUID is unknown */
  MPT_DEVICE_LIST_MAX = 16,   /* visible devices whose identity a claim carries */
};
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
 * or n < 0. */
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
 * all-gather (MPT_ECOMM, MPT_ETIMEOUT); MPT_EINVAL for a NULL comm or a comm on a device. */
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
 * MPT_EINVAL for NULL arguments. On error *device is cpu:0. Call before creating the NCCL comm
 * (config.device = *device). */
MPT_API mpt_status mpt_comm_bind_device(mpt_comm *comm, mpt_device_type type, int visible_count,
                                        mpt_device *device);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_COMM_H */
