/* Internals of the comm layer: the comm struct, the comm backend table, and the MPI error helper.
 * Private to src/comm (it includes mpi.h; public headers must not).
 *
 * A comm backend is a table of functions (DESIGN.md): each slot enqueues one collective on a
 * stream and returns; the public wrappers in comm.c have already checked the arguments, skipped
 * empty work and assigned the sequence number. Tables: MPI (comm_mpi.c, comm_mpi_call.c), MPI
 * with device buffers staged through pinned host memory (comm_stage.c, CUDA builds), NCCL
 * (comm_nccl.c: rank 0 makes the unique id, MPI_Bcast of its 128 bytes on comm->mpi_comm,
 * non-blocking ncclCommInitRankConfig with a deadline). comm.c's registry picks one from the
 * config's backend and device. */
#ifndef MPT_COMM_IMPL_H
#define MPT_COMM_IMPL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/error.h"
#include "core/keeper.h"
#include "mpitrain/comm.h"

typedef enum {
  MPT__COLL_ALLREDUCE = 1,
  MPT__COLL_BROADCAST = 2,
  MPT__COLL_ALLGATHER = 3,
  MPT__COLL_BARRIER = 4,
  MPT__COLL_REDUCE_SCATTER = 5,   /* count: the whole buffer; recvbuf: this rank's shard */
  MPT__COLL_ALLGATHER_SHARDS = 6, /* in place on recvbuf (= sendbuf), count: the whole buffer */
} mpt__coll_kind;

/* One collective as the wrappers describe it to a backend. `arg` is the reduction (all-reduce,
 * reduce-scatter) or the root (broadcast), 0 otherwise. */
typedef struct mpt__coll {
  mpt__coll_kind kind;
  uint64_t seq;
  const void *sendbuf;
  void *recvbuf; /* broadcast: the buffer */
  int64_t count;
  mpt_dtype dtype;
  int arg;
  /* the issuing thread's tag at enqueue (mpt_comm_set_step / mpt_comm_set_purpose) */
  int64_t step;
  char purpose[MPT_COMM_PURPOSE_MAX];
} mpt__coll;

/* A collective while it runs (from the start of its first MPI call to the end of its last), as
 * the comm's in-flight list holds it (guarded by comm->mutex). `stage` is the prefix of the
 * phrase that names where it is: "" (the data movement), "the agreement after ", or "checked
 * mode: the signature exchange before ". */
typedef struct mpt__inflight {
  mpt__coll coll;
  double start_ms; /* mpt_time_ms() when it started running */
  const char *stage;
  struct mpt__inflight *prev, *next;
} mpt__inflight;

typedef struct mpt__comm_backend {
  const char *name;
  /* Creates the backend's state (comm->backend_state) after the bootstrap filled the comm. */
  mpt_status (*init)(mpt_comm *comm);
  /* Frees it; called after the comm's stream was drained. */
  void (*free)(mpt_comm *comm);
  /* Enqueue one collective on `stream` (never NULL here). */
  mpt_status (*allreduce)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  mpt_status (*broadcast)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  mpt_status (*allgather)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  mpt_status (*barrier)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  /* Optional (NULL: MPT_ENOTSUP from the wrapper): the sharded collectives (comm.h). */
  mpt_status (*reduce_scatter)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  mpt_status (*allgather_shards)(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll);
  /* Non-zero: the comm's own stream and sync event are created on config.device (NCCL: a
   * non-blocking CUDA stream); zero: on the CPU (a worker thread). */
  int stream_on_device;
  /* Optional (NULL: comm_wait.c's blocking-mode deadline): waits for `event` for the waiters of
   * mpt__comm_wait_deadline (the *_sync wrappers, mpt_comm_wait_event, mpt_comm_free), with the
   * same meaning of `c` and grace_ms, checking the backend's asynchronous errors meanwhile. */
  mpt_status (*wait_event)(mpt_comm *comm, mpt_event *event, const mpt__coll *c,
                           double grace_ms);
} mpt__comm_backend;

extern const mpt__comm_backend mpt__comm_mpi_backend;
/* comm_stage.c (CUDA builds): the MPI backend for buffers on a CUDA device. */
extern const mpt__comm_backend mpt__comm_mpi_staged_backend;
/* comm_nccl.c (NCCL builds). */
extern const mpt__comm_backend mpt__comm_nccl_backend;

struct mpt_comm {
  mpt_comm_config config; /* as agreed across ranks (checked/confirm/chunk) */
  int rank, world_size, local_rank, local_size;
  char hostname[256];
  mpt_launcher launcher;
  char launch_notes[768]; /* disagreements of the launcher's variables (logged at debug) */
  MPI_Comm mpi_comm; /* MPI_COMM_WORLD duplicated, MPI_ERRORS_RETURN */
  mpt_stream *stream; /* the comm's own worker stream */
  const mpt__comm_backend *backend;
  void *backend_state;
  void *stage_state; /* comm_stage.c: pinned buffers and the copy stream (device buffers) */
  atomic_uint_fast64_t next_seq;

  pthread_mutex_t mutex; /* guards failure state and the in-flight list */
  atomic_int failed;     /* mpt_status of the collective that broke the comm (0 = fine) */
  char failed_detail[1024];
  mpt__inflight *inflight; /* running collectives, oldest first */
  uint64_t started;         /* collectives that ever entered the in-flight list */
  int abandoned; /* mpt_comm_free gave up on a stuck worker: the struct is leaked, never freed */

  pthread_mutex_t sync_mutex; /* serialises the synchronous wrappers (one event) */
  mpt_event *sync_event;
  int progress_index; /* its column in the progress records (comm_progress.c), -1: none */

  /* flight recorder (flight.c): the tag of the next collectives (issuing thread), the ring */
  int64_t tag_step;
  char tag_purpose[MPT_COMM_PURPOSE_MAX];
  struct mpt__flight_entry *flight; /* [flight_cap] or NULL (off) */
  int64_t flight_cap;
  struct mpt__flight_peer *peers;   /* [world_size]: each rank's pid and host (bootstrap) */
  char debug_dir[4096];             /* where dumps go ("" = none) */
};

/* ---- flight recorder (flight.c) ------------------------------------------------------------ */
typedef enum {
  MPT__FLIGHT_QUEUED = 1,
  MPT__FLIGHT_RUNNING = 2,
  MPT__FLIGHT_DONE = 3,
  MPT__FLIGHT_FAILED = 4,
} mpt__flight_state;
typedef struct mpt__flight_entry mpt__flight_entry;
typedef struct mpt__flight_peer {
  int32_t pid;
  char host[60];
} mpt__flight_peer;
/* Allocates the ring of config.flight_recorder entries (none for 0). Errors: MPT_ENOMEM. */
mpt_status mpt__flight_init(mpt_comm *comm);
/* Frees the ring and the peer table. */
void mpt__flight_free(mpt_comm *comm);
/* Bootstrap: all-gathers every rank's pid and host into comm->peers, by deadline_ms. */
mpt_status mpt__flight_gather_peers(mpt_comm *comm, double deadline_ms);
/* The collective `c` (seq assigned) was enqueued / started / finished with `status`. */
void mpt__flight_enqueue(mpt_comm *comm, const mpt__coll *c);
void mpt__flight_started(const mpt_comm *comm, uint64_t seq);
void mpt__flight_finished(const mpt_comm *comm, uint64_t seq, mpt_status status);

/* Marks the comm unusable with `status` and a copy of the calling thread's last error (first
 * failure wins). Any thread. */
void mpt__comm_set_failed(mpt_comm *comm, mpt_status status);
/* MPT_OK, or re-raises the failure on the calling thread with a detail. */
mpt_status mpt__comm_check_usable(mpt_comm *comm);

/* ---- in-flight collectives and deadlines (comm_wait.c) ----------------------------------- */

/* "all-reduce", "broadcast", "all-gather", "barrier", "reduce-scatter", "all-gather of shards". */
const char *mpt__coll_kind_name(int kind);
/* "all-reduce #17 (count 4096 float32 sum)" into buf; returns buf. */
const char *mpt__coll_describe(const mpt__coll *c, char *buf, size_t nbytes);
/* Records MPT_ETIMEOUT "<stage><collective> did not complete within T s on rank R". */
mpt_status mpt__coll_timeout_error(mpt_comm *comm, const mpt__coll *c, const char *stage);

/* Enters `f` (describing `c`, stage "") into the comm's in-flight list and stamps its start,
 * unless the comm is unusable: then returns its error and `f` is not entered. Atomic with the
 * failure state, so once a timeout has marked the comm failed no collective can start. */
mpt_status mpt__inflight_begin(mpt_comm *comm, mpt__inflight *f, const mpt__coll *c);
void mpt__inflight_stage(mpt_comm *comm, mpt__inflight *f, const char *stage);
/* Takes `f` out of the list. */
void mpt__inflight_end(mpt_comm *comm, mpt__inflight *f);
/* Blocking mode, after an MPI call returned: MPT_OK, or the comm's failure (a waiter declared
 * the collective timed out, or the comm was abandoned) re-raised, meaning "touch nothing more". */
mpt_status mpt__inflight_check(mpt_comm *comm);

/* Waits for `event` (recorded after `c`, which may be NULL) with the blocking mode's deadline:
 * whichever collective of the comm is oldest in flight must finish within timeout_ms +
 * grace_ms of its start, and the comm must not go that long without starting a collective
 * while the event is pending. On expiry: MPT_ETIMEOUT naming the collective (the same words as
 * the worker's own deadline in polling mode), and the comm is marked failed. Otherwise the
 * event's status. Caller's thread. */
mpt_status mpt__comm_wait_deadline(mpt_comm *comm, mpt_event *event, const mpt__coll *c,
                                   double grace_ms);

/* ---- collectives on host buffers staged through a device (host_stage.c) ------------------
 * The steps of one staged collective, filled by a device backend (NCCL) and by tests with a
 * stub. enqueue, check and expire run with the backend's lock held; query and copy_out without
 * it. */
typedef struct mpt__host_stage_ops {
  void *ctx;
  /* Copies the send buffer in, enqueues the collective and the copy out into a pinned bounce
   * buffer, records an event after them. Never waits for the device. */
  mpt_status (*enqueue)(void *ctx);
  /* 1: the event completed; 0: not yet; -1: failed (*err set, detail recorded). Never blocks. */
  int (*query)(void *ctx, mpt_status *err);
  /* The backend's failure checks (asynchronous errors, a collective past its deadline). */
  mpt_status (*check)(void *ctx);
  /* The deadline passed: records MPT_ETIMEOUT naming the collective, fails the backend (abort)
   * and returns the status. */
  mpt_status (*expire)(void *ctx);
  /* After completion: the bounce buffer into the caller's host buffer. */
  void (*copy_out)(void *ctx);
} mpt__host_stage_ops;

/* enqueue under `lock`; then polls query WITHOUT the lock (taking it only around check) until
 * the event completes, a check fails or mpt_time_ms() passes deadline_ms (expire); then
 * copy_out. So a peer that never arrives costs the deadline, not a hang, and the watchdog and
 * other waiters are never locked out by this wait. Returns MPT_OK or the first failure. */
mpt_status mpt__host_stage_run(pthread_mutex_t *lock, const mpt__host_stage_ops *ops,
                               double deadline_ms);

/* The keeper (core/keeper.h) of a collective's host function on a CPU worker stream; keeper_arg
 * is the comm. Whichever collective of the comm is oldest in flight must finish within
 * timeout_ms (+ the polling mode's grace, see mpt_comm_wait_event) of its start: until then
 * *left_ms is the time left, after it MPT_ETIMEOUT naming the collective (the words of
 * mpt__comm_wait_deadline) and the comm is marked failed; a comm that failed already gives its
 * failure. So every wait on the stream or its events is bounded, deadline or not (docs/comm.md). */
mpt_status mpt__comm_keeper(void *comm, double *left_ms);

/* ---- progress records (comm_progress.c): who held up a collective that timed out ---------- */

/* Bootstrap, after the node communicator exists: the first call makes the process's shared-
 * memory window over `node` (collective over the ranks of this host); every call gives `c` its
 * column (c->progress_index, -1 when there is none). Never fails: without a window the reports
 * say why. */
void mpt__progress_init(mpt_comm *c, MPI_Comm node);
/* Publishes that this rank started / completed collective `seq` of `c`. Any thread. */
void mpt__progress_started(const mpt_comm *c, uint64_t seq);
void mpt__progress_completed(const mpt_comm *c, uint64_t seq);
/* Appends to buf "; on host H (shared-memory progress records): holding it up: rank 1 (never
 * started it; process 123 is stopped (SIGSTOP or job control); last collective started #41,
 * completed #41); waiting in it: ranks 0, 2; ..." for collective `seq` of `c`. Any thread. */
void mpt__progress_describe(const mpt_comm *c, uint64_t seq, char *buf, size_t nbytes);
/* Frees the window (collective over the host's ranks, like MPI_Finalize): mpt_comm_finalize. */
void mpt__progress_finalize(void);

/* Records "<what>: <MPI error string> (on rank R)" as MPT_ECOMM. */
mpt_status mpt__mpi_error(const char *file, int line, int mpi_rc, int rank, const char *fmt, ...)
    MPT_PRINTF(5, 6);
#define MPT_MPI_FAIL(rc, rank, ...) mpt__mpi_error(__FILE__, __LINE__, (rc), (rank), __VA_ARGS__)

/* Runs an MPI call; on failure records MPT_ECOMM naming the call and jumps to label (uses the
 * local `st`). */
#define MPT_MPI_CHECK(call, rank, label)                        \
  do {                                                          \
    int mpt__mrc = (call);                                      \
    if (mpt__mrc != MPI_SUCCESS) {                              \
      st = MPT_MPI_FAIL(mpt__mrc, (rank), "%s", #call);         \
      goto label;                                               \
    }                                                           \
  } while (0)

/* Polls `req` with MPI_Test until it completes or mpt_time_ms() passes deadline_ms. Returns
 * MPI_SUCCESS and *done = 1 on completion, the MPI error code on failure, or MPI_SUCCESS with
 * *done = 0 at the deadline (the request is then still pending). Backs off from spinning to
 * short sleeps. */
int mpt__mpi_wait_until(MPI_Request *req, double deadline_ms, int *done);

/* MPI_FLOAT / MPI_INT32_T / MPI_UINT8_T / MPI_UINT16_T (bfloat16); MPI_DATATYPE_NULL for
 * anything else. */
MPI_Datatype mpt__mpi_dtype(mpt_dtype dtype);

/* Bootstrap (comm_boot.c): initialises MPI if needed and fills rank, sizes, hostname, launcher,
 * mpi_comm, and the agreed config fields. On error nothing is left allocated in comm. */
mpt_status mpt__comm_bootstrap(mpt_comm *comm, const mpt_comm_config *config);
/* 1 when mpt__comm_bootstrap called MPI_Init_thread (process-wide). */
int mpt__comm_mpi_owned(void);

/* init_watchdog.c: a thread that, unless mpt__init_watchdog_stop comes first, prints what the
 * bootstrap waits for (mpt_comm_bootstrap_stage) after timeout_s and ends the process with
 * status 1: the deadline of MPI_Init_thread, which has none. Errors: MPT_ENOMEM. */
typedef struct mpt__init_watchdog mpt__init_watchdog;
mpt_status mpt__init_watchdog_start(double timeout_s, mpt__init_watchdog **w);
/* Stops and joins it; NULL is a no-op. */
void mpt__init_watchdog_stop(mpt__init_watchdog *w);

#endif
