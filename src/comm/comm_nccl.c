/* The NCCL comm backend (comm.h "Devices"), part 1: errors, the failure checks shared by the
 * watchdog and the waiters, the bootstrap and the lifetime. The collectives and the waits are in
 * comm_nccl_coll.c. Built when configure found NCCL (src/comm/local.mk).
 *
 * Bootstrap (docs/faults.md F13): rank 0's ncclGetUniqueId, broadcast over the comm's MPI
 * communicator, an MPI all-reduce of "did my side prepare" that doubles as the barrier, then
 * ncclCommInitRankConfig with config.blocking = 0 polled with ncclCommGetAsyncError until it is
 * ready or the comm's timeout passes (then ncclCommAbort and MPT_ETIMEOUT, never a hang).
 *
 * The communicator is non-blocking, so any NCCL call may return ncclInProgress while NCCL
 * finishes it in the background (connection setup on the first collective with a peer); the
 * call is then polled with ncclCommGetAsyncError, under the collective's deadline, before the
 * next one (mpt__nccl_settle). Every collective is tracked in a ring of MPT__NCCL_RING_SLOTS
 * CUDA events recorded after it on its stream, with the time it was enqueued (more in flight:
 * the oldest are no longer tracked).
 *
 * Failure: a watchdog thread (every WATCHDOG_PERIOD_MS) and every waiter of
 * mpt__comm_wait_deadline (the *_sync wrappers, mpt_comm_wait_event, mpt_comm_free) look for an
 * asynchronous NCCL error and for a tracked collective still incomplete timeout_ms after it was
 * enqueued. Either aborts the NCCL communicator (ncclCommAbort stops its kernels, so the streams
 * drain), marks the comm unusable and the comm's own stream failed (sticky: later ops and waits
 * on it, and events recorded on it, report the error), and records MPT_ECOMM or MPT_ETIMEOUT
 * naming the collective, the rank and the device. A caller's own stream is not marked (the comm
 * cannot know whether it was freed meanwhile); its waits through mpt_comm_wait_event still
 * report the error.
 *
 * Threads: the watchdog on its own thread (asynchronous signals blocked, core/threads.h); the
 * rest on the caller's. One mutex guards every NCCL call on the communicator
 * (comm_nccl_impl.h), so that no abort races an enqueue. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_nccl_impl.h"
#include "core/cuda/cuda.h"
#include "core/threads.h"

_Static_assert(sizeof(ncclUniqueId) == MPT__NCCL_ID_NBYTES, "ncclUniqueId is not 128 bytes");

#define WATCHDOG_PERIOD_MS 100.0

/* ---- errors ------------------------------------------------------------------------------ */

static mpt_status status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return MPT_OK;
    case ncclUnhandledCudaError:
      return MPT_EDEVICE;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return MPT_EINVAL;
    default:
      return MPT_ECOMM;
  }
}

mpt_status mpt__nccl_error(const mpt__nccl_state *s, ncclResult_t r, const char *file, int line,
                           const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const char *last = s->nc && !s->aborted ? ncclGetLastError(s->nc) : ncclGetLastError(NULL);
  return mpt__error(status_of(r), file, line, "%s failed on rank %d (cuda:%d): %s%s%s", what,
                    s->comm->rank, s->dev, ncclGetErrorString(r), last && last[0] ? ": " : "",
                    last ? last : "");
}

/* Sleeps a little more each time: spins first (most calls finish in microseconds), then up to
 * 1 ms. */
void mpt__nccl_backoff(int *polls, long *sleep_ns) {
  if ((*polls)++ < 100) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, *sleep_ns};
  nanosleep(&ts, NULL);
  if (*sleep_ns < 1000000) *sleep_ns *= 2;
}

/* Polls a non-blocking communicator until the call that returned `r` is done. Returns its
 * outcome; *expired = 1 when deadline_ms passed first (the call is then still in progress). */
ncclResult_t mpt__nccl_settle(ncclComm_t nc, ncclResult_t r, double deadline_ms, int *expired) {
  int polls = 0;
  long sleep_ns = 2000;
  *expired = 0;
  while (r == ncclInProgress) {
    if (mpt_time_ms() >= deadline_ms) {
      *expired = 1;
      return r;
    }
    mpt__nccl_backoff(&polls, &sleep_ns);
    ncclResult_t q = ncclCommGetAsyncError(nc, &r);
    if (q != ncclSuccess) return q;
  }
  return r;
}

/* With s->mutex held and the detail of `st` recorded on this thread: aborts the communicator
 * (once), marks the comm unusable and its own stream failed. Returns st. */
mpt_status mpt__nccl_fail_locked(mpt__nccl_state *s, mpt_status st) {
  if (s->aborted) return st;
  s->aborted = 1;
  mpt__comm_set_failed(s->comm, st);
  mpt__cuda_stream_set_error(s->comm->stream, st, mpt_last_error());
  (void)cudaSetDevice(s->dev);
  const ncclResult_t r = ncclCommAbort(s->nc);
  if (r != ncclSuccess && r != ncclInProgress) /* st's detail stays the error on this thread */
    mpt_log(MPT_LOG_WARN, "ncclCommAbort on rank %d (cuda:%d) returned %s", s->comm->rank, s->dev,
            ncclGetErrorString(r));
  return st;
}

/* With s->mutex held: the oldest tracked collective that has not completed (NULL: none).
 * Completed slots are retired on the way. A CUDA error of an event (a device fault) is
 * returned in *err. */
static mpt__nccl_tracked *oldest_pending_locked(mpt__nccl_state *s, cudaError_t *err) {
  *err = cudaSuccess;
  for (int k = 0; k < MPT__NCCL_RING_SLOTS; k++) {
    mpt__nccl_tracked *t = &s->ring[(s->next + k) % MPT__NCCL_RING_SLOTS];
    if (!t->live) continue;
    cudaError_t e = cudaEventQuery(t->done);
    if (e == cudaErrorNotReady) {
      mpt__cuda_clear_not_ready();
      return t;
    }
    t->live = 0;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *err = e;
      return t;
    }
  }
  return NULL;
}

/* With s->mutex held: MPT_OK, or the failure found now (asynchronous NCCL error, device fault,
 * a tracked collective older than limit_ms), after which the comm is failed; or the earlier
 * failure, re-raised. */
mpt_status mpt__nccl_check_locked(mpt__nccl_state *s, double limit_ms) {
  if (s->aborted) return mpt__comm_check_usable(s->comm);
  (void)cudaSetDevice(s->dev);
  char what[160] = "";
  cudaError_t ce;
  mpt__nccl_tracked *t = oldest_pending_locked(s, &ce);
  if (t) mpt__coll_describe(&t->coll, what, sizeof what);
  ncclResult_t a = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(s->nc, &a);
  if (q != ncclSuccess) a = q;
  mpt_status st = MPT_OK;
  if (a != ncclSuccess && a != ncclInProgress)
    st = MPT_NCCL_ERROR(s, a, "%s%s (an asynchronous NCCL error; the communicator was aborted)",
                        t ? what : "the NCCL communicator", t ? " in flight" : "");
  else if (t && ce != cudaSuccess)
    st = MPT_FAIL(MPT_EDEVICE, "%s failed on rank %d (cuda:%d): %s (%s); the NCCL communicator "
                  "was aborted", what, s->comm->rank, s->dev, cudaGetErrorName(ce),
                  cudaGetErrorString(ce));
  else if (t && mpt_time_ms() - t->enqueue_ms > limit_ms)
    st = MPT_FAIL(MPT_ETIMEOUT, "%s did not complete within %g s on rank %d (NCCL on cuda:%d): a "
                  "rank did not reach it, issued a different collective, or died; the NCCL "
                  "communicator was aborted", what, s->comm->config.timeout_ms / 1000.0,
                  s->comm->rank, s->dev);
  return st == MPT_OK ? MPT_OK : mpt__nccl_fail_locked(s, st);
}

/* ---- the watchdog ------------------------------------------------------------------------ */

static void *watchdog_main(void *arg) {
  mpt__nccl_state *s = arg;
  (void)cudaSetDevice(s->dev);
  pthread_mutex_lock(&s->stop_mutex);
  while (!s->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(WATCHDOG_PERIOD_MS * 1e6);
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    int rc = pthread_cond_timedwait(&s->stop_cond, &s->stop_mutex, &ts);
    if (s->stop) break;
    if (rc != ETIMEDOUT && rc != 0) continue;
    pthread_mutex_unlock(&s->stop_mutex);
    pthread_mutex_lock(&s->mutex);
    if (!s->aborted && mpt__nccl_check_locked(s, s->comm->config.timeout_ms) != MPT_OK)
      /* the waiters report it too, with their context */
      mpt_log(MPT_LOG_ERROR, "%s", mpt_last_error());
    pthread_mutex_unlock(&s->mutex);
    pthread_mutex_lock(&s->stop_mutex);
  }
  pthread_mutex_unlock(&s->stop_mutex);
  return NULL;
}

/* ---- bootstrap --------------------------------------------------------------------------- */

mpt_status mpt__nccl_id_bootstrap(mpt_comm *comm, unsigned char id[MPT__NCCL_ID_NBYTES],
                                  int local_failure, double deadline_ms) {
  mpt_status st = MPT_OK;
  int gen_failed = 0;
  memset(id, 0, MPT__NCCL_ID_NBYTES);
  if (comm->rank == 0) {
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
      gen_failed = 1; /* still broadcast (zeros), so the others do not wait for us */
      st = mpt__error(status_of(r), __FILE__, __LINE__, "ncclGetUniqueId failed on rank 0: %s",
                      ncclGetErrorString(r));
    } else {
      memcpy(id, &uid, MPT__NCCL_ID_NBYTES);
    }
  }
  MPI_Request req;
  int done = 0;
  int rc = MPI_Ibcast(id, MPT__NCCL_ID_NBYTES, MPI_BYTE, 0, comm->mpi_comm, &req);
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS)
    return MPT_MPI_FAIL(rc, comm->rank, "MPI_Ibcast of the NCCL unique id");
  if (!done)
    return MPT_FAIL(MPT_ETIMEOUT, "the broadcast of the NCCL unique id did not complete within "
                    "%g s on rank %d (a rank did not reach the NCCL bootstrap)",
                    comm->config.timeout_ms / 1000.0, comm->rank);
  /* The barrier: the lowest failing rank + 1, or 0 when every rank is ready. */
  int mine = (local_failure || gen_failed) ? comm->world_size - comm->rank : 0, worst = 0;
  rc = MPI_Iallreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm->mpi_comm, &req);
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS)
    return MPT_MPI_FAIL(rc, comm->rank, "MPI_Iallreduce (barrier) before NCCL init");
  if (!done)
    return MPT_FAIL(MPT_ETIMEOUT, "the barrier before NCCL init did not complete within %g s on "
                    "rank %d (a rank did not reach the NCCL bootstrap)",
                    comm->config.timeout_ms / 1000.0, comm->rank);
  if (gen_failed) return st;
  if (worst > 0 && !local_failure)
    return MPT_FAIL(MPT_ECOMM, "rank %d could not prepare its side of the NCCL communicator (see "
                    "its own error); rank %d stops too", comm->world_size - worst, comm->rank);
  return MPT_OK;
}

/* This rank's preparation: the device, the ring's events, the barrier scratch. */
static mpt_status prepare_local(mpt__nccl_state *s) {
  const mpt_device dev = s->comm->config.device;
  MPT_RETURN_IF(mpt_device_set_current(dev));
  for (int k = 0; k < MPT__NCCL_RING_SLOTS; k++) {
    cudaError_t e = cudaEventCreateWithFlags(&s->ring[k].done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return MPT_FAIL(MPT_EDEVICE, "cudaEventCreateWithFlags failed on rank %d (cuda:%d): %s",
                      s->comm->rank, s->dev, cudaGetErrorString(e));
    }
  }
  cudaError_t e = cudaEventCreateWithFlags(&s->host_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return MPT_FAIL(MPT_EDEVICE, "cudaEventCreateWithFlags failed on rank %d (cuda:%d): %s",
                    s->comm->rank, s->dev, cudaGetErrorString(e));
  }
  return mpt_device_alloc(dev, sizeof(float), (void **)&s->one);
}

static void state_free(mpt__nccl_state *s) {
  if (!s) return;
  (void)cudaSetDevice(s->dev);
  for (int k = 0; k < MPT__NCCL_RING_SLOTS; k++)
    if (s->ring[k].done) (void)cudaEventDestroy(s->ring[k].done);
  mpt_device_free(s->comm->config.device, s->one);
  if (s->host_done) (void)cudaEventDestroy(s->host_done);
  mpt_device_free(s->comm->config.device, s->scratch);
  mpt__cuda_host_free(s->bounce);
  pthread_cond_destroy(&s->stop_cond);
  pthread_mutex_destroy(&s->stop_mutex);
  pthread_mutex_destroy(&s->mutex);
  pthread_mutex_destroy(&s->host_mutex);
  free(s);
}

static mpt_status nccl_init(mpt_comm *comm) {
  const double deadline_ms = mpt_time_ms() + comm->config.timeout_ms;
  mpt__nccl_state *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the NCCL backend state");
  s->comm = comm;
  s->dev = comm->config.device.index;
  pthread_mutex_init(&s->mutex, NULL);
  pthread_mutex_init(&s->host_mutex, NULL);
  pthread_mutex_init(&s->stop_mutex, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->stop_cond, &ca);
  pthread_condattr_destroy(&ca);
  int saved_dev = -1;
  (void)cudaGetDevice(&saved_dev);
  (void)cudaGetLastError();

  char local_detail[1024] = "";
  mpt_status local = prepare_local(s);
  if (local != MPT_OK) snprintf(local_detail, sizeof local_detail, "%s", mpt_last_error());
  unsigned char id[MPT__NCCL_ID_NBYTES];
  mpt_status st = mpt__nccl_id_bootstrap(comm, id, local != MPT_OK, deadline_ms);
  if (st == MPT_OK && local != MPT_OK) st = mpt_error_set(local, "%s", local_detail);
  if (st != MPT_OK) goto fail;

  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  int expired = 0;
  ncclResult_t r = ncclCommInitRankConfig(&s->nc, comm->world_size, uid, comm->rank, &cfg);
  if (s->nc && (r == ncclSuccess || r == ncclInProgress))
    r = mpt__nccl_settle(s->nc, r, deadline_ms, &expired);
  if (expired) {
    st = MPT_FAIL(MPT_ETIMEOUT, "NCCL communicator creation (%d ranks) did not complete within "
                  "%g s on rank %d (cuda:%d): a rank did not reach it, or the ranks cannot reach "
                  "each other (NCCL_SOCKET_IFNAME, firewalls); the communicator was aborted",
                  comm->world_size, comm->config.timeout_ms / 1000.0, comm->rank, s->dev);
  } else if (r != ncclSuccess) {
    st = MPT_NCCL_ERROR(s, r, "ncclCommInitRankConfig (%d ranks, non-blocking)", comm->world_size);
  }
  if (st != MPT_OK) {
    if (s->nc) (void)ncclCommAbort(s->nc);
    s->nc = NULL;
    goto fail;
  }
  if (mpt__thread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot start the NCCL watchdog thread on rank %d", comm->rank);
    (void)ncclCommAbort(s->nc);
    goto fail;
  }
  s->watchdog_started = 1;
  comm->backend_state = s;
  if (saved_dev >= 0) (void)cudaSetDevice(saved_dev);
  mpt_log(MPT_LOG_DEBUG, "NCCL communicator ready: %d ranks, rank %d on cuda:%d", comm->world_size,
          comm->rank, s->dev);
  return MPT_OK;

fail:
  state_free(s);
  if (saved_dev >= 0) (void)cudaSetDevice(saved_dev);
  return st;
}

static void nccl_free(mpt_comm *comm) {
  mpt__nccl_state *s = comm->backend_state;
  if (!s) return;
  if (s->watchdog_started) {
    pthread_mutex_lock(&s->stop_mutex);
    s->stop = 1;
    pthread_cond_broadcast(&s->stop_cond);
    pthread_mutex_unlock(&s->stop_mutex);
    pthread_join(s->watchdog, NULL);
  }
  pthread_mutex_lock(&s->mutex);
  if (!s->aborted) {
    /* Finalize flushes and waits (non-blocking: polled) until every rank is done with the
     * communicator; a rank that never arrives makes it an abort at the deadline. */
    (void)cudaSetDevice(s->dev);
    int expired = 0;
    ncclResult_t r = ncclCommFinalize(s->nc);
    r = mpt__nccl_settle(s->nc, r, mpt_time_ms() + comm->config.timeout_ms, &expired);
    const char *how = r == ncclSuccess && !expired ? "ncclCommDestroy" : "ncclCommAbort";
    if (r != ncclSuccess || expired)
      mpt_log(MPT_LOG_WARN, "ncclCommFinalize on rank %d (cuda:%d) %s: aborting the communicator",
              comm->rank, s->dev,
              expired ? "did not complete within the timeout" : ncclGetErrorString(r));
    r = r == ncclSuccess && !expired ? ncclCommDestroy(s->nc) : ncclCommAbort(s->nc);
    /* Non-blocking communicators may answer ncclInProgress: the handle is released by NCCL
     * either way (nothing can be polled on it any more). Anything else is reported. */
    if (r != ncclSuccess && r != ncclInProgress)
      mpt_log(MPT_LOG_WARN, "%s on rank %d (cuda:%d) failed: %s", how, comm->rank, s->dev,
              ncclGetErrorString(r));
    s->aborted = 1;
  }
  pthread_mutex_unlock(&s->mutex);
  state_free(s);
  comm->backend_state = NULL;
}

const mpt__comm_backend mpt__comm_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .free = nccl_free,
    .allreduce = mpt__nccl_enqueue,
    .broadcast = mpt__nccl_enqueue,
    .allgather = mpt__nccl_enqueue,
    .barrier = mpt__nccl_enqueue,
    .reduce_scatter = mpt__nccl_enqueue,
    .allgather_shards = mpt__nccl_enqueue,
    .stream_on_device = 1,
    .wait_event = mpt__nccl_wait_event,
};
