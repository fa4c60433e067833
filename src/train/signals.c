/* Preemption (trainer.h mpt_trainer_catch_signals): SIGTERM and SIGUSR1 (Slurm sends one before
 * the time limit with --signal; mpirun forwards SIGUSR1 to every rank, not SIGTERM) set a flag;
 * the loop starts an all-reduce (max) of the flag on the comm stream before each step and reads
 * it after the step, so every rank stops after the same step, checkpoints, and the run reports
 * the preemption.
 *
 * Which thread takes the signal: a process-directed signal goes to a thread that does not block
 * it. The library's own threads (the CPU comm stream's worker, the loaders' prefetch threads,
 * DataParallel's replicas, the op pool, the start-up watchdog) block it, so it is the training
 * thread (or another thread of the caller's) that runs the handler, which only stores the
 * signal number: async-signal-safe, and no system call of a library thread is interrupted. */
#include <signal.h>
#include <string.h>

#include "train/train_impl.h"

static volatile sig_atomic_t received = 0;

static void on_signal(int sig) { received = sig; }

mpt_status mpt_trainer_catch_signals(void) {
  static int installed = 0;
  if (installed) return MPT_OK;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* a read or write of the training thread is not cut short */
  if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
    return MPT_FAIL(MPT_EIO, "cannot install the SIGTERM / SIGUSR1 handlers");
  installed = 1;
  return MPT_OK;
}

int mpt__train_signal(void) { return received; }

const char *mpt_trainer_signal_name(int sig) {
  return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal on another rank";
}

mpt_status mpt__train_stop_vote_start(mpt__trainer *t) {
  t->stop_local = t->stop_global = received ? 1 : 0;
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
