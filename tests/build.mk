# Tests of the build itself: the shared library exports exactly the
# public API, and the MPT_TEST_* fault-injection hooks exist only in a build configured with
# --enable-fault-injection.
TESTS += tests/test_exports.sh tests/test_fault_injection.sh
EXTRA_DIST += tests/test_exports.sh tests/test_fault_injection.sh tests/fault_injection.sh

if FAULT_INJECTION
# The program's own objects with the library's gate closed: tests/fault_off.c replaces
# src/core/fault.c (never pulled from the archive).
check_PROGRAMS += tests/mpitrain_nofault
nofault_objects = $(mpitrain_OBJECTS)
tests_mpitrain_nofault_SOURCES = tests/fault_off.c
tests_mpitrain_nofault_LDADD = $(nofault_objects) libmpitrain_all.la
EXTRA_tests_mpitrain_nofault_DEPENDENCIES = $(nofault_objects)
endif
