/* Internal error helpers: record a detail on the calling thread and propagate a status.
 * MPT_FAIL(status, fmt, ...) records "file:line: message" (with the rank when known) and
 * evaluates to status. MPT_CHECK(expr, label) evaluates expr into the local `st` and jumps to
 * label on failure (the detail was recorded by whoever failed). */
#ifndef MPT_CORE_ERROR_H
#define MPT_CORE_ERROR_H

#include "mpitrain/core.h"

mpt_status mpt__error(mpt_status status, const char *file, int line, const char *fmt, ...)
    MPT_PRINTF(4, 5);

#define MPT_FAIL(status, ...) mpt__error((status), __FILE__, __LINE__, __VA_ARGS__)

#define MPT_CHECK(expr, label)   \
  do {                           \
    st = (expr);                 \
    if (st != MPT_OK) goto label; \
  } while (0)

/* Returns from the current function on failure. */
#define MPT_RETURN_IF(expr)                \
  do {                                     \
    mpt_status mpt__rs = (expr);           \
    if (mpt__rs != MPT_OK) return mpt__rs; \
  } while (0)

#endif
