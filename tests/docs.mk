# Tests of what users read and run first: every bench/ and scripts/ script answers --help, the
# answers to a new user's first mistakes, the bench scripts given bad input, and the no-history
# check of the tracked files.
TESTS += tests/test_scripts_help.sh tests/test_user_mistakes.sh tests/test_bench_bad_input.sh
EXTRA_DIST += tests/test_scripts_help.sh tests/test_user_mistakes.sh tests/test_bench_bad_input.sh \
	tests/check_util.h \
	tests/file_check.h
# No tracked file tells how the project was made (names with round suffixes, work-history words).
TESTS += tests/test_no_history.sh
EXTRA_DIST += tests/test_no_history.sh
# Rules of the tree no compiler checks: core/error.h only where used, one spelling per log
# level, docs/ the one documentation folder, mpitrain.pc naming every library linked.
TESTS += tests/test_tree.sh
EXTRA_DIST += tests/test_tree.sh
