/* Preemption signals of `mpitrain train` (src/cli/preempt.c): which thread takes SIGTERM and
 * SIGUSR1, and the signal the training loop reads after each step. */
#ifndef MPT_CLI_PREEMPT_H
#define MPT_CLI_PREEMPT_H

#include <pthread.h>

#include "mpitrain/core.h"

/* Blocks SIGTERM and SIGUSR1 on the calling thread, so that every thread started afterwards
 * inherits the block, and starts the thread that takes them (sigwait). Call it first, before
 * MPI and any other thread starts. MPT_EINVAL when already started; MPT_ENOMEM when no thread
 * can be started (the signals are then unblocked again: nothing changed). */
mpt_status mpt_cli_preempt_start(void);

/* The last preemption signal received (SIGTERM or SIGUSR1), 0 while none has come. */
int mpt_cli_preempt_signal(void);

/* Stops the thread and gives the calling thread its mask back; a signal pending meanwhile is
 * still recorded. The handlers stay (a late signal is recorded, the process not killed). */
void mpt_cli_preempt_stop(void);

/* pthread_create with SIGTERM, SIGUSR1, SIGUSR2 and SIGINT blocked in the new thread (blocked
 * in the caller around the call): for the program's own helper threads (the start-up
 * watchdog), which must never take a signal meant for the process. */
int mpt_cli_thread_create(pthread_t *thread, void *(*fn)(void *), void *arg);

#endif
