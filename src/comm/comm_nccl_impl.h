/* Internals of the NCCL comm backend shared by its two files: comm_nccl.c (errors, the
 * failure checks, the watchdog, bootstrap and lifetime) and comm_nccl_coll.c (the collectives
 * and the waits). Includes nccl.h: private to those two files.
 *
 * Locking: s->mutex guards every NCCL call on s->nc, the ring and s->aborted; the functions
 * named *_locked expect it held. s->host_mutex guards the host-staging scratch and bounce
 * buffers. Lock order: s->host_mutex, s->mutex, then the comm's own mutex
 * (mpt__comm_set_failed), then a stream's. */
#ifndef MPT_COMM_NCCL_IMPL_H
#define MPT_COMM_NCCL_IMPL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>

#include "comm/comm_nccl.h"

enum { MPT__NCCL_RING_SLOTS = 256 };

/* One enqueued collective, tracked until its event completes. */
typedef struct mpt__nccl_tracked {
  mpt__coll coll;
  cudaEvent_t done; /* recorded on the collective's stream right after it */
  double enqueue_ms;
  int live; /* 1 from enqueue until seen complete */
} mpt__nccl_tracked;

typedef struct mpt__nccl_state {
  mpt_comm *comm;
  ncclComm_t nc;
  int dev;
  pthread_mutex_t mutex;
  int aborted; /* nc was aborted (and freed by NCCL): no NCCL call on it any more */
  mpt__nccl_tracked ring[MPT__NCCL_RING_SLOTS];
  int next;      /* slot of the next collective (the oldest tracked one when the ring is full) */
  float *one;    /* device scratch of one float: a barrier is an all-reduce of it */
  pthread_mutex_t host_mutex; /* one collective on host buffers at a time (before s->mutex) */
  void *scratch; /* device staging of collectives on host buffers (grown on demand) */
  size_t scratch_nbytes;
  void *bounce; /* pinned host staging of the same (grown with scratch) */
  size_t bounce_nbytes;
  cudaEvent_t host_done; /* recorded after a host collective's copy out */
  pthread_t watchdog;
  int watchdog_started;
  pthread_mutex_t stop_mutex;
  pthread_cond_t stop_cond; /* CLOCK_MONOTONIC */
  int stop;
} mpt__nccl_state;

/* Records "<what> failed on rank R (cuda:D): <NCCL error name>: <NCCL's last error text>" with
 * the status for `r` (MPT_EDEVICE for CUDA errors, MPT_EINVAL for bad arguments, else
 * MPT_ECOMM). */
mpt_status mpt__nccl_error(const mpt__nccl_state *s, ncclResult_t r, const char *file, int line,
                           const char *fmt, ...) MPT_PRINTF(5, 6);
#define MPT_NCCL_ERROR(s, r, ...) mpt__nccl_error((s), (r), __FILE__, __LINE__, __VA_ARGS__)

/* Sleeps a little longer each call: yields for the first polls, then up to 1 ms. */
void mpt__nccl_backoff(int *polls, long *sleep_ns);

/* Polls a non-blocking communicator until the call that returned `r` is done; returns its
 * outcome, or *expired = 1 when deadline_ms passed first (the call is still in progress). */
ncclResult_t mpt__nccl_settle(ncclComm_t nc, ncclResult_t r, double deadline_ms, int *expired);

/* Locked, with the detail of `st` recorded on this thread: aborts the communicator (once),
 * marks the comm unusable and its own stream failed. Returns st. */
mpt_status mpt__nccl_fail_locked(mpt__nccl_state *s, mpt_status st);

/* Locked: MPT_OK; or the failure found now (an asynchronous NCCL error, a device fault, a
 * tracked collective still incomplete limit_ms after it was enqueued), after which the comm is
 * failed; or the earlier failure, re-raised. */
mpt_status mpt__nccl_check_locked(mpt__nccl_state *s, double limit_ms);

/* comm_nccl_coll.c: the table's collective and wait slots. */
mpt_status mpt__nccl_enqueue(mpt_comm *comm, mpt_stream *stream, const mpt__coll *c);
mpt_status mpt__nccl_wait_event(mpt_comm *comm, mpt_event *event, const mpt__coll *c,
                                double grace_ms);

#endif
