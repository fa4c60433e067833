/* The protocol of a collective on host buffers staged through a device (comm_impl.h
 * mpt__host_stage_run), written without CUDA so that it is tested on the CPU with a stubbed
 * collective (tests/test_host_stage.c); the NCCL backend fills the table (comm_nccl_coll.c).
 *
 * Why: a device-to-pageable-host copy blocks the calling thread until the stream reaches it,
 * i.e. until the collective before it finishes. Issued under the backend's lock, that freezes
 * both the deadline loop and the watchdog (which needs the lock): a peer that never arrives
 * hangs the caller. So the enqueue (copy in, collective, copy out into pinned memory, an event
 * after it) is the only step under the lock; the wait polls the event WITHOUT the lock, takes it
 * only briefly for the failure checks, and gives up at its deadline; the result is copied from
 * the pinned bounce buffer into the caller's buffer after the wait.
 *
 * Runs on the caller's thread. No state. */
#include <sched.h>
#include <time.h>

#include "comm/comm_impl.h"

mpt_status mpt__host_stage_run(pthread_mutex_t *lock, const mpt__host_stage_ops *ops,
                               double deadline_ms) {
  pthread_mutex_lock(lock);
  mpt_status st = ops->enqueue(ops->ctx);
  pthread_mutex_unlock(lock);
  MPT_RETURN_IF(st);
  int polls = 0;
  long sleep_ns = 2000;
  for (;;) {
    mpt_status err = MPT_OK;
    const int done = ops->query(ops->ctx, &err); /* no lock: never blocks */
    if (done < 0) return err;
    if (done > 0) break;
    pthread_mutex_lock(lock);
    st = ops->check(ops->ctx);
    pthread_mutex_unlock(lock);
    MPT_RETURN_IF(st);
    if (mpt_time_ms() >= deadline_ms) {
      pthread_mutex_lock(lock);
      st = ops->expire(ops->ctx);
      pthread_mutex_unlock(lock);
      return st;
    }
    if (polls++ < 100) {
      sched_yield();
    } else {
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 1000000) sleep_ns *= 2;
    }
  }
  ops->copy_out(ops->ctx);
  return MPT_OK;
}
