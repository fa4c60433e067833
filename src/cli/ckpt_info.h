/* `mpitrain ckpt info FILE|DIR`: what a checkpoint holds, without loading it into a job
 * (src/cli/ckpt_info.c, docs/checkpoints.md). */
#ifndef MPT_CLI_CKPT_INFO_H
#define MPT_CLI_CKPT_INFO_H

/* Runs `mpitrain ckpt ARGS` with argv[0] = "ckpt". Prints the report to stdout (errors to
 * stderr) and returns the exit status: 0 the file verifies, 1 it cannot be read or does not
 * verify (missing, not a checkpoint, truncated, corrupt, a newer format), 2 bad usage. */
int mpt_cli_ckpt(int argc, char **argv);

#endif
