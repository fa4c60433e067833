# tests of the program (the unit tests are listed in each layer's local.mk)
TESTS += tests/test_cli.sh tests/test_kill_rank.sh tests/test_preempt.sh tests/test_resume.sh tests/test_ckpt_np2.sh tests/test_nonfinite.sh
EXTRA_DIST += tests/test_cli.sh tests/test_kill_rank.sh tests/test_preempt.sh tests/test_resume.sh tests/test_ckpt_np2.sh tests/test_nonfinite.sh
TESTS += tests/test_cli_groups.sh
EXTRA_DIST += tests/test_cli_groups.sh
