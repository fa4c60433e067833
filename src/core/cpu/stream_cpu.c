/* CPU streams and events.
 *
 * An inline stream runs work on the calling thread: launching a host function runs it now, and
 * recording an event completes it at once. A worker stream owns one thread that takes work from
 * an in-order queue (host functions, event records, event waits); the communication layer uses
 * it so that an all-reduce runs while the caller keeps computing. The worker blocks the
 * asynchronous signals (core/threads.h).
 *
 * Invariants: an event is complete when `completed >= recorded` (generation counters, so a
 * re-record resets it). A stream that failed (a host function returned non-zero, or a wait
 * expired) keeps that status ("sticky"), skips later host functions, and hands the status and
 * its detail text to everything that waits on it. Queue items come from a per-stream free list,
 * so the steady state does not allocate. An abandoned stream (mpt_stream_abandon) is never
 * freed: its detached worker exits after the item it is running, without running more.
 *
 * Foreign events (another backend's, e.g. a CUDA event recorded on a compute stream, which the
 * comm worker waits for before staging a device buffer): an inline stream waits with
 * mpt_event_synchronize(event, timeout) on the caller's thread; a worker stream queues a wait
 * that runs mpt_event_synchronize(event, timeout) on the worker when it is reached (the owning
 * backend polls its event with the deadline and reports its stream's status). Such a wait is for
 * the event's record current when the wait was ENQUEUED (mpt__event_capture), not a later
 * re-record, as a CUDA stream's wait on a CPU event is.
 * A CPU event cannot be recorded on another backend's stream (MPT_EINVAL).
 *
 * Kept work (core/keeper.h): a host function launched with a keeper publishes it in
 * s->run_keeper while it runs. Every wait on the stream, or on an event whose latest record is
 * pending on it (ev->stream), asks that keeper how long it may still wait and returns the
 * keeper's error once the work is past its deadline, even a wait without a deadline of its own.
 * An event wait on a worker stream with no kept work running looks again every KEEPER_POLL_MS,
 * since kept work may start behind the current item without signalling the event. Lock order:
 * event, then stream, then whatever the keeper takes; nothing holds a stream's lock while taking
 * an event's. ev->stream is only read while the event is pending, when the stream is alive (a
 * freed stream drained its queue first; an abandoned one is leaked). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu/cpu.h"
#include "mpitrain/core.h"
#include "core/threads.h"

enum { WORK_HOST, WORK_RECORD, WORK_WAIT, WORK_WAIT_FOREIGN };

/* How often an event wait on a worker stream without kept work running looks for some. */
#define KEEPER_POLL_MS 50.0

typedef struct work_item {
  int kind;
  mpt_host_fn fn;
  void *arg;
  mpt_event *event;
  uint64_t generation;
  double timeout_ms;
  mpt__keeper_fn keeper; /* WORK_HOST: NULL, or the keeper of its deadline (core/keeper.h) */
  void *keeper_arg;
  struct work_item *next;
} work_item;

struct mpt_stream {
  mpt__stream_header h;
  pthread_mutex_t mutex;
  pthread_cond_t cond; /* signalled on new work, on completion, and on stop */
  pthread_t thread;
  int has_thread;
  work_item *head, *tail, *free_list;
  uint64_t enqueued, finished; /* work items pushed and completed */
  int stop;
  int abandoned; /* mpt_stream_abandon: the worker exits after its current item, running nothing */
  mpt_status error;
  char detail[1024];
  mpt__keeper_fn run_keeper; /* the keeper of the host function now running, or NULL */
  void *run_keeper_arg;
};

struct mpt_event {
  mpt__event_header h;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint64_t recorded, completed;
  mpt_stream *stream; /* the worker stream of the latest record (NULL: inline); see above */
  mpt_status status;
  double time_ms;
  char detail[1024];
};

/* Absolute CLOCK_REALTIME deadline for pthread_cond_timedwait. */
static struct timespec deadline_after(double timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long long ns = (long long)(timeout_ms * 1e6);
  ts.tv_sec += ns / 1000000000LL;
  ts.tv_nsec += ns % 1000000000LL;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

static void event_complete(mpt_event *ev, uint64_t generation, mpt_status status,
                           const char *detail) {
  pthread_mutex_lock(&ev->mutex);
  if (generation > ev->completed) ev->completed = generation;
  ev->status = status;
  ev->time_ms = mpt_time_ms();
  if (status != MPT_OK && detail) snprintf(ev->detail, sizeof ev->detail, "%s", detail);
  pthread_cond_broadcast(&ev->cond);
  pthread_mutex_unlock(&ev->mutex);
}

/* Waits on cond for at most wait_ms (INFINITY: no limit). */
static void cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *mutex, double wait_ms) {
  if (isinf(wait_ms)) {
    pthread_cond_wait(cond, mutex);
  } else {
    struct timespec dl = deadline_after(wait_ms);
    pthread_cond_timedwait(cond, mutex, &dl);
  }
}

/* With s->mutex held: how long a waiter on s may still wait for the kept work now running
 * (INFINITY when none runs), or the keeper's error (its detail set on this thread). */
static mpt_status keeper_ask(mpt_stream *s, double *left_ms) {
  *left_ms = INFINITY;
  if (!s->run_keeper) return MPT_OK;
  double left = 0;
  mpt_status st = s->run_keeper(s->run_keeper_arg, &left);
  if (st == MPT_OK) *left_ms = left > 1 ? left : 1;
  return st;
}

/* Waits until ev reaches `generation`. Returns the event's status, or MPT_ETIMEOUT with
 * *expired set when this wait itself ran out (expired may be NULL), or the error of the keeper
 * of the work the event is pending behind (detail copied, *expired untouched). */
static mpt_status event_wait_generation(mpt_event *ev, uint64_t generation, double timeout_ms,
                                        char *detail, size_t detail_nbytes, int *expired) {
  mpt_status st = MPT_OK;
  const double end_ms = timeout_ms < 0 ? INFINITY : mpt_time_ms() + timeout_ms;
  pthread_mutex_lock(&ev->mutex);
  while (ev->completed < generation) {
    double wait_ms = end_ms - mpt_time_ms();
    if (wait_ms <= 0) {
      pthread_mutex_unlock(&ev->mutex);
      if (expired) *expired = 1;
      if (detail)
        snprintf(detail, detail_nbytes, "event not completed within %.0f ms", timeout_ms);
      return MPT_ETIMEOUT;
    }
    if (ev->stream && ev->completed < ev->recorded) { /* pending on a worker stream */
      mpt_stream *s = ev->stream;
      double left_ms;
      pthread_mutex_lock(&s->mutex);
      mpt_status kst = keeper_ask(s, &left_ms);
      pthread_mutex_unlock(&s->mutex);
      if (kst != MPT_OK) {
        pthread_mutex_unlock(&ev->mutex);
        if (detail) snprintf(detail, detail_nbytes, "%s", mpt_last_error());
        return kst;
      }
      if (isinf(left_ms)) left_ms = KEEPER_POLL_MS; /* no kept work yet: look again soon */
      if (left_ms < wait_ms) wait_ms = left_ms;
    }
    cond_wait_ms(&ev->cond, &ev->mutex, wait_ms);
  }
  st = ev->status;
  if (st != MPT_OK && detail) snprintf(detail, detail_nbytes, "%s", ev->detail);
  pthread_mutex_unlock(&ev->mutex);
  return st;
}

/* Worker thread: runs the queue in order until stopped and drained. */
static void *stream_worker(void *arg) {
  mpt_stream *s = arg;
  pthread_mutex_lock(&s->mutex);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cond, &s->mutex);
    if (s->abandoned || (!s->head && s->stop)) break;
    work_item *w = s->head;
    s->head = w->next;
    if (!s->head) s->tail = NULL;
    mpt_status failed = s->error;
    if (w->kind == WORK_HOST && failed == MPT_OK && w->keeper) {
      s->run_keeper = w->keeper;
      s->run_keeper_arg = w->keeper_arg;
      pthread_cond_broadcast(&s->cond); /* a stream wait without a deadline now has one */
    }
    pthread_mutex_unlock(&s->mutex);

    mpt_status st = MPT_OK;
    char detail[1024] = "";
    switch (w->kind) {
      case WORK_HOST:
        if (failed == MPT_OK) {
          mpt_error_clear();
          st = w->fn(w->arg);
          if (st != MPT_OK) snprintf(detail, sizeof detail, "%s", mpt_last_error());
        }
        break;
      case WORK_RECORD:
        pthread_mutex_lock(&s->mutex);
        snprintf(detail, sizeof detail, "%s", s->detail);
        pthread_mutex_unlock(&s->mutex);
        event_complete(w->event, w->generation, failed, detail);
        break;
      case WORK_WAIT:
        if (failed == MPT_OK)
          st = event_wait_generation(w->event, w->generation, w->timeout_ms, detail,
                                     sizeof detail, NULL);
        break;
      case WORK_WAIT_FOREIGN: /* the record captured at enqueue (generation = its token) */
        if (failed == MPT_OK) {
          mpt_error_clear();
          st = mpt__event_wait_captured(w->event, w->generation, w->timeout_ms);
          if (st != MPT_OK) snprintf(detail, sizeof detail, "%s", mpt_last_error());
        } else {
          (void)mpt__event_wait_captured(w->event, w->generation, 0); /* releases the token */
        }
        break;
    }

    pthread_mutex_lock(&s->mutex);
    /* Abandoned: the owner gave up on us, touch nothing else (the item leaks). A keeper stays
     * published, so waits on the dropped work end with its error instead of hanging. */
    if (s->abandoned) break;
    s->run_keeper = NULL;
    s->run_keeper_arg = NULL;
    if (st != MPT_OK && s->error == MPT_OK) {
      s->error = st;
      snprintf(s->detail, sizeof s->detail, "%s", detail);
    }
    w->next = s->free_list;
    s->free_list = w;
    s->finished++;
    pthread_cond_broadcast(&s->cond);
  }
  pthread_mutex_unlock(&s->mutex);
  return NULL;
}

mpt_status mpt__cpu_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind) {
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* a bad MPT_CPU_ISA (isa.c) */
  mpt_stream *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a stream");
  s->h.device = device;
  s->h.kind = kind;
  pthread_mutex_init(&s->mutex, NULL);
  pthread_cond_init(&s->cond, NULL);
  if (kind == MPT_STREAM_WORKER) {
    if (mpt__thread_create(&s->thread, NULL, stream_worker, s) != 0) {
      pthread_cond_destroy(&s->cond);
      pthread_mutex_destroy(&s->mutex);
      free(s);
      return MPT_FAIL(MPT_EDEVICE, "cannot start the stream's worker thread");
    }
    s->has_thread = 1;
  }
  *stream = s;
  return MPT_OK;
}

void mpt__cpu_stream_free(mpt_stream *s) {
  if (!s) return;
  if (s->has_thread) {
    pthread_mutex_lock(&s->mutex);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    pthread_join(s->thread, NULL);
  }
  work_item *w = s->free_list;
  while (w) {
    work_item *next = w->next;
    free(w);
    w = next;
  }
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->mutex);
  free(s);
}

void mpt__cpu_stream_abandon(mpt_stream *s) {
  if (!s) return;
  if (!s->has_thread) return; /* inline: nothing runs behind the caller's back; leaked */
  pthread_mutex_lock(&s->mutex);
  s->abandoned = 1;
  s->stop = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mutex);
  pthread_detach(s->thread);
  /* s, its queue and its free list stay allocated: the worker may be inside a host function
   * that never returns, or return later and lock s->mutex once more before exiting. */
}

/* Appends an item to a worker stream's queue (caller does not hold the lock). */
static mpt_status stream_push(mpt_stream *s, int kind, mpt_host_fn fn, void *arg, mpt_event *ev,
                              uint64_t generation, double timeout_ms, mpt__keeper_fn keeper,
                              void *keeper_arg) {
  pthread_mutex_lock(&s->mutex);
  work_item *w = s->free_list;
  if (w)
    s->free_list = w->next;
  else if (!(w = malloc(sizeof *w))) {
    pthread_mutex_unlock(&s->mutex);
    return MPT_FAIL(MPT_ENOMEM, "cannot queue work on a stream");
  }
  *w = (work_item){kind, fn, arg, ev, generation, timeout_ms, keeper, keeper_arg, NULL};
  if (s->tail)
    s->tail->next = w;
  else
    s->head = w;
  s->tail = w;
  s->enqueued++;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mutex);
  return MPT_OK;
}

/* Re-raises a stream's sticky error on the calling thread. */
static mpt_status stream_raise(mpt_stream *s) {
  pthread_mutex_lock(&s->mutex);
  mpt_status st = s->error;
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", s->detail);
  pthread_mutex_unlock(&s->mutex);
  if (st != MPT_OK) mpt_error_set(st, "%s", detail);
  return st;
}

mpt_status mpt__cpu_stream_launch_host(mpt_stream *s, mpt_host_fn fn, void *arg) {
  return mpt__cpu_stream_launch_host_kept(s, fn, arg, NULL, NULL);
}

/* An inline stream runs fn on the caller's thread: nobody can wait on it meanwhile, so the
 * keeper has nothing to do there. */
mpt_status mpt__cpu_stream_launch_host_kept(mpt_stream *s, mpt_host_fn fn, void *arg,
                                            mpt__keeper_fn keeper, void *keeper_arg) {
  if (s->h.kind == MPT_STREAM_INLINE) {
    if (s->error != MPT_OK) return stream_raise(s);
    mpt_status st = fn(arg);
    if (st != MPT_OK) {
      s->error = st;
      snprintf(s->detail, sizeof s->detail, "%s", mpt_last_error());
    }
    return st;
  }
  mpt_status st = stream_raise(s);
  if (st != MPT_OK) return st;
  return stream_push(s, WORK_HOST, fn, arg, NULL, 0, 0, keeper, keeper_arg);
}

/* Kept work starting is seen without polling: the worker signals s->cond when it starts some. */
mpt_status mpt__cpu_stream_synchronize(mpt_stream *s, double timeout_ms) {
  if (s->h.kind == MPT_STREAM_INLINE) return stream_raise(s);
  const double end_ms = timeout_ms < 0 ? INFINITY : mpt_time_ms() + timeout_ms;
  pthread_mutex_lock(&s->mutex);
  uint64_t target = s->enqueued;
  while (s->finished < target) {
    double wait_ms = end_ms - mpt_time_ms(), left_ms;
    if (wait_ms <= 0) {
      uint64_t pending = target - s->finished;
      pthread_mutex_unlock(&s->mutex);
      return MPT_FAIL(MPT_ETIMEOUT, "stream did not drain within %.0f ms (%llu items pending)",
                      timeout_ms, (unsigned long long)pending);
    }
    mpt_status kst = keeper_ask(s, &left_ms);
    if (kst != MPT_OK) {
      pthread_mutex_unlock(&s->mutex);
      return kst;
    }
    cond_wait_ms(&s->cond, &s->mutex, left_ms < wait_ms ? left_ms : wait_ms);
  }
  pthread_mutex_unlock(&s->mutex);
  return stream_raise(s);
}

mpt_status mpt__cpu_stream_error(const mpt_stream *s) {
  mpt_stream *m = (mpt_stream *)s;
  pthread_mutex_lock(&m->mutex);
  mpt_status st = m->error;
  pthread_mutex_unlock(&m->mutex);
  return st;
}

static int event_is_foreign(const mpt_event *ev) {
  return ((const mpt__event_header *)ev)->device.type != MPT_DEVICE_CPU;
}

mpt_status mpt__cpu_stream_wait_event(mpt_stream *s, mpt_event *ev, double timeout_ms) {
  if (event_is_foreign(ev)) {
    if (s->h.kind == MPT_STREAM_INLINE) return mpt_event_synchronize(ev, timeout_ms);
    mpt_status st = stream_raise(s);
    if (st != MPT_OK) return st;
    uint64_t token = 0;
    MPT_RETURN_IF(mpt__event_capture(ev, &token));
    st = stream_push(s, WORK_WAIT_FOREIGN, NULL, NULL, ev, token, timeout_ms, NULL, NULL);
    if (st != MPT_OK) (void)mpt__event_wait_captured(ev, token, 0);
    return st;
  }
  pthread_mutex_lock(&ev->mutex);
  uint64_t generation = ev->recorded;
  pthread_mutex_unlock(&ev->mutex);
  if (s->h.kind == MPT_STREAM_INLINE) {
    char detail[1024] = "";
    int expired = 0;
    mpt_status st =
        event_wait_generation(ev, generation, timeout_ms, detail, sizeof detail, &expired);
    if (expired) return MPT_FAIL(st, "%s", detail);
    if (st != MPT_OK) mpt_error_set(st, "%s", detail);
    return st;
  }
  return stream_push(s, WORK_WAIT, NULL, NULL, ev, generation, timeout_ms, NULL, NULL);
}

mpt_status mpt__cpu_event_init(mpt_event **event, mpt_device device) {
  mpt_event *ev = calloc(1, sizeof *ev);
  if (!ev) return MPT_FAIL(MPT_ENOMEM, "cannot allocate an event");
  ev->h.device = device;
  pthread_mutex_init(&ev->mutex, NULL);
  pthread_cond_init(&ev->cond, NULL);
  ev->time_ms = mpt_time_ms();
  *event = ev;
  return MPT_OK;
}

void mpt__cpu_event_free(mpt_event *ev) {
  if (!ev) return;
  pthread_cond_destroy(&ev->cond);
  pthread_mutex_destroy(&ev->mutex);
  free(ev);
}

mpt_status mpt__cpu_event_record(mpt_event *ev, mpt_stream *s) {
  if (s->h.device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_EINVAL, "event_record: a cpu event cannot be recorded on a stream of "
                    "device type %d (create the event on the stream's device)",
                    (int)s->h.device.type);
  pthread_mutex_lock(&ev->mutex);
  uint64_t generation = ++ev->recorded;
  ev->stream = s->h.kind == MPT_STREAM_INLINE ? NULL : s;
  pthread_mutex_unlock(&ev->mutex);
  if (s->h.kind == MPT_STREAM_INLINE) {
    event_complete(ev, generation, s->error, s->detail);
    return MPT_OK;
  }
  return stream_push(s, WORK_RECORD, NULL, NULL, ev, generation, 0, NULL, NULL);
}

mpt_status mpt__cpu_event_capture(mpt_event *ev, uint64_t *token) {
  pthread_mutex_lock(&ev->mutex);
  *token = ev->recorded;
  pthread_mutex_unlock(&ev->mutex);
  return MPT_OK;
}

mpt_status mpt__cpu_event_wait_captured(mpt_event *ev, uint64_t token, double timeout_ms) {
  char detail[1024] = "";
  int expired = 0;
  const mpt_status st =
      event_wait_generation(ev, token, timeout_ms, detail, sizeof detail, &expired);
  if (st != MPT_OK) return mpt_error_set(st, "%s", detail);
  return MPT_OK;
}

mpt_status mpt__cpu_event_synchronize(mpt_event *ev, double timeout_ms) {
  pthread_mutex_lock(&ev->mutex);
  uint64_t generation = ev->recorded;
  pthread_mutex_unlock(&ev->mutex);
  char detail[1024] = "";
  int expired = 0;
  mpt_status st =
      event_wait_generation(ev, generation, timeout_ms, detail, sizeof detail, &expired);
  if (expired) return MPT_FAIL(st, "%s", detail);
  if (st != MPT_OK) mpt_error_set(st, "%s", detail);
  return st;
}

int mpt__cpu_event_query(mpt_event *ev) {
  pthread_mutex_lock(&ev->mutex);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&ev->mutex);
  return done;
}

mpt_status mpt__cpu_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms) {
  if (!mpt__cpu_event_query(start) || !mpt__cpu_event_query(end))
    return MPT_FAIL(MPT_ESTATE, "elapsed time asked of an event that has not completed");
  *ms = end->time_ms - start->time_ms;
  return MPT_OK;
}
