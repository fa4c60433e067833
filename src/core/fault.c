/* The gate of the fault-injection hooks (src/core/fault.h), built with
 * --enable-fault-injection only. Alone in its file on purpose: tests/fault_off.c replaces it
 * (and the program's src/cli/fault.c) in a second copy of the program (tests/mpitrain_nofault),
 * which then behaves as a default build does whatever MPT_TEST_* variables are set
 * (tests/test_fault_injection.sh). */
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"

#ifdef MPT_FAULT_INJECTION
const char *mpt__test_env(const char *name) {
  if (!name || strncmp(name, "MPT_TEST_", 9) != 0) return NULL;
  return getenv(name);
}
#endif
