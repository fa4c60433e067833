/* Preemption signals of `mpitrain train`: SIGTERM (what Slurm sends before a time limit) and
 * SIGUSR1 (mpirun forwards USR1 and USR2 to every rank, not TERM) ask the run to stop after its
 * current step and exit 75.
 *
 * Which thread takes them: the preemption thread started here, with sigwait, and no other.
 * mpt_cli_preempt_start blocks both signals on the main thread before MPI_Init and before any
 * thread of ours starts, so every thread started afterwards inherits the block: MPI's and PMIx's
 * threads, the comm stream's worker, the loaders' prefetch threads, the CPU ops' pool, the
 * DataParallel replicas, the OpenMP team of oneDNN and the attention, OpenBLAS's added workers,
 * the start-up watchdog (the library's threads also block them themselves, src/core/threads.h).
 * A process-directed signal goes to a thread that does not block it: this one.
 *
 * Why: a signal handler runs on the stack of the thread that takes the signal, below its stack
 * pointer. Taken by the training thread (or an OpenMP worker) inside one of oneDNN's fp32 GEMM
 * kernels, which move the stack pointer into a malloc'd workspace, the handler's frame was
 * written over malloc's chunk headers: about 1 run in 10 printed "preempted (SIGUSR1)" and then
 * aborted in free() (src/core/threads.h has the details). A thread that only waits for signals
 * computes nothing, and the threads that compute, wait in MPI or write checkpoints are never
 * interrupted (no EINTR either).
 *
 * The workers that OpenBLAS's constructor starts when the library is loaded, before main, keep
 * an empty mask (nothing of ours runs before them): a signal may still land on one of them, so
 * the same recording is installed as a handler too (SA_RESTART). They only ever run OpenBLAS's
 * kernels, which keep the stack pointer on the stack, so a handler there is harmless.
 *
 * Threads: the caller (main) starts and stops; the preemption thread only records. */
#include "cli/preempt.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>

static atomic_int received; /* lock-free: written by a handler too */
static pthread_t waiter;
static int started;
static sigset_t caller_mask; /* the caller's mask before start */

static void record(int sig) { atomic_store(&received, sig); }

static void preempt_set(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGUSR1);
}

static void *waiter_main(void *arg) {
  (void)arg;
  sigset_t set;
  preempt_set(&set);
  for (;;) { /* sigwait is a cancellation point: mpt_cli_preempt_stop ends the loop there */
    int sig = 0;
    if (sigwait(&set, &sig) == 0) record(sig);
  }
  return NULL;
}

mpt_status mpt_cli_preempt_start(void) {
  if (started) return MPT_FAIL(MPT_EINVAL, "the preemption thread is already running");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = record;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  sigset_t set;
  preempt_set(&set);
  pthread_sigmask(SIG_BLOCK, &set, &caller_mask);
  const int rc = mpt_cli_thread_create(&waiter, waiter_main, NULL);
  if (rc != 0) {
    pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
    return MPT_FAIL(MPT_ENOMEM, "cannot start the thread that waits for SIGTERM and SIGUSR1: %s",
                    strerror(rc));
  }
  started = 1;
  return MPT_OK;
}

int mpt_cli_preempt_signal(void) { return atomic_load(&received); }

void mpt_cli_preempt_stop(void) {
  if (!started) return;
  pthread_cancel(waiter);
  pthread_join(waiter, NULL);
  started = 0;
  /* a signal that came after the thread ended is delivered here, to the handler */
  pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
}

int mpt_cli_thread_create(pthread_t *thread, void *(*fn)(void *), void *arg) {
  sigset_t set, old;
  preempt_set(&set);
  sigaddset(&set, SIGUSR2);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  const int rc = pthread_create(thread, NULL, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}
