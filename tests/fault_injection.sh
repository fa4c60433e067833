# Sourced by the shell tests that need the MPT_TEST_* fault-injection hooks (src/core/fault.h),
# from the build folder (where config.h is).
#   fault_injection_built      true when this build was configured with --enable-fault-injection
#   require_fault_injection    exits 77 (automake: SKIP) with the reason when it was not
fault_injection_built() {
  grep -q '^#define MPT_FAULT_INJECTION 1' "${MPT_CONFIG_H:-config.h}" 2> /dev/null
}
require_fault_injection() {
  fault_injection_built && return 0
  echo "SKIP: this test needs the MPT_TEST_* hooks: configure --enable-fault-injection" \
       "(./setup.sh check does)"
  exit 77
}
