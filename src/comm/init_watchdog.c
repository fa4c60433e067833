/* The start-up watchdog of mpt_comm_init (comm.h mpt_comm_config.init_timeout_ms; mpitrain's
 * --timeout, at least 10 s, so that a short collective deadline does not kill a healthy
 * start-up): the deadline of MPI's initialisation. MPI_Init_thread
 * blocks until every process of the job has started and initialised MPI, with no deadline and
 * no way to interrupt it: `mpirun -np 1 ./mpitrain train : -np 1 sleep 1000` (a process that
 * never initialises MPI), a rank stopped or stuck before MPI_Init, or a broken PMI would hang
 * with no output. A thread started before MPI_Init_thread waits for its end with the deadline; on
 * expiry it prints what the bootstrap waits for (mpt_comm_bootstrap_stage) and this process's
 * place in the job as the launcher tells it, then ends the process with status 1 (_exit: MPI is
 * not usable, and the main thread is inside it). mpirun / srun then end the other processes.
 *
 * This is the one place where the library ends the process: the thread that would have to
 * return the error is inside MPI_Init_thread, which nothing interrupts; the deadline is the
 * caller's choice (0: no watchdog).
 *
 * Threads: the watchdog thread (the asynchronous signals blocked: core/threads.h), and the thread
 * in mpt_comm_init that starts and stops it. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "core/threads.h"


struct mpt__init_watchdog {
  pthread_t thread;
  pthread_mutex_t mutex;
  pthread_cond_t cond; /* on CLOCK_MONOTONIC */
  int done;
  double timeout_s;
};

/* "rank 3 of 8 (mpirun)" from the launcher's variables (MPI cannot say yet). */
static void describe_process(char *buf, size_t nbytes) {
  const char *r = getenv("OMPI_COMM_WORLD_RANK"), *n = getenv("OMPI_COMM_WORLD_SIZE");
  const char *who = "mpirun";
  if (!r || !n) {
    r = getenv("SLURM_PROCID");
    n = getenv("SLURM_NTASKS");
    who = "srun";
  }
  if (!r || !n) {
    r = getenv("PMIX_RANK");
    n = getenv("PMIX_SIZE");
    who = "PMIx";
  }
  char host[256] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  if (r && n)
    snprintf(buf, nbytes, "rank %s of %s (%s), pid %ld on %s", r, n, who, (long)getpid(), host);
  else
    snprintf(buf, nbytes, "pid %ld on %s (no launcher variables)", (long)getpid(), host);
}

static void *watchdog_main(void *arg) {
  mpt__init_watchdog *w = arg;
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  long long ns = (long long)(w->timeout_s * 1e9);
  dl.tv_sec += (time_t)(ns / 1000000000LL);
  dl.tv_nsec += (long)(ns % 1000000000LL);
  if (dl.tv_nsec >= 1000000000L) {
    dl.tv_sec++;
    dl.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w->mutex);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cond, &w->mutex, &dl);
  int expired = !w->done;
  pthread_mutex_unlock(&w->mutex);
  if (!expired) return NULL;
  char who[512];
  describe_process(who, sizeof who);
  const char *stage = mpt_comm_bootstrap_stage();
  fprintf(stderr,
          "mpitrain: error: MPI initialisation did not complete within %g s (the start-up "
          "deadline: --timeout, at least 10 s) on %s: "
          "still waiting in %s. A process of the job has not initialised MPI: one that is not "
          "mpitrain (an mpirun ':' part), one that crashed, hangs or was stopped before "
          "starting, or a launcher whose PMI does not connect the processes. Exiting with "
          "status 1.\n",
          w->timeout_s, who, stage[0] ? stage : "the start of the comm bootstrap");
  fflush(stderr);
  _exit(1);
}

mpt_status mpt__init_watchdog_start(double timeout_s, mpt__init_watchdog **out) {
  *out = NULL;
  mpt__init_watchdog *w = calloc(1, sizeof *w);
  if (!w) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the start-up watchdog");
  w->timeout_s = timeout_s;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cond, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&w->mutex, NULL);
  const int rc = mpt__thread_create(&w->thread, NULL, watchdog_main, w); /* no signal taken */
  if (rc != 0) {
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mutex);
    free(w);
    return MPT_FAIL(MPT_ENOMEM, "cannot start the start-up watchdog thread");
  }
  *out = w;
  return MPT_OK;
}

void mpt__init_watchdog_stop(mpt__init_watchdog *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mutex);
  w->done = 1;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->mutex);
  pthread_join(w->thread, NULL);
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->mutex);
  free(w);
}
