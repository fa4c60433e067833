/* Rank-aware logger: one line per call to stderr, under a mutex so lines from threads do not
 * interleave. Info/debug print on rank 0 unless all ranks were asked for. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "mpitrain/core.h"

static int log_rank = 0;
static int log_world = 1;
static mpt_log_level log_level = MPT_LOG_INFO;
static int log_all_ranks = 0;
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

void mpt_log_configure(int rank, int world_size, mpt_log_level level, int all_ranks) {
  log_rank = rank;
  log_world = world_size;
  log_level = level;
  log_all_ranks = all_ranks;
}

int mpt_log_rank(void) { return log_rank; }

void mpt_log(mpt_log_level level, const char *fmt, ...) {
  static const char *tags[] = {"error", "warning", "info", "debug"};
  if (level > log_level) return;
  if (level >= MPT_LOG_INFO && log_rank != 0 && !log_all_ranks) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_mutex);
  if (level <= MPT_LOG_WARN || log_world > 1)
    fprintf(stderr, "mpitrain [rank %d/%d] %s: %s\n", log_rank, log_world, tags[level], msg);
  else
    fprintf(stderr, "mpitrain: %s\n", msg);
  fflush(stderr);
  pthread_mutex_unlock(&log_mutex);
}

double mpt_time_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
