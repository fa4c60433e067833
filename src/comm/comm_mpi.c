/* The MPI comm backend: each collective is a host function on the caller's stream (the comm
 * worker thread for the comm's own stream) that makes the MPI calls, in one of two progress
 * modes (comm.h "Progress"):
 *   - blocking (default): the blocking calls MPI_Allreduce, MPI_Bcast, MPI_Allgather,
 *     MPI_Reduce_scatter, MPI_Allgatherv, MPI_Reduce, MPI_Barrier, as Horovod's background
 *     thread does. Open MPI's blocking collectives (coll/tuned) progress inside the call and are faster than its non-blocking ones (libnbc,
 *     which only advances inside MPI_Test). The worker cannot keep a deadline here: it is kept
 *     by whoever waits (comm_wait.c), using the in-flight list this file maintains.
 *   - polling: the non-blocking calls (MPI_Iallreduce, ...) polled with MPI_Test until they
 *     complete or the collective's deadline passes; the worker keeps the deadline itself.
 * Also the MPI helpers shared with the bootstrap (error text, polling, dtypes).
 *
 * Runs on: enqueue functions on the caller's thread; op_run on the stream's thread.
 *
 * Op records: each enqueued collective takes a record from a per-comm free list (allocated only
 * when the list is empty, so the steady state does not allocate) and op_run returns it when it
 * finishes. A record whose host function never runs (its stream had already failed) stays
 * allocated until mpt_comm_free, which frees every record ever made. Records therefore live
 * from enqueue to the end of op_run, or to mpt_comm_free at the latest. Exception: a record
 * whose collective timed out in polling mode is leaked on purpose, because MPI cannot cancel a
 * collective and may still write into it (its signature and agreement buffers) if the peers
 * arrive late. (In blocking mode a timed-out collective never returns, or returns into a comm
 * that mpt_comm_free leaked whole.)
 *
 * Sequence of one collective on the worker, all under one deadline (start + timeout_ms):
 *   1. the comm is unusable -> fail at once, no MPI call (atomic with entering the in-flight
 *      list, so nothing starts after a waiter declared a timeout);
 *   2. checked mode: all-gather the signatures, compare (mismatch -> MPT_EMISMATCH on every
 *      rank, no data moves, the comm stays usable because every rank skipped the same op);
 *   3. the data collective, split into chunks of at most max_chunk_count elements;
 *   4. agreement (confirm_collectives): all-reduce MAX of {failing rank code, hash, -hash}, so a
 *      rank that completed while another failed or disagreed reports an error too;
 *   5. AVG: divide by the world size.
 * In blocking mode, after every MPI call returns the comm is checked again: a waiter may have
 * declared the collective timed out meanwhile, and then nothing more is touched (no further MPI
 * call, no write into the caller's buffers).
 * Any failure other than a checked-mode mismatch marks the comm unusable: after a timeout a
 * collective may still be pending inside MPI, and after a disagreement the ranks' matching of
 * collectives is no longer trustworthy. */
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  MPI_Op bf16_sum;   /* bfloat16 SUM: widen, add in float32, round back (see bf16_add) */
} mpi_state;

/* ---- float32 MIN and MAX that propagate NaN ------------------------------------------------
 * MPI_MIN and MPI_MAX are plain comparisons in Open MPI (a < b ? a : b), so a NaN survives or
 * vanishes depending on which operand it is, that is on the reduction order, which depends on
 * the number of ranks and the algorithm (at 3 ranks a NaN of rank 1 vanished on every rank).
 * These ops return NaN as soon as either operand is NaN, like SUM, and break ties between -0
 * and +0 by sign (min -0, max +0), so that the result is the same bits whatever the order: any
 * NaN becomes the canonical quiet NaN. */
static void float_min(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const float *a = in;
  float *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = a[i], y = b[i];
    if (x != x || y != y)
      b[i] = NAN;
    else if (x < y || (x == y && signbit(x)))
      b[i] = x;
  }
}

static void float_max(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const float *a = in;
  float *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = a[i], y = b[i];
    if (x != x || y != y)
      b[i] = NAN;
    else if (x > y || (x == y && !signbit(x)))
      b[i] = x;
  }
}

/* bfloat16 SUM on 2-byte elements (comm.h "bfloat16"): each pairwise step widens both operands
 * (exact), adds in float32 and rounds to nearest even (one rounding of relative error <= 2^-8
 * per step; NaN stays NaN). Commutative bit for bit (but for which NaN payload survives), so MPI
 * may order the operands freely. The loop is core's vectorised mpt_bf16_add_array. */
static void bf16_add(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  mpt_bf16_add_array(in, inout, *len);
}

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

static void describe_core(const int64_t *s, char *buf, size_t nbytes);

/* One rank's signature as a phrase: "all-reduces 8 float32 (sum) as collective #3 at step 12
 * (grad bucket 0)" (no step: not tagged; no purpose: none given). */
static void describe_sig(const int64_t *s, char *buf, size_t nbytes) {
  describe_core(s, buf, nbytes);
  const size_t used = strlen(buf);
  char purpose[MPT_COMM_PURPOSE_MAX];
  memcpy(purpose, s + 6, sizeof purpose);
  purpose[sizeof purpose - 1] = '\0';
  char step[40] = "";
  if (s[5] >= 0) snprintf(step, sizeof step, " at step %lld", (long long)s[5]);
  if (used < nbytes)
    snprintf(buf + used, nbytes - used, "%s%s%s%s", step, purpose[0] ? " (" : "", purpose,
             purpose[0] ? ")" : "");
}

static void describe_core(const int64_t *s, char *buf, size_t nbytes) {
  long long n = (long long)s[1];
  const char *dt = mpt_dtype_name((mpt_dtype)s[2]);
  unsigned long long seq = (unsigned long long)s[4];
  switch ((int)s[0]) {
    case MPT__COLL_ALLREDUCE:
      snprintf(buf, nbytes, "all-reduces %lld %s (%s) as collective #%llu", n, dt,
               mpt_reduce_op_name((mpt_reduce_op)s[3]), seq);
      break;
    case MPT__COLL_BROADCAST:
      snprintf(buf, nbytes, "broadcasts %lld %s from root %lld as collective #%llu", n, dt,
               (long long)s[3], seq);
      break;
    case MPT__COLL_ALLGATHER:
      snprintf(buf, nbytes, "all-gathers %lld %s as collective #%llu", n, dt, seq);
      break;
    case MPT__COLL_BARRIER:
      snprintf(buf, nbytes, "enters a barrier as collective #%llu", seq);
      break;
    case MPT__COLL_REDUCE_SCATTER:
      snprintf(buf, nbytes, "reduce-scatters %lld %s (%s) as collective #%llu", n, dt,
               mpt_reduce_op_name((mpt_reduce_op)s[3]), seq);
      break;
    case MPT__COLL_ALLGATHER_SHARDS:
      snprintf(buf, nbytes, "all-gathers shards of %lld %s as collective #%llu", n, dt, seq);
      break;
    default:
      snprintf(buf, nbytes, "issues an unknown collective (kind %lld) as #%llu", (long long)s[0],
               seq);
  }
}

static void make_sig(const mpt__coll *c, int64_t *s) {
  s[0] = c->kind;
  s[1] = c->count;
  s[2] = c->dtype;
  s[3] = c->arg;
  s[4] = (int64_t)c->seq;
  s[5] = c->step;
  memcpy(s + 6, c->purpose, sizeof c->purpose);
}

/* 62-bit mix of the signature (splitmix64 steps), so that hash and -hash both fit int64. */
static int64_t sig_hash(const int64_t *s) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < SIG_CORE; i++) {
    h ^= (uint64_t)s[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return (int64_t)(h >> 2);
}

/* ---- one MPI call in either progress mode ------------------------------------------------- */

typedef enum {
  CALL_ALLREDUCE,
  CALL_BCAST,
  CALL_ALLGATHER,
  CALL_BARRIER,
  CALL_REDUCE_SCATTER, /* counts: per-rank receive counts */
  CALL_ALLGATHERV,     /* in place; counts, displs */
  CALL_REDUCE,         /* to root; recv ignored off the root */
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
  const int *counts, *displs; /* reduce-scatter, all-gatherv */
} mpi_call;

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
  }
  return "MPI call";
}

/* Runs one call for collective `r` at `stage` (a phrase prefix, see mpt__inflight). Blocking
 * mode: the blocking call, then the comm check (a waiter may have declared a timeout). Polling
 * mode: the non-blocking call, polled until done or deadline_ms. Returns OK, ECOMM (naming the
 * call, the stage, the collective and the rank), ETIMEOUT, or the comm's failure. */
static mpt_status run_call(mpt_comm *comm, op_rec *r, const mpi_call *k, const char *stage,
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
static const char STAGE_CHECK[] = "checked mode: the signature exchange before ";
static const char STAGE_AGREE[] = "the agreement after ";

/* ---- the stages -------------------------------------------------------------------------- */

static mpt_status check_signatures(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  if (!r->sigs && !(r->sigs = malloc(sizeof(int64_t) * SIG_LEN * (size_t)comm->world_size)))
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the signature table of checked mode");
  make_sig(c, r->sig_mine);
  mpi_call k = {CALL_ALLGATHER, r->sig_mine, r->sigs, SIG_LEN, MPI_INT64_T, SIG_LEN,
                MPI_INT64_T, MPI_OP_NULL, 0, NULL, NULL};
  MPT_RETURN_IF(run_call(comm, r, &k, STAGE_CHECK, deadline_ms));

  /* Every rank sees the same table, so every rank reaches the same verdict and message. */
  char msg[1024], phrase[224];
  int ndiff = 0;
  size_t used = 0;
  for (int q = 1; q < comm->world_size; q++) {
    if (memcmp(r->sigs + (size_t)q * SIG_LEN, r->sigs, sizeof(int64_t) * SIG_LEN) == 0) continue;
    if (ndiff == 0) {
      describe_sig(r->sigs, phrase, sizeof phrase);
      used = (size_t)snprintf(msg, sizeof msg, "rank 0 %s", phrase);
    }
    if (++ndiff <= 4 && used < sizeof msg) {
      describe_sig(r->sigs + (size_t)q * SIG_LEN, phrase, sizeof phrase);
      used += (size_t)snprintf(msg + used, sizeof msg - used, ", rank %d %s", q, phrase);
    }
  }
  if (ndiff == 0) return MPT_OK;
  if (ndiff > 4 && used < sizeof msg)
    snprintf(msg + used, sizeof msg - used, ", and %d more ranks differ from rank 0", ndiff - 4);
  return MPT_FAIL(MPT_EMISMATCH, "collectives disagree across ranks (checked mode): %s", msg);
}

/* The MPI reduction of collective c. */
static MPI_Op reduce_op(const mpt_comm *comm, const mpt__coll *c) {
  const mpi_state *ms = comm->backend_state;
  if (c->dtype == MPT_BF16) return ms->bf16_sum; /* sum and avg (the prep refused the rest) */
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

static mpt_status run_sharded(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  const int world = comm->world_size, me = comm->rank;
  const MPI_Datatype dt = mpt__mpi_dtype(c->dtype);
  const size_t es = mpt_dtype_size(c->dtype);
  const int gather = c->kind == MPT__COLL_ALLGATHER_SHARDS;
  const int64_t most = comm->config.max_chunk_count;
  const int64_t chunk = !gather && most > RS_PIECE ? RS_PIECE : most;
  const MPI_Op op = gather ? MPI_OP_NULL : reduce_op(comm, c);
  int64_t my_off, my_n, s_off, s_n;
  mpt_comm_shard(c->count, world, me, &my_off, &my_n);
  char *recv = c->recvbuf;
  const char *send = c->sendbuf;
  const int in_place = !gather && recv == (const char *)send + (size_t)my_off * es;

  if (c->count <= chunk) {
    if (!r->counts && !(r->counts = malloc(sizeof(int) * 2 * (size_t)world)))
      return MPT_FAIL(MPT_ENOMEM, "cannot allocate the shard counts");
    r->displs = r->counts + world;
    for (int q = 0; q < world; q++) {
      mpt_comm_shard(c->count, world, q, &s_off, &s_n);
      r->counts[q] = (int)s_n;
      r->displs[q] = (int)s_off;
    }
    mpi_call k = {gather ? CALL_ALLGATHERV : CALL_REDUCE_SCATTER, NULL, NULL, 0, dt, 0,
                  MPI_DATATYPE_NULL, op, 0, r->counts, r->displs};
    /* In place, MPI takes the input from recvbuf and leaves this rank's block at its start:
     * hand it the whole buffer, then move the block to the shard. */
    char *base = in_place ? recv - (size_t)my_off * es : recv;
    k.send = in_place ? MPI_IN_PLACE : send;
    k.recv = base;
    if (!gather && !in_place && my_n == 0) k.recv = r->empty; /* nothing lands; not NULL */
    MPT_RETURN_IF(run_call(comm, r, &k, STAGE_DATA, deadline_ms));
    if (in_place && my_off > 0 && my_n > 0) memmove(recv, base, (size_t)my_n * es);
    return MPT_OK;
  }

  int64_t longest;
  mpt_comm_shard(c->count, world, 0, &s_off, &longest);
  for (int64_t off = 0; off < longest; off += chunk) {
    for (int q = 0; q < world; q++) {
      mpt_comm_shard(c->count, world, q, &s_off, &s_n);
      if (s_n <= off) continue;
      int n = (int)(s_n - off < chunk ? s_n - off : chunk);
      char *at = (char *)(gather ? recv : (char *)send) + (size_t)(s_off + off) * es;
      mpi_call k;
      if (gather) {
        k = (mpi_call){CALL_BCAST, NULL, at, n, dt, 0, MPI_DATATYPE_NULL, MPI_OP_NULL, q,
                       NULL, NULL};
      } else {
        const void *src = at;
        void *dst = NULL;
        if (q == me) {
          dst = recv + (size_t)off * es;
          if (in_place) src = MPI_IN_PLACE;
        }
        k = (mpi_call){CALL_REDUCE, src, dst, n, dt, 0, MPI_DATATYPE_NULL, op, q, NULL, NULL};
      }
      MPT_RETURN_IF(run_call(comm, r, &k, STAGE_DATA, deadline_ms));
    }
  }
  return MPT_OK;
}

/* Runs the data movement of one collective, chunked. */
static mpt_status run_data(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  MPI_Datatype dt = mpt__mpi_dtype(c->dtype);
  size_t es = mpt_dtype_size(c->dtype);
  int64_t chunk = comm->config.max_chunk_count;
  char what[160];
  int rc;

  if (c->kind == MPT__COLL_BARRIER) {
    mpi_call k = {CALL_BARRIER, NULL, NULL, 0, MPI_DATATYPE_NULL, 0, MPI_DATATYPE_NULL,
                  MPI_OP_NULL, 0, NULL, NULL};
    return run_call(comm, r, &k, STAGE_DATA, deadline_ms);
  }

  if (c->kind == MPT__COLL_ALLGATHER) {
    char *recv = c->recvbuf;
    int in_place = c->sendbuf == recv + (size_t)comm->rank * (size_t)c->count * es;
    if (c->count <= chunk) {
      mpi_call k = {CALL_ALLGATHER, in_place ? MPI_IN_PLACE : c->sendbuf, recv, (int)c->count,
                    dt, (int)c->count, dt, MPI_OP_NULL, 0, NULL, NULL};
      return run_call(comm, r, &k, STAGE_DATA, deadline_ms);
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
                    dt, 1, block, MPI_OP_NULL, 0, NULL, NULL};
      mpt_status st = run_call(comm, r, &k, STAGE_DATA, deadline_ms);
      /* A non-blocking call keeps the type alive while it needs it; a stuck blocking call
       * never returns here, and one that returned is done with it. */
      MPI_Type_free(&block);
      MPT_RETURN_IF(st);
    }
    return MPT_OK;
  }

  if (c->kind == MPT__COLL_REDUCE_SCATTER || c->kind == MPT__COLL_ALLGATHER_SHARDS)
    return run_sharded(comm, r, deadline_ms);

  const MPI_Op op = reduce_op(comm, c);
  for (int64_t off = 0; off < c->count; off += chunk) {
    int n = (int)(c->count - off < chunk ? c->count - off : chunk);
    char *recv = (char *)c->recvbuf + (size_t)off * es;
    mpi_call k;
    if (c->kind == MPT__COLL_BROADCAST) {
      k = (mpi_call){CALL_BCAST, NULL, recv, n, dt, 0, MPI_DATATYPE_NULL, MPI_OP_NULL,
                     c->arg, NULL, NULL};
    } else {
      const void *send =
          c->sendbuf == c->recvbuf ? MPI_IN_PLACE : (const char *)c->sendbuf + (size_t)off * es;
      k = (mpi_call){CALL_ALLREDUCE, send, recv, n, dt, 0, MPI_DATATYPE_NULL, op, 0, NULL, NULL};
    }
    MPT_RETURN_IF(run_call(comm, r, &k, STAGE_DATA, deadline_ms));
  }
  return MPT_OK;
}

/* The agreement after the data collective. `local` is this rank's outcome so far; on return
 * *disagree says whether the ranks' signatures differ. For a rank whose own part succeeded the
 * result is MPT_OK, MPT_EMISMATCH (signatures differ) or MPT_ECOMM (another rank failed). */
static mpt_status confirm(mpt_comm *comm, op_rec *r, mpt_status local, double deadline_ms,
                          int *disagree) {
  const mpt__coll *c = &r->coll;
  int64_t sig[SIG_LEN];
  make_sig(c, sig);
  int64_t h = sig_hash(sig);
  r->confirm_in[0] = local == MPT_OK ? 0 : comm->world_size - comm->rank;
  r->confirm_in[1] = h;
  r->confirm_in[2] = -h;
  *disagree = 0;
  char what[160];
  mpi_call k = {CALL_ALLREDUCE, r->confirm_in, r->confirm_out, 3, MPI_INT64_T, 0,
                MPI_DATATYPE_NULL, MPI_MAX, 0, NULL, NULL};
  MPT_RETURN_IF(run_call(comm, r, &k, STAGE_AGREE, deadline_ms));
  *disagree = r->confirm_out[1] != -r->confirm_out[2];
  long long failed_rank = r->confirm_out[0] > 0 ? comm->world_size - r->confirm_out[0] : -1;
  if (local != MPT_OK) return MPT_OK; /* the caller keeps this rank's own error */
  if (*disagree) {
    char also[64] = "";
    if (failed_rank >= 0) snprintf(also, sizeof also, ", and it failed on rank %lld", failed_rank);
    return MPT_FAIL(MPT_EMISMATCH,
                    "ranks disagree on %s: count, dtype, op or order differ%s; the result on "
                    "rank %d is not valid (MPT_CHECK_COLLECTIVES=1 names the ranks and their "
                    "collectives)",
                    mpt__coll_describe(c, what, sizeof what), also, comm->rank);
  }
  if (failed_rank >= 0)
    return MPT_FAIL(MPT_ECOMM, "%s failed on rank %lld, so the result on rank %d is incomplete",
                    mpt__coll_describe(c, what, sizeof what), failed_rank, comm->rank);
  return MPT_OK;
}

/* Steps 2-5 of the file comment; the caller has entered the in-flight list. */
static mpt_status execute_listed(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  mpt_status st = MPT_OK;
  if (comm->config.check_collectives) {
    st = check_signatures(comm, r, deadline_ms);
    if (st == MPT_EMISMATCH) return st; /* every rank skipped this one: the comm is fine */
    if (st != MPT_OK) goto broken;
  }
  if (c->count == 0 && c->kind != MPT__COLL_BARRIER) return MPT_OK; /* checked mode only */

  st = run_data(comm, r, deadline_ms);
  if (st == MPT_ETIMEOUT) goto broken; /* others may still be inside it: no agreement */
  if (st != MPT_OK && mpt_comm_error(comm) != MPT_OK) return st; /* a waiter gave up on it */
  if (comm->config.confirm_collectives) {
    char local_detail[1024];
    snprintf(local_detail, sizeof local_detail, "%s", mpt_last_error());
    int disagree = 0;
    mpt_status agreed = confirm(comm, r, st, deadline_ms, &disagree);
    if (agreed == MPT_ETIMEOUT && !comm->config.blocking) r->abandoned = 1;
    if (agreed != MPT_OK && mpt_comm_error(comm) != MPT_OK) return agreed; /* comm failed */
    if (st != MPT_OK) /* keep this rank's own error, with what the agreement learnt */
      mpt_error_set(st, "%s%s", local_detail,
                    disagree ? "; the ranks also disagree on this collective (count, dtype, op "
                               "or order; MPT_CHECK_COLLECTIVES=1 names them)"
                             : "");
    else
      st = agreed;
  }
  if (st != MPT_OK) goto broken;

  if ((c->kind == MPT__COLL_ALLREDUCE || c->kind == MPT__COLL_REDUCE_SCATTER) &&
      c->arg == MPT_REDUCE_AVG) {
    int64_t n = c->count, off;
    if (c->kind == MPT__COLL_REDUCE_SCATTER)
      mpt_comm_shard(c->count, comm->world_size, comm->rank, &off, &n);
    const float w = (float)comm->world_size;
    if (c->dtype == MPT_BF16) {
      uint16_t *x = c->recvbuf;
      for (int64_t i = 0; i < n; i++) x[i] = mpt_bf16_from_f32(mpt_bf16_to_f32(x[i]) / w);
    } else {
      float *x = c->recvbuf;
      for (int64_t i = 0; i < n; i++) x[i] /= w;
    }
  }
  return MPT_OK;

broken:
  /* A timed-out request stays pending inside MPI and may still write into the record. */
  if (st == MPT_ETIMEOUT) r->abandoned = 1;
  mpt__comm_set_failed(comm, st);
  return st;
}

static mpt_status execute(mpt_comm *comm, op_rec *r) {
  double deadline_ms = mpt_time_ms() + comm->config.timeout_ms;
  mpt_status st = mpt__inflight_begin(comm, &r->inflight, &r->coll);
  if (st != MPT_OK) {
    mpt__flight_finished(comm, r->coll.seq, st);
    return st;
  }
  st = execute_listed(comm, r, deadline_ms);
  mpt__inflight_end(comm, &r->inflight);
  mpt__flight_finished(comm, r->coll.seq, st);
  return st;
}

static void rec_release(mpi_state *s, op_rec *r) {
  pthread_mutex_lock(&s->mutex);
  r->next_free = s->free_list;
  s->free_list = r;
  pthread_mutex_unlock(&s->mutex);
}

/* Host function on the stream. */
static mpt_status op_run(void *arg) {
  op_rec *r = arg;
  mpt_comm *comm = r->comm;
  mpt_status st = execute(comm, r);
  if (!r->abandoned) rec_release(comm->backend_state, r);
  return st;
}

static mpt_status enqueue(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll) {
  mpi_state *s = comm->backend_state;
  pthread_mutex_lock(&s->mutex);
  op_rec *r = s->free_list;
  if (r) {
    s->free_list = r->next_free;
  } else if ((r = calloc(1, sizeof *r))) {
    r->next_all = s->all;
    s->all = r;
  }
  pthread_mutex_unlock(&s->mutex);
  if (!r) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a collective record");
  r->comm = comm;
  r->coll = *coll;
  /* Kept: in blocking mode nothing else can end a wait on a collective that never returns. */
  mpt_status st = mpt__stream_launch_host_kept(stream, op_run, r, mpt__comm_keeper, comm);
  if (st != MPT_OK) rec_release(s, r);
  return st;
}

static mpt_status mpi_init(mpt_comm *comm) {
  mpi_state *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the MPI backend state");
  s->fmin = s->fmax = s->bf16_sum = MPI_OP_NULL;
  int rc = MPI_Op_create(float_min, 1, &s->fmin);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(float_max, 1, &s->fmax);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_add, 1, &s->bf16_sum);
  if (rc != MPI_SUCCESS) {
    if (s->fmin != MPI_OP_NULL) MPI_Op_free(&s->fmin);
    if (s->fmax != MPI_OP_NULL) MPI_Op_free(&s->fmax);
    free(s);
    return MPT_MPI_FAIL(rc, comm->rank, "MPI_Op_create (float32 min / max, bfloat16 sum)");
  }
  pthread_mutex_init(&s->mutex, NULL);
  comm->backend_state = s;
  return MPT_OK;
}

static void mpi_free(mpt_comm *comm) {
  mpi_state *s = comm->backend_state;
  if (!s) return;
  op_rec *r = s->all;
  while (r) {
    op_rec *next = r->next_all;
    if (!r->abandoned) {
      free(r->counts);
      free(r->sigs);
      free(r);
    }
    r = next;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Op_free(&s->fmin);
    MPI_Op_free(&s->fmax);
    MPI_Op_free(&s->bf16_sum);
  }
  pthread_mutex_destroy(&s->mutex);
  free(s);
  comm->backend_state = NULL;
}

const mpt__comm_backend mpt__comm_mpi_backend = {
    .name = "mpi",
    .init = mpi_init,
    .free = mpi_free,
    .allreduce = enqueue,
    .broadcast = enqueue,
    .allgather = enqueue,
    .barrier = enqueue,
    .reduce_scatter = enqueue,
    .allgather_shards = enqueue,
};
