/* Chrome trace recording: a fixed-capacity array of complete ("X") events under a mutex, written
 * as JSON array elements. Times are microseconds relative to the first mpt_trace_init in the
 * process (ranks started together by mpirun line up to within launch skew). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpitrain/core.h"

typedef struct trace_event {
  const char *name;
  int tid;
  double start_ms, dur_ms;
  int64_t arg;
} trace_event;

struct mpt_trace {
  pthread_mutex_t mutex;
  int rank;
  trace_event *events;
  int64_t capacity, count, dropped;
  double origin_ms;
};

mpt_status mpt_trace_init(mpt_trace **trace, int rank, int64_t capacity) {
  if (!trace || capacity < 1) return MPT_FAIL(MPT_EINVAL, "bad trace arguments");
  mpt_trace *t = calloc(1, sizeof *t);
  if (!t) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a trace");
  t->events = malloc((size_t)capacity * sizeof *t->events);
  if (!t->events) {
    free(t);
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate %" PRId64 " trace events", capacity);
  }
  pthread_mutex_init(&t->mutex, NULL);
  t->rank = rank;
  t->capacity = capacity;
  t->origin_ms = 0; /* absolute monotonic time: same clock on every rank of one host */
  *trace = t;
  return MPT_OK;
}

void mpt_trace_free(mpt_trace *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mutex);
  free(t->events);
  free(t);
}

void mpt_trace_add(mpt_trace *t, const char *name, int tid, double start_ms, double dur_ms,
                   int64_t arg) {
  if (!t) return;
  pthread_mutex_lock(&t->mutex);
  if (t->count < t->capacity)
    t->events[t->count++] = (trace_event){name, tid, start_ms, dur_ms, arg};
  else
    t->dropped++;
  pthread_mutex_unlock(&t->mutex);
}

int64_t mpt_trace_count(const mpt_trace *t) { return t ? t->count : 0; }

int64_t mpt_trace_dropped(mpt_trace *t) {
  if (!t) return 0;
  pthread_mutex_lock(&t->mutex);
  int64_t n = t->dropped;
  pthread_mutex_unlock(&t->mutex);
  return n;
}

mpt_status mpt_trace_append(mpt_trace *t, const char *path, int first, int last) {
  FILE *f = fopen(path, first ? "w" : "a");
  if (!f) return MPT_FAIL(MPT_EIO, "cannot open trace file '%s'", path);
  if (first) fprintf(f, "[\n");
  static const char *lanes[] = {"compute", "communication"};
  pthread_mutex_lock(&t->mutex);
  fprintf(f,
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n",
          t->rank, t->rank);
  int max_tid = 1;
  for (int64_t i = 0; i < t->count; i++)
    if (t->events[i].tid > max_tid) max_tid = t->events[i].tid;
  for (int tid = 0; tid <= max_tid; tid++) { /* lanes 2.. are DataParallel devices */
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"", t->rank, tid);
    if (tid < 2) fprintf(f, "%s\"}},\n", lanes[tid]);
    else fprintf(f, "device %d\"}},\n", tid - 2);
  }
  for (int64_t i = 0; i < t->count; i++) {
    const trace_event *e = &t->events[i];
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
            e->name, t->rank, e->tid, (e->start_ms - t->origin_ms) * 1e3, e->dur_ms * 1e3);
    if (e->arg >= 0) fprintf(f, ",\"args\":{\"n\":%" PRId64 "}", e->arg);
    fprintf(f, "}%s\n", (last && i == t->count - 1) ? "" : ",");
  }
  if (last && t->count == 0) fprintf(f, "{}\n");
  pthread_mutex_unlock(&t->mutex);
  if (last) fprintf(f, "]\n");
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return MPT_FAIL(MPT_EIO, "cannot write trace file '%s'", path);
  return MPT_OK;
}
