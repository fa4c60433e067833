/* Fault injection for the test suite: the MPT_TEST_* environment variables (docs/faults.md).
 *
 * The hooks exist only in a build configured with --enable-fault-injection (config.h defines
 * MPT_FAULT_INJECTION; `./setup.sh check` and CI configure so). In any other build
 * mpt__test_env() is a constant NULL: every hook's body is dead code the compiler drops, the
 * variables' names are not in the binary, and setting them changes nothing
 * (tests/test_fault_injection.sh proves it).
 *
 * The one pattern for a hook in the library (src/ckpt/write.c; the mpitrain program, which
 * includes only public headers, has the same gate as trainer_test_env in src/cli/fault.h):
 *
 *   #include "core/fault.h"
 *   void trainer_maybe_do_harm(trainer *t) {
 *     const char *v = mpt__test_env("MPT_TEST_DO_HARM");   // NULL unless built and set
 *     if (!v) return;
 *     ...
 *   }
 *
 * Never read an MPT_TEST_* variable with getenv itself (tests/test_fault_injection.sh checks).
 * A test that needs a hook skips (exit 77) or leaves its case out when the build has none:
 * shell tests source tests/fault_injection.sh, C tests check MPT_FAULT_INJECTION (config.h). */
#ifndef MPT_CORE_FAULT_H
#define MPT_CORE_FAULT_H

#include "config.h"

#ifdef MPT_FAULT_INJECTION
/* getenv(name) for a name that starts with "MPT_TEST_" (src/core/fault.c); NULL otherwise. */
const char *mpt__test_env(const char *name);
#else
static inline const char *mpt__test_env(const char *name) {
  (void)name;
  return (const char *)0;
}
#endif

#endif
