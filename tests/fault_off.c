/* tests/mpitrain_nofault: the mpitrain program's own objects linked with this file in place of
 * src/core/fault.c, so that every MPT_TEST_* hook reads NULL as in a build configured without
 * --enable-fault-injection (tests/test_fault_injection.sh). Being an object of the program, this
 * definition wins: the library archive's fault.o is then never pulled in. */
#include <stddef.h>

const char *mpt__test_env(const char *name);

const char *mpt__test_env(const char *name) {
  (void)name;
  return NULL;
}
