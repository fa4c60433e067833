#ifndef MPT_CLI_GENERATE_H
#define MPT_CLI_GENERATE_H

/* Runs `mpitrain generate ARGS` with argv[0] = "generate": samples from a GPT model file.
 * Prints the text (or token ids) to stdout and returns the exit status: 0 done, 1 failure (the
 * message names the file), 2 bad usage. */
int mpt_cli_generate(int argc, char **argv);

#endif
