/* The MPI comm backend: each collective is a host function on the caller's stream (the comm
 * worker thread for the comm's own stream) that makes the MPI calls, in one of two progress
 * modes (comm.h "Progress"):
 *   - blocking (default): the blocking calls MPI_Allreduce, MPI_Bcast, MPI_Allgather,
 *     MPI_Reduce_scatter, MPI_Allgatherv, MPI_Reduce, MPI_Barrier, as Horovod's background
 *     thread does. Open MPI's blocking collectives (coll/tuned) progress inside the call and
 *     are faster than its non-blocking ones (libnbc, which only advances inside MPI_Test). The
 *     worker cannot keep a deadline here: it is kept by whoever waits (comm_wait.c), using the
 *     in-flight list this file maintains.
 *   - polling: the non-blocking calls (MPI_Iallreduce, ...) polled with MPI_Test until they
 *     complete or the collective's deadline passes; the worker keeps the deadline itself.
 * This file: the backend table, the op records, checked mode, the agreement and the sequence
 * below; the MPI calls themselves and the data movement of each collective are in
 * comm_mpi_call.c (comm_mpi_impl.h).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi_impl.h"

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

static const char STAGE_CHECK[] = "checked mode: the signature exchange before ";
static const char STAGE_AGREE[] = "the agreement after ";

/* ---- the stages -------------------------------------------------------------------------- */

static mpt_status check_signatures(mpt_comm *comm, op_rec *r, double deadline_ms) {
  const mpt__coll *c = &r->coll;
  if (!r->sigs && !(r->sigs = malloc(sizeof(int64_t) * SIG_LEN * (size_t)comm->world_size)))
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the signature table of checked mode");
  make_sig(c, r->sig_mine);
  mpi_call k = {CALL_ALLGATHER, r->sig_mine, r->sigs, SIG_LEN, MPI_INT64_T, SIG_LEN,
                MPI_INT64_T, MPI_OP_NULL, 0, NULL, NULL, NULL, NULL};
  MPT_RETURN_IF(mpt__mpi_run_call(comm, r, &k, STAGE_CHECK, deadline_ms));

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
                MPI_DATATYPE_NULL, MPI_MAX, 0, NULL, NULL, NULL, NULL};
  MPT_RETURN_IF(mpt__mpi_run_call(comm, r, &k, STAGE_AGREE, deadline_ms));
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

  st = mpt__mpi_run_data(comm, r, deadline_ms);
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

  /* AVG: float32 divided here; bfloat16 was divided before its one rounding */
  if ((c->kind == MPT__COLL_ALLREDUCE || c->kind == MPT__COLL_REDUCE_SCATTER) &&
      c->arg == MPT_REDUCE_AVG && c->dtype != MPT_BF16) {
    int64_t n = c->count, off;
    if (c->kind == MPT__COLL_REDUCE_SCATTER)
      mpt_comm_shard(c->count, comm->world_size, comm->rank, &off, &n);
    const float w = (float)comm->world_size;
    float *x = c->recvbuf;
    for (int64_t i = 0; i < n; i++) x[i] /= w;
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
  s->fmin = s->fmax = MPI_OP_NULL;
  int rc = MPI_Op_create(float_min, 1, &s->fmin);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(float_max, 1, &s->fmax);
  if (rc != MPI_SUCCESS) {
    if (s->fmin != MPI_OP_NULL) MPI_Op_free(&s->fmin);
    if (s->fmax != MPI_OP_NULL) MPI_Op_free(&s->fmax);
    free(s);
    return MPT_MPI_FAIL(rc, comm->rank, "MPI_Op_create (float32 min / max)");
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

