/* The CPU ops' thread pool (pool.h): one job at a time, a fixed set of chunks claimed by an
 * atomic counter by the caller and the workers, so nothing waits for a worker that the
 * scheduler has not run yet (on a machine shared with other jobs it may be late by
 * milliseconds: the caller then does all the chunks).
 *
 * Protocol (C11 sequentially consistent atomics throughout). The caller owns the job fields
 * while it holds `busy`: it writes them, opens the job (closed = 0), bumps `gen`, and wakes the
 * sleeping workers; claims chunks; waits until `done` counts every chunk; closes the job; and
 * waits until no worker is `active` before it lets go of `busy` (so no worker reads the fields
 * of the next job half-written). A worker that sees a new `gen` increments `active`, then reads
 * `closed`: open, it claims chunks until none is left; closed, it leaves. Sleeping: a worker
 * increments `sleepers` and re-reads `gen` under `lock` before waiting; the caller bumps `gen`
 * before reading `sleepers`, and broadcasts under `lock`, so a wake-up cannot be lost (the wait
 * is timed anyway, 100 ms, and re-checks). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "core/cpu/pool.h"
#include "core/threads.h"
#include "mpitrain/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

enum { MAX_WORKERS = 63 };
#define WORKER_SLEEP_NS 100000000L /* one timed wait of a sleeping worker */

static struct {
  pthread_mutex_t busy; /* held by the caller of the current job */
  pthread_mutex_t lock; /* with cond: sleeping workers */
  pthread_cond_t cond;
  int nworkers; /* started (under busy) */
  /* the job, written by its caller under busy while closed */
  mpt__cpu_range_fn fn;
  void *arg;
  int64_t n, chunk, nchunks;
  int want; /* workers 1..want take part */
  atomic_uint_fast64_t gen;
  atomic_int closed, active, sleepers;
  atomic_int_fast64_t next, done;
  atomic_int_fast64_t worker_chunks;
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .cond = PTHREAD_COND_INITIALIZER,
          .closed = 1};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The child of fork() has none of the parent's workers. */
static void pool_atfork_child(void) {
  pthread_mutex_init(&pool.busy, NULL);
  pthread_mutex_init(&pool.lock, NULL);
  pthread_cond_init(&pool.cond, NULL);
  pool.nworkers = 0;
  atomic_store(&pool.closed, 1);
  atomic_store(&pool.active, 0);
  atomic_store(&pool.sleepers, 0);
}

static void pool_atfork_register(void) { pthread_atfork(NULL, NULL, pool_atfork_child); }

/* Claims and runs chunks of the open job until none is left; returns how many it ran. */
static int64_t run_chunks(void) {
  int64_t ran = 0;
  for (;;) {
    const int64_t i = atomic_fetch_add(&pool.next, 1);
    if (i >= pool.nchunks) break;
    const int64_t b = i * pool.chunk, e = b + pool.chunk < pool.n ? b + pool.chunk : pool.n;
    pool.fn(pool.arg, b, e);
    atomic_fetch_add(&pool.done, 1);
    ran++;
  }
  return ran;
}

/* Waits until gen differs from `seen`, asleep: no spinning, which measured slower (a worker
 * spinning 20 us after each job took the core from OpenBLAS's next GEMM: the default MLP at 2
 * threads ran 0.91x instead of 0.98x; libgomp's spinning made PyTorch 8x slower on this shared
 * machine, bench/README.md). Returns the new gen. */
static uint64_t worker_wait(uint64_t seen) {
  pthread_mutex_lock(&pool.lock);
  atomic_fetch_add(&pool.sleepers, 1);
  uint64_t g;
  while ((g = atomic_load(&pool.gen)) == seen) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WORKER_SLEEP_NS;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&pool.cond, &pool.lock, &ts);
  }
  atomic_fetch_sub(&pool.sleepers, 1);
  pthread_mutex_unlock(&pool.lock);
  return g;
}

static void *worker_main(void *varg) {
  const int index = (int)(intptr_t)varg; /* 1, 2, ... */
  uint64_t seen = 0;
  for (;;) {
    seen = worker_wait(seen);
    atomic_fetch_add(&pool.active, 1);
    if (!atomic_load(&pool.closed) && index <= pool.want)
      atomic_fetch_add(&pool.worker_chunks, run_chunks());
    atomic_fetch_sub(&pool.active, 1);
  }
  return NULL;
}

/* Starts workers up to `want` (under busy); fewer if the system refuses threads. */
static void pool_grow(int want) {
  pthread_once(&atfork_once, pool_atfork_register);
  while (pool.nworkers < want) {
    pthread_attr_t attr;
    pthread_t th;
    if (pthread_attr_init(&attr) != 0) break;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    /* the asynchronous signals blocked (core/threads.h): signals go to the program's threads */
    const int rc = mpt__thread_create(&th, &attr, worker_main,
                                      (void *)(intptr_t)(pool.nworkers + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0) break;
    pool.nworkers++;
  }
}

static void run_serial(int64_t n, int64_t chunk, mpt__cpu_range_fn fn, void *arg) {
  for (int64_t b = 0; b < n; b += chunk) fn(arg, b, b + chunk < n ? b + chunk : n);
}

void mpt__cpu_parallel_for(int64_t n, int64_t chunk, mpt__cpu_range_fn fn, void *arg) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  int threads = mpt_cpu_threads();
  if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
  if (threads <= 1 || nchunks <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
    run_serial(n, chunk, fn, arg);
    return;
  }
  if (pool.nworkers < threads - 1) pool_grow(threads - 1);
  if (pool.nworkers == 0) {
    pthread_mutex_unlock(&pool.busy);
    run_serial(n, chunk, fn, arg);
    return;
  }
  pool.fn = fn;
  pool.arg = arg;
  pool.n = n;
  pool.chunk = chunk;
  pool.nchunks = nchunks;
  pool.want = threads - 1;
  atomic_store(&pool.next, 0);
  atomic_store(&pool.done, 0);
  atomic_store(&pool.closed, 0);
  atomic_fetch_add(&pool.gen, 1);
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.lock);
    pthread_cond_broadcast(&pool.cond);
    pthread_mutex_unlock(&pool.lock);
  }
  run_chunks();
  /* the chunks still running are a worker's, already started: wait for them */
  for (int k = 0; atomic_load(&pool.done) < nchunks; k++) {
    POOL_PAUSE();
    if (k > 256) sched_yield(); /* it may share this core */
  }
  atomic_store(&pool.closed, 1);
  for (int k = 0; atomic_load(&pool.active) > 0; k++) {
    POOL_PAUSE();
    if (k > 256) sched_yield();
  }
  pthread_mutex_unlock(&pool.busy);
}

/* About 10 us of work per chunk, and no split under 5 of them. */
#define CHUNK_PS 1e7
enum { MIN_CHUNKS = 5 };

int64_t mpt__cpu_parallel_chunk(int64_t n, int64_t grain) {
  if (grain < 1) grain = 1;
  const int threads = mpt_cpu_threads();
  if (threads <= 1 || n < MIN_CHUNKS * grain) return n > 0 ? n : 1;
  const int64_t c = (n + 4 * (int64_t)threads - 1) / (4 * (int64_t)threads);
  return c > grain ? c : grain;
}

int64_t mpt__cpu_parallel_chunk_ps(int64_t n, double item_ps, int64_t align, int even) {
  const double g = item_ps > 0.0 ? CHUNK_PS / item_ps : CHUNK_PS;
  const int64_t grain = g < 1.0 ? 1 : g > 1e15 ? (int64_t)1e15 : (int64_t)g;
  int64_t c = mpt__cpu_parallel_chunk(n, grain);
  if (c >= n) return n > 0 ? n : 1;
  if (even) {
    const int threads = mpt_cpu_threads();
    c = (n + threads - 1) / threads;
  }
  if (align > 1) c = (c + align - 1) / align * align;
  return c < n ? c : n;
}

int mpt__cpu_parallel_would_split(int64_t n, int64_t chunk) {
  return chunk >= 1 && n > chunk && mpt_cpu_threads() > 1;
}

int64_t mpt__cpu_pool_worker_chunks(void) { return atomic_load(&pool.worker_chunks); }
