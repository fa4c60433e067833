/* Internals of the comm layer: the comm struct, the comm backend table, and the MPI error helper.
 * Private to src/comm (it includes mpi.h; public headers must not).
 *
 * A comm backend is a table of functions (DESIGN.md): each slot enqueues one collective on a
 * stream and returns; the public wrappers in comm.c have already checked the arguments, skipped
 * empty work and assigned the sequence number. MPI fills the table now (comm_mpi.c); the NCCL
 * slot in comm.c's registry is reserved for src/comm/comm_nccl.c (rank 0 makes the unique id,
 * MPI_Bcast of its 128 bytes on comm->mpi_comm, ncclCommInitRank with a deadline). */
#ifndef MPT_COMM_IMPL_H
#define MPT_COMM_IMPL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/error.h"
#include "mpitrain/comm.h"

typedef enum {
  MPT__COLL_ALLREDUCE = 1,
  MPT__COLL_BROADCAST = 2,
  MPT__COLL_ALLGATHER = 3,
  MPT__COLL_BARRIER = 4,
} mpt__coll_kind;

/* One collective as the wrappers describe it to a backend. `arg` is the reduction (all-reduce)
 * or the root (broadcast), 0 otherwise. */
typedef struct mpt__coll {
  mpt__coll_kind kind;
  uint64_t seq;
  const void *sendbuf;
  void *recvbuf; /* broadcast: the buffer */
  int64_t count;
  mpt_dtype dtype;
  int arg;
} mpt__coll;

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
} mpt__comm_backend;

extern const mpt__comm_backend mpt__comm_mpi_backend;

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
  atomic_uint_fast64_t next_seq;

  pthread_mutex_t mutex; /* guards failure state */
  atomic_int failed;     /* mpt_status of the collective that broke the comm (0 = fine) */
  char failed_detail[1024];

  pthread_mutex_t sync_mutex; /* serialises the synchronous wrappers (one event) */
  mpt_event *sync_event;
};

/* Marks the comm unusable with `status` and a copy of the calling thread's last error (first
 * failure wins). Any thread. */
void mpt__comm_set_failed(mpt_comm *comm, mpt_status status);
/* MPT_OK, or re-raises the failure on the calling thread with a detail. */
mpt_status mpt__comm_check_usable(mpt_comm *comm);

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

/* MPI_FLOAT / MPI_INT32_T / MPI_UINT8_T; MPI_DATATYPE_NULL for anything else. */
MPI_Datatype mpt__mpi_dtype(mpt_dtype dtype);

/* Bootstrap (comm_boot.c): initialises MPI if needed and fills rank, sizes, hostname, launcher,
 * mpi_comm, and the agreed config fields. On error nothing is left allocated in comm. */
mpt_status mpt__comm_bootstrap(mpt_comm *comm, const mpt_comm_config *config);
/* 1 when mpt__comm_bootstrap called MPI_Init_thread (process-wide). */
int mpt__comm_mpi_owned(void);

#endif
