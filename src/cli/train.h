/* The `mpitrain train` command: single process or DDP under mpirun/srun. */
#ifndef MPT_CLI_TRAIN_H
#define MPT_CLI_TRAIN_H

#include "cli/options.h"

/* Exit status of a run stopped by SIGTERM after finishing its current step (Slurm sends SIGTERM
 * before the time limit with --signal): EX_TEMPFAIL of sysexits.h, "try again later". */
#define MPT_EXIT_PREEMPTED 75

/* Runs training as configured; returns the process exit status (0 ok, 1 failure). On a failure
 * that other ranks cannot see, it aborts the whole job (MPI_Abort) after printing the cause. */
int mpt_cli_train(const mpt_cli_options *opts);

/* --model gpt|gpt-mini|gpt2 (src/cli/train_gpt.c): a GPT-2 language model on token shards,
 * alone or with DDP; the same exit statuses as mpt_cli_train (no preemption). */
int mpt_cli_train_gpt(const mpt_cli_options *opts);

#endif
