/* Naming collectives, the comm's list of collectives in flight, and the deadline that a waiter
 * enforces in blocking mode (comm.h "Progress").
 *
 * In blocking mode the worker sits inside a blocking MPI call that cannot be interrupted, so the
 * worker cannot keep its own deadline: whoever waits does. Every collective enters the comm's
 * in-flight list (oldest first, under comm->mutex) when it starts running and leaves it when its
 * last MPI call returns; a waiter that runs out of patience names the oldest entry, which is the
 * collective that holds up everything queued behind it.
 *
 * Invariants: an entry is in the list exactly while its collective is between its first and
 * last MPI call. No collective enters the list once the comm has failed (the check and the
 * insertion happen under the same lock), so after a waiter marks the comm failed with a timeout,
 * the only collectives that can still be inside MPI are the ones listed at that moment.
 * `started` counts entries ever made (progress for the waiter's idle rule).
 *
 * Runs on: begin / stage / end / check on the stream's thread that runs the collective; the
 * descriptions and the deadline wait on any caller thread. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

/* ---- names -------------------------------------------------------------------------------- */

const char *mpt__coll_kind_name(int kind) {
  switch (kind) {
    case MPT__COLL_ALLREDUCE:
      return "all-reduce";
    case MPT__COLL_BROADCAST:
      return "broadcast";
    case MPT__COLL_ALLGATHER:
      return "all-gather";
    case MPT__COLL_BARRIER:
      return "barrier";
    case MPT__COLL_REDUCE_SCATTER:
      return "reduce-scatter";
    case MPT__COLL_ALLGATHER_SHARDS:
      return "all-gather of shards";
  }
  return "unknown collective";
}

const char *mpt__coll_describe(const mpt__coll *c, char *buf, size_t nbytes) {
  const char *dt = mpt_dtype_name(c->dtype);
  long long n = (long long)c->count;
  unsigned long long seq = (unsigned long long)c->seq;
  switch (c->kind) {
    case MPT__COLL_ALLREDUCE:
      snprintf(buf, nbytes, "all-reduce #%llu (count %lld %s %s)", seq, n, dt,
               mpt_reduce_op_name((mpt_reduce_op)c->arg));
      break;
    case MPT__COLL_BROADCAST:
      snprintf(buf, nbytes, "broadcast #%llu (count %lld %s from root %d)", seq, n, dt, c->arg);
      break;
    case MPT__COLL_ALLGATHER:
      snprintf(buf, nbytes, "all-gather #%llu (count %lld %s per rank)", seq, n, dt);
      break;
    case MPT__COLL_REDUCE_SCATTER:
      snprintf(buf, nbytes, "reduce-scatter #%llu (count %lld %s %s)", seq, n, dt,
               mpt_reduce_op_name((mpt_reduce_op)c->arg));
      break;
    case MPT__COLL_ALLGATHER_SHARDS:
      snprintf(buf, nbytes, "all-gather of shards #%llu (count %lld %s in all)", seq, n, dt);
      break;
    default:
      snprintf(buf, nbytes, "%s #%llu", mpt__coll_kind_name(c->kind), seq);
  }
  return buf;
}

mpt_status mpt__coll_timeout_error(mpt_comm *comm, const mpt__coll *c, const char *stage) {
  char what[160], who[2048];
  mpt__progress_describe(comm, c->seq, who, sizeof who); /* which ranks held it up */
  return MPT_FAIL(MPT_ETIMEOUT, "%s%s did not complete within %g s on rank %d%s", stage,
                  mpt__coll_describe(c, what, sizeof what), comm->config.timeout_ms / 1000.0,
                  comm->rank, who);
}

/* ---- the in-flight list -------------------------------------------------------------------- */

mpt_status mpt__inflight_begin(mpt_comm *comm, mpt__inflight *f, const mpt__coll *c) {
  pthread_mutex_lock(&comm->mutex);
  if (atomic_load(&comm->failed) != MPT_OK) {
    pthread_mutex_unlock(&comm->mutex);
    return mpt__comm_check_usable(comm);
  }
  f->coll = *c;
  f->stage = "";
  f->start_ms = mpt_time_ms();
  f->next = NULL;
  f->prev = NULL;
  if (!comm->inflight) {
    comm->inflight = f;
  } else {
    mpt__inflight *last = comm->inflight;
    while (last->next) last = last->next;
    last->next = f;
    f->prev = last;
  }
  comm->started++;
  pthread_mutex_unlock(&comm->mutex);
  mpt__progress_started(comm, c->seq);
  mpt__flight_started(comm, c->seq);
  return MPT_OK;
}

void mpt__inflight_stage(mpt_comm *comm, mpt__inflight *f, const char *stage) {
  pthread_mutex_lock(&comm->mutex);
  f->stage = stage;
  pthread_mutex_unlock(&comm->mutex);
}

void mpt__inflight_end(mpt_comm *comm, mpt__inflight *f) {
  pthread_mutex_lock(&comm->mutex);
  if (f->prev)
    f->prev->next = f->next;
  else if (comm->inflight == f)
    comm->inflight = f->next;
  if (f->next) f->next->prev = f->prev;
  f->prev = f->next = NULL;
  pthread_mutex_unlock(&comm->mutex);
  mpt__progress_completed(comm, f->coll.seq);
}

mpt_status mpt__inflight_check(mpt_comm *comm) { return mpt__comm_check_usable(comm); }

/* Copies the oldest entry; returns the number of entries (0: *oldest untouched). Lock held. */
static int inflight_oldest_locked(const mpt_comm *comm, mpt__inflight *oldest) {
  int n = 0;
  for (const mpt__inflight *f = comm->inflight; f; f = f->next) {
    if (n == 0) *oldest = *f;
    n++;
  }
  return n;
}

mpt_status mpt_comm_describe_inflight(const mpt_comm *comm, char *buf, size_t nbytes) {
  if (!comm || !buf || nbytes == 0)
    return MPT_FAIL(MPT_EINVAL, "describe_inflight: NULL comm or empty buffer");
  mpt_comm *c = (mpt_comm *)comm; /* the lock is not part of the comm's logical state */
  mpt__inflight oldest;
  pthread_mutex_lock(&c->mutex);
  int n = inflight_oldest_locked(c, &oldest);
  pthread_mutex_unlock(&c->mutex);
  if (n == 0) {
    snprintf(buf, nbytes, "no collective in flight");
    return MPT_OK;
  }
  char what[160], more[64] = "";
  if (n > 1) snprintf(more, sizeof more, "; %d more in flight", n - 1);
  snprintf(buf, nbytes, "%s%s running for %.1f s on rank %d%s", oldest.stage,
           mpt__coll_describe(&oldest.coll, what, sizeof what),
           (mpt_time_ms() - oldest.start_ms) / 1000.0, comm->rank, more);
  return MPT_OK;
}

/* ---- the waiter's deadline ----------------------------------------------------------------- */

/* Polling mode: the workers keep the deadlines; the waiters only back them up, late enough that
 * the workers' own (more specific) error normally completes the event first. */
static double waiter_grace_ms(const mpt_comm *comm) {
  if (comm->config.blocking) return 0;
  double grace_ms = comm->config.timeout_ms / 10;
  return grace_ms < 1000 ? 1000 : grace_ms;
}

mpt_status mpt_comm_wait_event(mpt_comm *comm, mpt_event *event) {
  if (!comm || !event) return MPT_FAIL(MPT_EINVAL, "wait_event: NULL comm or event");
  return mpt__comm_wait_deadline(comm, event, NULL, waiter_grace_ms(comm));
}

/* Runs on a waiter's thread with the stream's (and maybe an event's) lock held: takes only
 * comm->mutex, never a stream's or an event's lock. */
mpt_status mpt__comm_keeper(void *arg, double *left_ms) {
  mpt_comm *comm = arg;
  if (atomic_load(&comm->failed) != MPT_OK) return mpt__comm_check_usable(comm);
  const double timeout_ms = comm->config.timeout_ms + waiter_grace_ms(comm);
  mpt__inflight oldest;
  pthread_mutex_lock(&comm->mutex);
  int n = inflight_oldest_locked(comm, &oldest);
  pthread_mutex_unlock(&comm->mutex);
  double now = mpt_time_ms();
  if (n == 0) { /* between two MPI calls of the collective, or before its first: look again */
    *left_ms = timeout_ms < 100 ? timeout_ms : 100;
    return MPT_OK;
  }
  if (oldest.start_ms + timeout_ms > now) {
    *left_ms = oldest.start_ms + timeout_ms - now;
    return MPT_OK;
  }
  mpt_status st = mpt__coll_timeout_error(comm, &oldest.coll, oldest.stage);
  mpt__comm_set_failed(comm, st);
  return st;
}

mpt_status mpt__comm_wait_deadline(mpt_comm *comm, mpt_event *event, const mpt__coll *c,
                                   double grace_ms) {
  /* A backend with asynchronous errors of its own (NCCL) polls them while it waits. */
  if (comm->backend->wait_event) return comm->backend->wait_event(comm, event, c, grace_ms);
  const double timeout_ms = comm->config.timeout_ms + grace_ms;
  double idle_since = mpt_time_ms(); /* last time a collective was seen starting or running */
  uint64_t started_seen;
  pthread_mutex_lock(&comm->mutex);
  started_seen = comm->started;
  pthread_mutex_unlock(&comm->mutex);

  for (;;) {
    mpt__inflight oldest;
    double now = mpt_time_ms();
    pthread_mutex_lock(&comm->mutex);
    int n = inflight_oldest_locked(comm, &oldest);
    uint64_t started = comm->started;
    pthread_mutex_unlock(&comm->mutex);
    if (started != started_seen || n > 0) { /* a collective started or runs: not idle */
      started_seen = started;
      idle_since = now;
    }
    double until = n > 0 ? oldest.start_ms + timeout_ms : idle_since + timeout_ms;
    if (until > now) {
      mpt_event_synchronize(event, until - now);
      if (mpt_event_query(event)) return mpt_event_synchronize(event, 0); /* its own status */
      continue;
    }
    if (mpt_event_query(event)) return mpt_event_synchronize(event, 0);
    mpt_status st;
    if (n > 0) {
      st = mpt__coll_timeout_error(comm, &oldest.coll, oldest.stage);
    } else {
      char what[160] = "the awaited event";
      if (c) mpt__coll_describe(c, what, sizeof what);
      st = MPT_FAIL(MPT_ETIMEOUT,
                    "%s did not complete within %g s on rank %d: no collective started or ran "
                    "on the comm for that long (the work queued ahead of it has not finished)",
                    what, comm->config.timeout_ms / 1000.0, comm->rank);
    }
    mpt__comm_set_failed(comm, st);
    return st;
  }
}
