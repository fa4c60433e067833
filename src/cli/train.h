/* The `mpitrain train` command: single process or DDP under mpirun/srun (src/cli/train.c). */
#ifndef MPT_CLI_TRAIN_H
#define MPT_CLI_TRAIN_H

#include "cli/options.h"

/* Runs training as configured; returns the process exit status (0 ok, 1 failure, 75
 * preempted: MPT_TRAIN_EXIT_PREEMPTED). On a failure that other ranks cannot see, it aborts the
 * whole job (MPI_Abort) after printing the cause. */
int mpt_cli_train(const mpt_cli_options *opts);

#endif
