/* tests/mpitrain_nofault: the mpitrain program's objects linked with this file ahead of the
 * library's gate src/core/fault.c, so that every MPT_TEST_* hook of the library (the training
 * loop's included) reads NULL, as in a build configured without --enable-fault-injection
 * (tests/test_fault_injection.sh). Being an object of the program, the definition here wins:
 * the archive's fault.o is then never pulled in. */
#include <stddef.h>

const char *mpt__test_env(const char *name);

const char *mpt__test_env(const char *name) {
  (void)name;
  return NULL;
}
