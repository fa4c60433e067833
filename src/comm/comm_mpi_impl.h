/* Internals of the MPI comm backend shared by its two files: comm_mpi.c (the backend table,
 * the op records, checked mode's signatures, the agreement, and the sequence of one collective
 * on the worker) and comm_mpi_call.c (one MPI call in either progress mode, the data movement
 * of each kind of collective, and the MPI helpers shared with the bootstrap). Includes mpi.h
 * (through comm_impl.h): private to src/comm. */
#ifndef MPT_COMM_MPI_IMPL_H
#define MPT_COMM_MPI_IMPL_H

#include "comm/comm_impl.h"

/* kind, count, dtype, arg, seq; then the caller's tag: global step and purpose (its bytes, in
 * SIG_PURPOSE words). The agreement hashes the first SIG_CORE only (the tag is checked mode's). */
enum { SIG_CORE = 5, SIG_PURPOSE = MPT_COMM_PURPOSE_MAX / 8, SIG_LEN = SIG_CORE + 1 + SIG_PURPOSE };
_Static_assert(MPT_COMM_PURPOSE_MAX % 8 == 0, "the purpose travels as int64 words");

typedef struct op_rec {
  mpt_comm *comm;
  mpt__coll coll;
  mpt__inflight inflight;  /* its entry in the comm's in-flight list while it runs */
  int64_t *sigs;           /* [world_size, SIG_LEN]: checked mode, allocated on first use */
  int *counts, *displs;    /* [world_size]: the shards (sharded collectives), on first use */
  int64_t empty[1];        /* the receive buffer of an empty shard (MPI wants a pointer) */
  int64_t sig_mine[SIG_LEN];
  int abandoned;           /* timed out: MPI may still write into it, so it is never freed */
  int64_t confirm_in[3];   /* agreement: {fail code, hash, -hash} */
  int64_t confirm_out[3];
  struct op_rec *next_free;
  struct op_rec *next_all;
} op_rec;

typedef struct mpi_state {
  pthread_mutex_t mutex;
  op_rec *free_list;
  op_rec *all;
  MPI_Op fmin, fmax; /* float32 MIN / MAX that propagate NaN (see float_min) */
} mpi_state;

/* ---- one MPI call in either progress mode ------------------------------------------------- */

typedef enum {
  CALL_ALLREDUCE,
  CALL_BCAST,
  CALL_ALLGATHER,
  CALL_BARRIER,
  CALL_REDUCE_SCATTER, /* counts: per-rank receive counts */
  CALL_ALLGATHERV,     /* in place; counts, displs */
  CALL_REDUCE,         /* to root; recv ignored off the root */
  CALL_ALLTOALLV,      /* counts, displs: sent; rcounts, rdispls: received */
} call_kind;

/* The arguments of one MPI collective call (MPI_Allreduce or MPI_Iallreduce, etc.). */
typedef struct mpi_call {
  call_kind kind;
  const void *send; /* MPI_IN_PLACE allowed */
  void *recv;       /* broadcast: the buffer */
  int count;        /* send count (all-reduce, broadcast, all-gather) */
  MPI_Datatype type;
  int recv_count; /* all-gather */
  MPI_Datatype recv_type;
  MPI_Op op;
  int root;
  const int *counts, *displs; /* reduce-scatter, all-gatherv; all-to-all: what is sent */
  const int *rcounts, *rdispls; /* all-to-all: what is received (recv_type) */
} mpi_call;

/* Runs one call for collective `r` at `stage` (a phrase prefix, see mpt__inflight). Blocking
 * mode: the blocking call, then the comm check (a waiter may have declared a timeout). Polling
 * mode: the non-blocking call, polled until done or deadline_ms. Returns OK, ECOMM (naming the
 * call, the stage, the collective and the rank), ETIMEOUT, or the comm's failure. */
mpt_status mpt__mpi_run_call(mpt_comm *comm, op_rec *r, const mpi_call *k, const char *stage,
                             double deadline_ms);
/* Step 3 of comm_mpi.c's sequence: the data movement of collective `r`, chunked. */
mpt_status mpt__mpi_run_data(mpt_comm *comm, op_rec *r, double deadline_ms);

#endif
