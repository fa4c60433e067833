# Tests of the build itself (issue 12, item 6): the shared library exports exactly the public API.
TESTS += tests/test_exports.sh
EXTRA_DIST += tests/test_exports.sh
