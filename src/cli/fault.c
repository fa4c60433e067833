/* The trainer's gate of the fault-injection hooks (src/cli/fault.h), built with
 * --enable-fault-injection only. Alone in its file on purpose: tests/mpitrain_nofault links the
 * program's other objects with tests/fault_off.c instead, which closes this gate and the
 * library's (tests/test_fault_injection.sh). */
#include <stdlib.h>
#include <string.h>

#include "cli/fault.h"

#ifdef MPT_FAULT_INJECTION
const char *trainer_test_env(const char *name) {
  if (!name || strncmp(name, "MPT_TEST_", 9) != 0) return NULL;
  return getenv(name);
}
#endif
