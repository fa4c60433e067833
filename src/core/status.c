/* Status codes (one table in core.h) and the thread-local last-error detail. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mpitrain/core.h"

static _Thread_local char last_error[1024];

const char *mpt_status_name(mpt_status status) {
  switch (status) {
#define MPT__STATUS_NAME(name, value, msg) \
  case MPT_##name:                         \
    return "MPT_" #name;
    MPT_STATUS_MAP(MPT__STATUS_NAME)
#undef MPT__STATUS_NAME
  }
  return "MPT_UNKNOWN";
}

const char *mpt_status_message(mpt_status status) {
  switch (status) {
#define MPT__STATUS_MSG(name, value, msg) \
  case MPT_##name:                        \
    return msg;
    MPT_STATUS_MAP(MPT__STATUS_MSG)
#undef MPT__STATUS_MSG
  }
  return "unknown status";
}

const char *mpt_last_error(void) { return last_error; }

void mpt_error_clear(void) { last_error[0] = '\0'; }

static void error_vset(const char *file, int line, const char *fmt, va_list ap) {
  char msg[768];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (file)
    snprintf(last_error, sizeof last_error, "%s (at %s:%d, rank %d)", msg, file, line,
             mpt_log_rank());
  else
    snprintf(last_error, sizeof last_error, "%s", msg);
}

mpt_status mpt_error_set(mpt_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  error_vset(NULL, 0, fmt, ap);
  va_end(ap);
  return status;
}

mpt_status mpt_error_set_at(mpt_status status, const char *file, int line, const char *fmt,
                            ...) {
  const char *base = strrchr(file, '/');
  va_list ap;
  va_start(ap, fmt);
  error_vset(base ? base + 1 : file, line, fmt, ap);
  va_end(ap);
  return status;
}
