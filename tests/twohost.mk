# Fail-fast and multi-host tests of the trainer (they need the mpitrain program, src/cli, and
# tests/mpirun.sh): a rank killed mid-step, mid-all-reduce and mid-checkpoint on one host
# (tests/test_kill_points.sh), and two hosts made of network namespaces joined over TCP, with
# one host lost mid-run and a resume on both (tests/test_two_hosts.sh, driving
# scripts/two_hosts.sh; skipped with status 77 where namespaces cannot be made).
TESTS += tests/test_kill_points.sh tests/test_two_hosts.sh
EXTRA_DIST += tests/test_kill_points.sh tests/test_two_hosts.sh scripts/two_hosts.sh
# the flight recorder, hang-report and stragglers across the two hosts: a stopped rank on
# host2, a skipped step, a slowed rank, SIGUSR2 dumps on both hosts (docs/hangs.md)
TESTS += tests/test_hang_two_hosts.sh
EXTRA_DIST += tests/test_hang_two_hosts.sh
