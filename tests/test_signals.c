/* Tests of the library's threads and the signals they take (src/core/threads.c, threads.h).
 *
 * - A signal handled while the CPU GEMMs run must not corrupt the heap. oneDNN's fp32 JIT
 *   kernels move the stack pointer into a workspace on the heap, and a handler taken there
 *   writes its frame over malloc's chunk headers: with a timer's SIGALRM every 100 us (a handler
 *   without an alternate stack, as the program's preemption handler had) glibc aborted in
 *   free() within a second of the MLP trainer's GEMMs, at one thread and at two. The GEMMs run
 *   with the asynchronous signals blocked, so none is handled inside them; the products are
 *   checked (exact: sums of ones) and the caller's mask is the same afterwards.
 * - Every thread the library starts blocks SIGTERM, SIGUSR1, SIGUSR2 and SIGINT, so that a
 *   process-directed signal goes to the program's own thread: the comm stream's worker, the
 *   loader's prefetch thread, the CPU ops' pool, the DataParallel replicas, the OpenMP team of
 *   the GEMMs and OpenBLAS's added workers (each thread that appeared is read in
 *   /proc/self/task/TID/status).
 *
 * Check forks a child per test (the default), so each test starts with the threads of a fresh
 * process. */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/cpu/pool.h"
#include "mpitrain/data.h"
#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "check_util.h"


static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a signal storm during the GEMMs ---- */

static volatile sig_atomic_t alarms;

static void on_alarm(int sig) {
  (void)sig;
  alarms++;
}

static float *ones(int64_t n) {
  float *x = malloc((size_t)n * sizeof *x);
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
  return x;
}

/* Blocks of a few KiB around oneDNN's workspace on the heap, each filled with its own byte:
 * a frame written over one shows as a changed byte even where malloc does not notice. */
enum { RING = 48 };

typedef struct ring {
  unsigned char *p[RING];
  size_t nbytes[RING];
  unsigned next;
} ring;

static void ring_put(ring *r, unsigned i, unsigned seed) {
  r->nbytes[i] = 512 + (size_t)(seed * 2654435761u % 24576u);
  r->p[i] = malloc(r->nbytes[i]);
  ck_assert_ptr_nonnull(r->p[i]);
  memset(r->p[i], (int)(i & 0xff), r->nbytes[i]);
}

/* Checks and frees block i. */
static void ring_take(ring *r, unsigned i) {
  size_t b = 0; /* one assertion per block: Check records each one (a write in fork mode) */
  while (b < r->nbytes[i] && r->p[i][b] == (unsigned char)(i & 0xff)) b++;
  ck_assert_msg(b == r->nbytes[i], "heap block %u (%zu bytes) was overwritten at byte %zu", i,
                r->nbytes[i], b);
  free(r->p[i]);
}

/* The default MLP's GEMMs at batch 64 (784-512-512-10): forward, weight gradient (A^T B) and
 * input gradient (A B^T), fresh buffers each round and a few blocks of the ring replaced, so
 * that the heap around oneDNN's workspace changes, for `seconds` under a SIGALRM every 100 us. */
static void gemm_storm(int threads, double seconds) {
  OK(mpt_cpu_set_threads(threads));
  mpt_stream *s = NULL;
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_INLINE));
  sigset_t before, after;
  pthread_sigmask(SIG_BLOCK, NULL, &before);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  ck_assert_int_eq(sigaction(SIGALRM, &sa, NULL), 0);
  alarms = 0;
  struct itimerval it = {{0, 100}, {0, 100}};
  ck_assert_int_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
  const int64_t m = 64, k = 784, n = 512;
  ring r = {.next = 0};
  for (unsigned i = 0; i < RING; i++) ring_put(&r, i, i);
  long rounds = 0;
  /* at least 20 rounds (an AddressSanitizer build is several times slower), at most 20 x as
   * long as asked */
  const double t0 = now_s();
  for (double t = t0; (t < t0 + seconds || rounds < 20) && t < t0 + 20 * seconds; rounds++) {
    for (int j = 0; j < 4; j++, r.next = (r.next + 1) % RING) {
      ring_take(&r, r.next);
      ring_put(&r, r.next, (unsigned)rounds * 7u + (unsigned)j);
    }
    float *x = ones(m * k), *w = ones(k * n), *y = ones(m * n), *dw = ones(k * n),
          *dx = ones(m * k);
    OK(mpt_op_gemm(s, 0, 0, m, n, k, 1.0f, x, k, w, n, 0.0f, y, n)); /* y = x w: k each */
    OK(mpt_op_gemm(s, 1, 0, k, n, m, 1.0f, x, k, y, n, 0.0f, dw, n)); /* x^T y: m k each */
    OK(mpt_op_gemm(s, 0, 1, m, k, n, 1.0f, y, n, w, n, 0.0f, dx, k)); /* y w^T: n k each */
    ck_assert(y[0] == (float)k && y[m * n - 1] == (float)k);
    ck_assert(dw[0] == (float)(m * k) && dw[k * n - 1] == (float)(m * k));
    ck_assert(dx[0] == (float)(n * k) && dx[m * k - 1] == (float)(n * k));
    free(x);
    free(w);
    free(y);
    free(dw);
    free(dx);
    t = now_s();
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  for (unsigned i = 0; i < RING; i++) ring_take(&r, i);
  pthread_sigmask(SIG_BLOCK, NULL, &after);
  for (int sig = 1; sig < NSIG; sig++)
    ck_assert_msg(sigismember(&before, sig) == sigismember(&after, sig),
                  "signal %d: the caller's mask changed across the GEMMs", sig);
  printf("%d thread(s): %d signals over %ld rounds of 3 GEMMs in %.1f s\n", threads, (int)alarms,
         rounds, now_s() - t0);
  /* the storm really happened: hundreds of signals over at least 20 rounds */
  ck_assert_msg(alarms > 100 && rounds >= 20, "%d signals over %ld rounds", (int)alarms, rounds);
  mpt_stream_free(s);
}

/* MPT_TEST_STORM_S: seconds of each storm (default 1.5) */
static double storm_s(void) {
  const char *e = getenv("MPT_TEST_STORM_S");
  return e && atof(e) > 0 ? atof(e) : 1.5;
}

START_TEST(test_gemm_heap_survives_signals_one_thread) { gemm_storm(1, storm_s()); }
END_TEST

START_TEST(test_gemm_heap_survives_signals_two_threads) { gemm_storm(2, storm_s()); }
END_TEST

/* ---- the library's threads block the signals meant for the process ---- */

enum { MAX_TASKS = 256 };

/* The thread ids of this process. */
static int tasks(long *ids, int max) {
  DIR *d = opendir("/proc/self/task");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.' && n < max) ids[n++] = atol(e->d_name);
  closedir(d);
  return n;
}

/* The blocked-signal mask of thread `tid` (SigBlk: bit sig - 1). */
static unsigned long long blocked_mask(long tid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
  FILE *f = fopen(path, "r");
  if (!f) return ~0ULL; /* ended meanwhile: nothing to check */
  unsigned long long mask = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "SigBlk: %llx", &mask) == 1) break;
  fclose(f);
  return mask;
}

static void spin_range(void *arg, int64_t b, int64_t e) {
  (void)arg;
  volatile double sink = 0.0;
  for (int64_t i = b; i < e; i++)
    for (int k = 0; k < 2000; k++) sink += k * 0.5;
}

START_TEST(test_library_threads_block_process_signals) {
  long before[MAX_TASKS], after[MAX_TASKS];
  const int nbefore = tasks(before, MAX_TASKS);
  const long self = (long)gettid();
  OK(mpt_cpu_set_threads(2)); /* OpenBLAS's workers, the pool's and OpenMP's: two threads */
  mpt_stream *worker = NULL, *inline_stream = NULL;
  OK(mpt_stream_init(&worker, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_init(&inline_stream, mpt_device_cpu(), MPT_STREAM_INLINE));
  /* a loader with its prefetch thread */
  mpt_dataset ds;
  OK(mpt_dataset_init_synthetic(&ds, 64, 1, 8, 8, 10, 1));
  mpt_sampler *sampler = NULL;
  mpt_sampler_config sc = mpt_sampler_config_default();
  OK(mpt_sampler_init(&sampler, ds.count, &sc));
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = 16;
  mpt_loader *loader = NULL;
  OK(mpt_loader_init(&loader, &ds, sampler, &lc));
  OK(mpt_loader_start_epoch(loader, 0));
  mpt_batch b;
  ck_assert_int_eq(mpt_loader_next(loader, &b), MPT_OK);
  /* the pool's workers: jobs until one took a chunk */
  const int64_t w0 = mpt__cpu_pool_worker_chunks();
  for (int i = 0; i < 200 && mpt__cpu_pool_worker_chunks() == w0; i++)
    mpt__cpu_parallel_for(64, 4, spin_range, NULL);
  ck_assert_msg(mpt__cpu_pool_worker_chunks() > w0, "no pool worker took part");
  /* a GEMM large enough for two threads (oneDNN's OpenMP team, or OpenBLAS's threads) */
  const int64_t n = 512;
  float *a = ones(n * n), *c = ones(n * n);
  OK(mpt_op_gemm(inline_stream, 0, 0, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n));
  ck_assert(c[0] == (float)n);
  /* DataParallel over two CPU devices: a replica thread each */
  mpt_mlp_config mc = mpt_mlp_config_default();
  mc.input_size = 64;
  mc.num_hidden = 1;
  mc.hidden[0] = 16;
  mc.num_classes = 10;
  mpt_model *model = NULL;
  OK(mpt_model_init_mlp(&model, mpt_device_cpu(), &mc, 1));
  const mpt_device devices[2] = {{MPT_DEVICE_CPU, 0}, {MPT_DEVICE_CPU, 1}};
  mpt_dp_config dc = mpt_dp_config_default();
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, model, devices, 2, inline_stream, &dc));

  const int nafter = tasks(after, MAX_TASKS);
  const unsigned long long want = (1ULL << (SIGTERM - 1)) | (1ULL << (SIGUSR1 - 1)) |
                                  (1ULL << (SIGUSR2 - 1)) | (1ULL << (SIGINT - 1));
  int checked = 0;
  for (int i = 0; i < nafter; i++) {
    int old = after[i] == self;
    for (int j = 0; j < nbefore && !old; j++) old = after[i] == before[j];
    if (old) continue;
    const unsigned long long mask = blocked_mask(after[i]);
    ck_assert_msg((mask & want) == want,
                  "thread %ld (of %d new) does not block SIGTERM, SIGUSR1, SIGUSR2 and SIGINT: "
                  "SigBlk %016llx", after[i], nafter - nbefore, mask);
    checked++;
  }
  /* the stream worker, the loader, a pool worker and two replicas at least */
  ck_assert_msg(checked >= 5, "only %d new threads", checked);
  /* the caller's own mask is untouched: these signals are still its to take */
  ck_assert_int_eq(blocked_mask(self) & want, 0);

  mpt_dp_free(dp);
  mpt_model_free(model);
  free(a);
  free(c);
  mpt_loader_free(loader);
  mpt_sampler_free(sampler);
  mpt_dataset_free(&ds);
  mpt_stream_free(worker);
  mpt_stream_free(inline_stream);
}
END_TEST

int main(void) {
  Suite *s = suite_create("signals");
  TCase *tc = tcase_create("signals");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gemm_heap_survives_signals_one_thread);
  tcase_add_test(tc, test_gemm_heap_survives_signals_two_threads);
  tcase_add_test(tc, test_library_threads_block_process_signals);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
