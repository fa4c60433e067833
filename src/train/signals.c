/* Preemption (trainer.h mpt_trainer_catch_signals): SIGTERM (what Slurm sends before a time
 * limit) and SIGUSR1 (mpirun forwards USR1 and USR2 to every rank, not TERM) ask the run to stop
 * after its current step: the loop starts an all-reduce (max) of "a signal arrived" on the comm
 * stream before each step and reads it after the step, so every rank stops after the same step,
 * checkpoints, and the run reports the preemption (exit 75 in a program).
 *
 * Which thread takes them: a thread started here that waits for them with sigwait, and no
 * other. mpt_trainer_catch_signals blocks both signals on the calling thread, before MPI_Init
 * and any other thread when a program calls it first (mpitrain does), so every thread started
 * afterwards inherits the block: MPI's and PMIx's threads, the comm stream's worker, the loaders'
 * prefetch threads, the CPU ops' pool, DataParallel's replicas, the OpenMP team of oneDNN and
 * the attention, OpenBLAS's added workers, the start-up watchdog (the library's threads also
 * block them themselves: src/core/threads.h). A process-directed signal goes to a thread that
 * does not block it: the waiter.
 *
 * Why: a signal handler runs on the stack of the thread that takes the signal, below its stack
 * pointer. Taken by the training thread (or an OpenMP worker) inside one of oneDNN's fp32 GEMM
 * kernels, which move the stack pointer into a malloc'd workspace, the handler's frame was
 * written over malloc's chunk headers: about 1 run in 10 printed "preempted (SIGUSR1)" and then
 * aborted in free() (src/core/threads.h has the details; docs/faults.md F52). A thread that only
 * waits for signals computes nothing, and the threads that compute, wait in MPI or write
 * checkpoints are never interrupted (no EINTR either).
 *
 * The workers that OpenBLAS's constructor starts when the library is loaded, before main, keep
 * an empty mask (nothing of ours runs before them): a signal may still land on one of them, so
 * the same recording is installed as a handler too (SA_RESTART). They only ever run OpenBLAS's
 * kernels, which keep the stack pointer on their stack, so a handler there is harmless.
 *
 * SIGUSR2 (mpirun forwards it to every rank too) asks for the flight recorder's dump of the
 * running loop's comm (comm.h "Flight recorder"): the waiter writes it and the run goes on. The
 * fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) get a handler, installed by each run
 * after MPI's own (mpt__train_catch_fatal), that writes the dump (async-signal-safe) and then
 * hands the signal to the handler that was there before (Open MPI's stack printer) or the
 * default action.
 *
 * Threads: the caller starts it once; the waiter only records, or dumps. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "core/threads.h"
#include "train/train_impl.h"

static atomic_int received; /* lock-free: written by the waiter or by a handler */
static pthread_t waiter;
static int started;
/* the running loop's comm, dumped on SIGUSR2 and fatal signals (NULL: no run) */
static _Atomic(mpt_comm *) dump_comm;
static atomic_int dumps; /* SIGUSR2 dumps written, for the log */

static void record(int sig) {
  if (sig == SIGUSR2) { /* a handler on a foreign thread: the dump is async-signal-safe */
    mpt_comm *c = atomic_load(&dump_comm);
    if (c) mpt_comm_flight_dump(c, "SIGUSR2");
    return;
  }
  atomic_store(&received, sig);
}

static void preempt_set(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGUSR1);
  sigaddset(set, SIGUSR2);
}

static void *waiter_main(void *arg) {
  (void)arg;
  sigset_t set;
  preempt_set(&set);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig != SIGUSR2) {
      record(sig);
      continue;
    }
    mpt_comm *c = atomic_load(&dump_comm);
    char path[4200] = "";
    if (!c) {
      mpt_log(MPT_LOG_WARN, "SIGUSR2: no training run is going on, no flight recorder to dump");
    } else if (mpt_comm_flight_dump(c, "SIGUSR2") == MPT_OK) {
      mpt_comm_flight_path(c, path, sizeof path);
      atomic_fetch_add(&dumps, 1);
      mpt_log(MPT_LOG_INFO, "SIGUSR2: flight recorder written to %s (the run goes on)", path);
    } else {
      mpt_comm_flight_path(c, path, sizeof path);
      mpt_log(MPT_LOG_WARN, "SIGUSR2: cannot write the flight recorder to %s", path);
    }
  }
  return NULL;
}

/* ---- fatal signals -------------------------------------------------------------------------- */

enum { NFATAL = 5 };
static const int fatal_sigs[NFATAL] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
static struct sigaction fatal_old[NFATAL];
static atomic_int fatal_installed;

static void fatal_handler(int sig) {
  mpt_comm *c = atomic_exchange(&dump_comm, NULL); /* once, even if the dump itself faults */
  if (c) {
    const char *why = sig == SIGSEGV ? "fatal signal SIGSEGV" : sig == SIGBUS ? "fatal signal SIGBUS"
                      : sig == SIGFPE ? "fatal signal SIGFPE" : sig == SIGILL ? "fatal signal SIGILL"
                                                                 : "fatal signal SIGABRT";
    mpt_comm_flight_dump(c, why);
  }
  for (int i = 0; i < NFATAL; i++) /* the handler before ours, or the default, takes it now */
    if (fatal_sigs[i] == sig) sigaction(sig, &fatal_old[i], NULL);
  raise(sig); /* blocked while this handler runs: delivered on return */
}

void mpt__train_catch_fatal(void) {
  if (atomic_exchange(&fatal_installed, 1)) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fatal_handler;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NFATAL; i++) sigaction(fatal_sigs[i], &sa, &fatal_old[i]);
}

void mpt__train_set_dump_comm(mpt_comm *comm) { atomic_store(&dump_comm, comm); }

mpt_status mpt_trainer_catch_signals(void) {
  static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&once);
  mpt_status st = MPT_OK;
  if (!started) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = record;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigset_t set, old;
    preempt_set(&set);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0 ||
        sigaction(SIGUSR2, &sa, NULL) != 0) {
      st = MPT_FAIL(MPT_EIO, "cannot install the SIGTERM / SIGUSR1 / SIGUSR2 handlers");
    } else {
      pthread_sigmask(SIG_BLOCK, &set, &old); /* this thread and every later one */
      /* the waiter itself: created with the asynchronous signals blocked, it waits for these */
      const int rc = mpt__thread_create(&waiter, NULL, waiter_main, NULL);
      if (rc != 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        st = MPT_FAIL(MPT_ENOMEM, "cannot start the thread that waits for SIGTERM and SIGUSR1: "
                      "%s", strerror(rc));
      } else {
        pthread_detach(waiter);
        started = 1;
      }
    }
  }
  pthread_mutex_unlock(&once);
  return st;
}

int mpt__train_signal(void) { return atomic_load(&received); }

int mpt__train_dumps(void) { return atomic_load(&dumps); }

const char *mpt_trainer_signal_name(int sig) {
  return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal on another rank";
}

mpt_status mpt__train_stop_vote_start(mpt__trainer *t) {
  t->stop_local = t->stop_global = atomic_load(&received) ? 1 : 0;
  if (t->world == 1) return MPT_OK;
  mpt_stream *cs = mpt_comm_stream(t->comm);
  MPT_RETURN_IF(mpt_comm_allreduce(t->comm, cs, &t->stop_local, &t->stop_global, 1, MPT_I32,
                                   MPT_REDUCE_MAX));
  return mpt_event_record(t->stop_event, cs);
}

mpt_status mpt__train_stop_vote_finish(mpt__trainer *t) {
  if (t->world == 1) return MPT_OK;
  return mpt_comm_wait_event(t->comm, t->stop_event);
}
