# Slurm: the batch scripts (slurm/), installed under $(pkgdatadir)/slurm, and their test against
# a one-node Slurm cluster that the test starts and stops itself (tests/slurm_cluster.sh);
# skipped (exit 77) where Slurm, munge, mpirun or root is missing. The test needs the mpitrain
# program (src/cli/local.mk) and tests/mpirun.sh.
slurmdir = $(pkgdatadir)/slurm
dist_slurm_SCRIPTS = slurm/train_single_node.sbatch slurm/train_multi_node_srun.sbatch \
	slurm/train_multi_node_mpirun.sbatch slurm/bench_sweep.sbatch
dist_slurm_DATA = slurm/README.md
TESTS += tests/test_slurm.sh
EXTRA_DIST += tests/test_slurm.sh tests/slurm_cluster.sh
