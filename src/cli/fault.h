/* The trainer's gate for the fault-injection hooks of the test suite (the MPT_TEST_* variables,
 * docs/faults.md), the program's twin of the library's src/core/fault.h: the trainer includes
 * only public headers of the library, so it keeps its own.
 *
 * The hooks exist only in a build configured with --enable-fault-injection (config.h defines
 * MPT_FAULT_INJECTION; `./setup.sh check` and CI configure so). In any other build
 * trainer_test_env() is a constant NULL, the hooks' bodies are dead code the compiler drops,
 * and setting the variables changes nothing (tests/test_fault_injection.sh).
 *
 * The one pattern for a hook (src/cli/train_checks.c):
 *
 *   const char *v = trainer_test_env("MPT_TEST_DO_HARM");   // NULL unless built and set
 *   if (!v) return;
 *
 * Never read an MPT_TEST_* variable with getenv itself (tests/test_fault_injection.sh checks).
 * A test that needs a hook skips (exit 77) when the build has none (tests/fault_injection.sh). */
#ifndef MPT_CLI_FAULT_H
#define MPT_CLI_FAULT_H

#include "config.h"

#ifdef MPT_FAULT_INJECTION
/* getenv(name) for a name that starts with "MPT_TEST_" (src/cli/fault.c); NULL otherwise. */
const char *trainer_test_env(const char *name);
#else
static inline const char *trainer_test_env(const char *name) {
  (void)name;
  return (const char *)0;
}
#endif

#endif
