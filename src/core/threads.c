/* The library's threads and the signals they take (threads.h: why). */
#include "core/threads.h"

void mpt__signals_async(sigset_t *set) {
  static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
  sigfillset(set);
  for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++)
    sigdelset(set, synchronous[i]);
}

void mpt__signals_block(sigset_t *old) {
  sigset_t set;
  mpt__signals_async(&set);
  pthread_sigmask(SIG_BLOCK, &set, old);
}

void mpt__signals_restore(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

int mpt__thread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                       void *arg) {
  sigset_t old;
  mpt__signals_block(&old);
  const int rc = pthread_create(thread, attr, fn, arg);
  mpt__signals_restore(&old);
  return rc;
}
