/* The MPI comm backend's calls (comm_mpi_impl.h): one MPI collective call in either progress
 * mode (blocking, or non-blocking polled until its deadline: comm_mpi.c says which does what),
 * and the data movement of each kind of collective over it: chunked all-reduce, broadcast and
 * all-gather; reduce-scatter and all-gather of shards; bfloat16 reductions rounded once. Also
 * the MPI helpers shared with the bootstrap (error text, polling, dtypes).
 *
 * Runs on: the comm's stream thread (op_run of comm_mpi.c), except the helpers, which the
 * bootstrap calls on the caller's thread. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_mpi_impl.h"

/* ---- helpers shared with the bootstrap --------------------------------------------------- */

mpt_status mpt__mpi_error(const char *file, int line, int mpi_rc, int rank, const char *fmt,
                          ...) {
  char what[512], text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error code %d", mpi_rc);
  if (rank >= 0)
    return mpt__error(MPT_ECOMM, file, line, "%s failed on rank %d: %s", what, rank, text);
  return mpt__error(MPT_ECOMM, file, line, "%s failed: %s", what, text);
}

int mpt__mpi_wait_until(MPI_Request *req, double deadline_ms, int *done) {
  int spins = 0;
  long sleep_ns = 2000;
  *done = 0;
  for (;;) {
    int flag = 0;
    int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (flag) {
      *done = 1;
      return MPI_SUCCESS;
    }
    if (mpt_time_ms() >= deadline_ms) return MPI_SUCCESS;
    /* Spin briefly (small collectives finish in microseconds), then sleep in short steps: with
     * libnbc the schedule only advances inside MPI_Test, so the steps stay short. */
    if (spins < 200) {
      spins++;
      sched_yield();
    } else {
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 100000) sleep_ns *= 2;
    }
  }
}

MPI_Datatype mpt__mpi_dtype(mpt_dtype dtype) {
  switch (dtype) {
    case MPT_F32:
      return MPI_FLOAT;
    case MPT_I32:
      return MPI_INT32_T;
    case MPT_U8:
      return MPI_UINT8_T;
    case MPT_BF16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

static const char *call_name(call_kind kind, int blocking) {
  switch (kind) {
    case CALL_ALLREDUCE:
      return blocking ? "MPI_Allreduce" : "MPI_Iallreduce";
    case CALL_BCAST:
      return blocking ? "MPI_Bcast" : "MPI_Ibcast";
    case CALL_ALLGATHER:
      return blocking ? "MPI_Allgather" : "MPI_Iallgather";
    case CALL_BARRIER:
      return blocking ? "MPI_Barrier" : "MPI_Ibarrier";
    case CALL_REDUCE_SCATTER:
      return blocking ? "MPI_Reduce_scatter" : "MPI_Ireduce_scatter";
    case CALL_ALLGATHERV:
      return blocking ? "MPI_Allgatherv" : "MPI_Iallgatherv";
    case CALL_REDUCE:
      return blocking ? "MPI_Reduce" : "MPI_Ireduce";
    case CALL_ALLTOALLV:
      return blocking ? "MPI_Alltoallv" : "MPI_Ialltoallv";
  }
  return "MPI call";
}

mpt_status mpt__mpi_run_call(mpt_comm *comm, op_rec *r, const mpi_call *k, const char *stage,
                             double deadline_ms) {
  MPI_Comm mc = comm->mpi_comm;
  const int blocking = comm->config.blocking;
  char what[160];
  int rc;
  if (blocking) {
    if (stage != r->inflight.stage) mpt__inflight_stage(comm, &r->inflight, stage);
    switch (k->kind) {
      case CALL_ALLREDUCE:
        rc = MPI_Allreduce(k->send, k->recv, k->count, k->type, k->op, mc);
        break;
      case CALL_BCAST:
        rc = MPI_Bcast(k->recv, k->count, k->type, k->root, mc);
        break;
      case CALL_ALLGATHER:
        rc = MPI_Allgather(k->send, k->count, k->type, k->recv, k->recv_count, k->recv_type, mc);
        break;
      case CALL_REDUCE_SCATTER:
        rc = MPI_Reduce_scatter(k->send, k->recv, k->counts, k->type, k->op, mc);
        break;
      case CALL_ALLGATHERV:
        rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, k->recv, k->counts, k->displs,
                            k->type, mc);
        break;
      case CALL_REDUCE:
        rc = MPI_Reduce(k->send, k->recv, k->count, k->type, k->op, k->root, mc);
        break;
      case CALL_ALLTOALLV:
        rc = MPI_Alltoallv(k->send, k->counts, k->displs, k->type, k->recv, k->rcounts,
                           k->rdispls, k->recv_type, mc);
        break;
      default:
        rc = MPI_Barrier(mc);
    }
    MPT_RETURN_IF(mpt__inflight_check(comm));
    if (rc != MPI_SUCCESS)
      return MPT_MPI_FAIL(rc, comm->rank, "%s in %s%s", call_name(k->kind, 1), stage,
                          mpt__coll_describe(&r->coll, what, sizeof what));
    return MPT_OK;
  }

  MPI_Request req;
  switch (k->kind) {
    case CALL_ALLREDUCE:
      rc = MPI_Iallreduce(k->send, k->recv, k->count, k->type, k->op, mc, &req);
      break;
    case CALL_BCAST:
      rc = MPI_Ibcast(k->recv, k->count, k->type, k->root, mc, &req);
      break;
    case CALL_ALLGATHER:
      rc = MPI_Iallgather(k->send, k->count, k->type, k->recv, k->recv_count, k->recv_type, mc,
                          &req);
      break;
    case CALL_REDUCE_SCATTER:
      rc = MPI_Ireduce_scatter(k->send, k->recv, k->counts, k->type, k->op, mc, &req);
      break;
    case CALL_ALLGATHERV:
      rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, k->recv, k->counts, k->displs,
                           k->type, mc, &req);
      break;
    case CALL_REDUCE:
      rc = MPI_Ireduce(k->send, k->recv, k->count, k->type, k->op, k->root, mc, &req);
      break;
    case CALL_ALLTOALLV:
      rc = MPI_Ialltoallv(k->send, k->counts, k->displs, k->type, k->recv, k->rcounts,
                          k->rdispls, k->recv_type, mc, &req);
      break;
    default:
      rc = MPI_Ibarrier(mc, &req);
  }
  int done = 0;
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS)
    return MPT_MPI_FAIL(rc, comm->rank, "%s in %s%s", call_name(k->kind, 0), stage,
                        mpt__coll_describe(&r->coll, what, sizeof what));
  if (!done) return mpt__coll_timeout_error(comm, &r->coll, stage);
  return MPT_OK;
}

static const char STAGE_DATA[] = "";

/* ---- the data movement ------------------------------------------------------------------ */

/* The MPI reduction of collective c. */
static MPI_Op reduce_op(const mpt_comm *comm, const mpt__coll *c) {
  const mpi_state *ms = comm->backend_state;
  const int f32 = c->dtype == MPT_F32;
  return c->arg == MPT_REDUCE_MIN   ? (f32 ? ms->fmin : MPI_MIN)
         : c->arg == MPT_REDUCE_MAX ? (f32 ? ms->fmax : MPI_MAX)
                                    : MPI_SUM;
}

/* Reduce-scatter and all-gather of shards. One MPI_Reduce_scatter / MPI_Allgatherv with the
 * per-rank shard counts when the whole buffer fits max_chunk_count (so counts and displacements
 * fit an int) and, for the reduce-scatter, RS_PIECE; otherwise, chunk by chunk of each shard, an
 * MPI_Reduce / MPI_Bcast rooted at the shard's owner (every rank walks the same (chunk, rank)
 * order). Why RS_PIECE: Open MPI 4.1's MPI_Reduce_scatter (coll/tuned's ring at these sizes)
 * allocates temporaries of about twice the message per call, which a series of 25 MiB gradient
 * buckets turned into 193 MiB more peak memory per rank for gpt2 at 2 ranks (docs/zero.md);
 * pieces of 1 Mi elements bound them, for the same bytes on the wire ((W-1)/W of the buffer per
 * rank), and were faster here (mpt_allreduce_bench --coll rsag at 64 MiB, 2 ranks, in place:
 * 0.91 of raw MPI_Allreduce's bus bandwidth against 0.67 with one MPI_Reduce_scatter). */
enum { RS_PIECE = 1 << 20 };

/* The float32 or int32 reduce-scatter (gather 0) of count elements of `send` into this rank's
 * shard at `recv`, or the in-place all-gather of shards (gather 1) of `recv`. */
static mpt_status run_sharded(mpt_comm *comm, op_rec *r, int gather, const void *sendbuf,
                              void *recvbuf, int64_t count, mpt_dtype dtype, MPI_Op op,
                              double deadline_ms) {
  const int world = comm->world_size, me = comm->rank;
  const MPI_Datatype dt = mpt__mpi_dtype(dtype);
  const size_t es = mpt_dtype_size(dtype);
  const int64_t most = comm->config.max_chunk_count;
  const int64_t chunk = !gather && most > RS_PIECE ? RS_PIECE : most;
  int64_t my_off, my_n, s_off, s_n;
  mpt_comm_shard(count, world, me, &my_off, &my_n);
  char *recv = recvbuf;
  const char *send = sendbuf;
  const int in_place = !gather && recv == (const char *)send + (size_t)my_off * es;

  if (count <= chunk) {
    if (!r->counts && !(r->counts = malloc(sizeof(int) * 2 * (size_t)world)))
      return MPT_FAIL(MPT_ENOMEM, "cannot allocate the shard counts");
    r->displs = r->counts + world;
    for (int q = 0; q < world; q++) {
      mpt_comm_shard(count, world, q, &s_off, &s_n);
      r->counts[q] = (int)s_n;
      r->displs[q] = (int)s_off;
    }
    mpi_call k = {gather ? CALL_ALLGATHERV : CALL_REDUCE_SCATTER, NULL, NULL, 0, dt, 0,
                  MPI_DATATYPE_NULL, op, 0, r->counts, r->displs, NULL, NULL};
    /* In place, MPI takes the input from recvbuf and leaves this rank's block at its start:
     * hand it the whole buffer, then move the block to the shard. */
    char *base = in_place ? recv - (size_t)my_off * es : recv;
    k.send = in_place ? MPI_IN_PLACE : send;
    k.recv = base;
    if (!gather && !in_place && my_n == 0) k.recv = r->empty; /* nothing lands; not NULL */
    MPT_RETURN_IF(mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms));
    if (in_place && my_off > 0 && my_n > 0) memmove(recv, base, (size_t)my_n * es);
    return MPT_OK;
  }

  int64_t longest;
  mpt_comm_shard(count, world, 0, &s_off, &longest);
  for (int64_t off = 0; off < longest; off += chunk) {
    for (int q = 0; q < world; q++) {
      mpt_comm_shard(count, world, q, &s_off, &s_n);
      if (s_n <= off) continue;
      int n = (int)(s_n - off < chunk ? s_n - off : chunk);
      char *at = (char *)(gather ? recv : (char *)send) + (size_t)(s_off + off) * es;
      mpi_call k;
      if (gather) {
        k = (mpi_call){CALL_BCAST, NULL, at, n, dt, 0, MPI_DATATYPE_NULL, MPI_OP_NULL, q,
                       NULL, NULL, NULL, NULL};
      } else {
        const void *src = at;
        void *dst = NULL;
        if (q == me) {
          dst = recv + (size_t)off * es;
          if (in_place) src = MPI_IN_PLACE;
        }
        k = (mpi_call){CALL_REDUCE, src, dst, n, dt, 0, MPI_DATATYPE_NULL, op, q,
                       NULL, NULL, NULL, NULL};
      }
      MPT_RETURN_IF(mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms));
    }
  }
  return MPT_OK;
}

/* ---- bfloat16 reduce-scatter, rounded once (comm.h "bfloat16") -------------------------------
 * The bfloat16 sums are not left to an MPI_Op, which would round every partial sum to bfloat16
 * at each step of MPI's tree or ring (W - 1 roundings, an error growing with W: at 8 ranks
 * holding 1, 1/512, ..., 1/512 Open MPI 4.1 read 1.0078125 where the sum is 1.015625). Instead
 * every rank sends each owner its piece of the buffer in bfloat16 (MPI_Alltoallv: the bytes on
 * the wire of a ring reduce-scatter, (W-1)/W of the buffer per rank), the owner widens the W
 * pieces, adds them in float32 in rank order (0, 1, ..., W-1: the same bits whatever MPI's
 * algorithms), divides by W for AVG, and rounds once to bfloat16. The all-reduce is this
 * reduce-scatter followed by the all-gather of the shards, so every bf16 reduction of the comm
 * (all-reduce, reduce-scatter, sum or average) yields the same bits for the same element.
 * Rounds of at most BF16_PIECE elements per rank (W pieces of BF16_PIECE / W) bound the
 * temporaries: a send and a receive buffer of BF16_PIECE 2-byte elements (1 MiB each) and two
 * float32 rows of BF16_PIECE / W elements, allocated per call. */
enum { BF16_PIECE = RS_PIECE / 2 };

static mpt_status run_bf16_reduce(mpt_comm *comm, op_rec *r, const void *sendbuf,
                                  void *recvbuf, int64_t count, int avg, double deadline_ms) {
  const int world = comm->world_size, me = comm->rank;
  const uint16_t *send = sendbuf;
  uint16_t *out = recvbuf;
  int64_t my_off, my_n, longest, s_off, s_n;
  mpt_comm_shard(count, world, me, &my_off, &my_n);
  mpt_comm_shard(count, world, 0, &s_off, &longest);
  int64_t most = comm->config.max_chunk_count < BF16_PIECE ? comm->config.max_chunk_count
                                                           : BF16_PIECE;
  int64_t piece = most / world > 0 ? most / world : 1; /* elements per rank and round */
  if (piece > longest) piece = longest > 0 ? longest : 1;
  const size_t slots = (size_t)world * (size_t)piece;
  uint16_t *pack = malloc(sizeof(uint16_t) * 2 * slots);
  int *ints = malloc(sizeof(int) * 4 * (size_t)world);
  float *acc = malloc(sizeof(float) * 2 * (size_t)piece);
  mpt_status st = MPT_OK;
  if (!pack || !ints || !acc) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the bfloat16 reduce-scatter's buffers (%zu "
                  "elements)", 2 * slots);
    goto done;
  }
  uint16_t *got = pack + slots;
  int *scount = ints, *sdispl = ints + world, *rcount = ints + 2 * world,
      *rdispl = ints + 3 * world;
  const float w = (float)world;
  for (int64_t off = 0; off < longest && st == MPT_OK; off += piece) {
    const int64_t m = my_n - off < piece ? (my_n - off > 0 ? my_n - off : 0) : piece;
    for (int q = 0; q < world; q++) {
      mpt_comm_shard(count, world, q, &s_off, &s_n);
      const int64_t k = s_n - off < piece ? (s_n - off > 0 ? s_n - off : 0) : piece;
      if (k > 0) memcpy(pack + (size_t)q * piece, send + s_off + off, sizeof(uint16_t) * k);
      scount[q] = (int)k;
      sdispl[q] = (int)((size_t)q * piece);
      rcount[q] = (int)m;
      rdispl[q] = (int)((size_t)q * piece);
    }
    mpi_call k = {CALL_ALLTOALLV, pack, got, 0, MPI_UINT16_T, 0, MPI_UINT16_T, MPI_OP_NULL, 0,
                  scount, sdispl, rcount, rdispl};
    st = mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms);
    if (st != MPT_OK || m == 0) continue;
    /* The same float32 operations in the same order as an element-by-element loop, through
     * core's array conversions (vectorized: the scalar loop of calls made the bfloat16
     * all-reduce 6x slower than raw MPI's at 1 MiB). */
    float *tmp = acc + piece;
    mpt_bf16_widen_array(got, acc, m);
    for (int q = 1; q < world; q++) {
      mpt_bf16_widen_array(got + (size_t)q * piece, tmp, m);
      for (int64_t i = 0; i < m; i++) acc[i] += tmp[i];
    }
    if (avg)
      for (int64_t i = 0; i < m; i++) acc[i] /= w;
    mpt_bf16_round_array(acc, out + off, m);
  }
done:
  free(pack);
  free(ints);
  free(acc);
  return st;
}

mpt_status mpt__mpi_run_data(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  MPI_Datatype dt = mpt__mpi_dtype(c->dtype);
  size_t es = mpt_dtype_size(c->dtype);
  int64_t chunk = comm->config.max_chunk_count;
  char what[160];
  int rc;

  if (c->kind == MPT__COLL_BARRIER) {
    mpi_call k = {CALL_BARRIER, NULL, NULL, 0, MPI_DATATYPE_NULL, 0, MPI_DATATYPE_NULL,
                  MPI_OP_NULL, 0, NULL, NULL, NULL, NULL};
    return mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms);
  }

  if (c->kind == MPT__COLL_ALLGATHER) {
    char *recv = c->recvbuf;
    int in_place = c->sendbuf == recv + (size_t)comm->rank * (size_t)c->count * es;
    if (c->count <= chunk) {
      mpi_call k = {CALL_ALLGATHER, in_place ? MPI_IN_PLACE : c->sendbuf, recv, (int)c->count,
                    dt, (int)c->count, dt, MPI_OP_NULL, 0, NULL, NULL, NULL, NULL};
      return mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms);
    }
    /* Chunk j of every rank's block: a receive type of n elements whose extent is one whole
     * block, so rank r's piece lands at recv + (r * count + off) elements. */
    for (int64_t off = 0; off < c->count; off += chunk) {
      int n = (int)(c->count - off < chunk ? c->count - off : chunk);
      MPI_Datatype piece, block;
      if ((rc = MPI_Type_contiguous(n, dt, &piece)) != MPI_SUCCESS)
        return MPT_MPI_FAIL(rc, comm->rank, "MPI_Type_contiguous in %s",
                            mpt__coll_describe(c, what, sizeof what));
      rc = MPI_Type_create_resized(piece, 0, (MPI_Aint)((size_t)c->count * es), &block);
      MPI_Type_free(&piece);
      if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&block)) != MPI_SUCCESS) MPI_Type_free(&block);
      if (rc != MPI_SUCCESS)
        return MPT_MPI_FAIL(rc, comm->rank, "MPI_Type_create_resized in %s",
                            mpt__coll_describe(c, what, sizeof what));
      const char *send = (const char *)c->sendbuf + (size_t)off * es;
      mpi_call k = {CALL_ALLGATHER, in_place ? MPI_IN_PLACE : send, recv + (size_t)off * es, n,
                    dt, 1, block, MPI_OP_NULL, 0, NULL, NULL, NULL, NULL};
      mpt_status st = mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms);
      /* A non-blocking call keeps the type alive while it needs it; a stuck blocking call
       * never returns here, and one that returned is done with it. */
      MPI_Type_free(&block);
      MPT_RETURN_IF(st);
    }
    return MPT_OK;
  }

  if (c->kind == MPT__COLL_ALLGATHER_SHARDS)
    return run_sharded(comm, r, 1, NULL, c->recvbuf, c->count, c->dtype, MPI_OP_NULL,
                       deadline_ms);
  if (c->dtype == MPT_BF16) { /* rounded once (run_bf16_reduce) */
    int64_t off, n;
    mpt_comm_shard(c->count, comm->world_size, comm->rank, &off, &n);
    const int avg = c->arg == MPT_REDUCE_AVG;
    if (c->kind == MPT__COLL_REDUCE_SCATTER)
      return run_bf16_reduce(comm, r, c->sendbuf, c->recvbuf, c->count, avg, deadline_ms);
    uint16_t *all = c->recvbuf; /* all-reduce: this rank's shard in place, then the gather */
    MPT_RETURN_IF(run_bf16_reduce(comm, r, c->sendbuf, all + off, c->count, avg, deadline_ms));
    return run_sharded(comm, r, 1, NULL, all, c->count, MPT_BF16, MPI_OP_NULL, deadline_ms);
  }
  const MPI_Op op = reduce_op(comm, c);
  if (c->kind == MPT__COLL_REDUCE_SCATTER)
    return run_sharded(comm, r, 0, c->sendbuf, c->recvbuf, c->count, c->dtype, op, deadline_ms);

  for (int64_t off = 0; off < c->count; off += chunk) {
    int n = (int)(c->count - off < chunk ? c->count - off : chunk);
    char *recv = (char *)c->recvbuf + (size_t)off * es;
    mpi_call k;
    if (c->kind == MPT__COLL_BROADCAST) {
      k = (mpi_call){CALL_BCAST, NULL, recv, n, dt, 0, MPI_DATATYPE_NULL, MPI_OP_NULL,
                     c->arg, NULL, NULL, NULL, NULL};
    } else {
      const void *send =
          c->sendbuf == c->recvbuf ? MPI_IN_PLACE : (const char *)c->sendbuf + (size_t)off * es;
      k = (mpi_call){CALL_ALLREDUCE, send, recv, n, dt, 0, MPI_DATATYPE_NULL, op, 0,
                     NULL, NULL, NULL, NULL};
    }
    MPT_RETURN_IF(mpt__mpi_run_call(comm, r, &k, STAGE_DATA, deadline_ms));
  }
  return MPT_OK;
}

