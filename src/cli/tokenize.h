/* `mpitrain tokenize`: plain text to llm.c token shards (src/cli/tokenize.c). */
#ifndef MPT_CLI_TOKENIZE_H
#define MPT_CLI_TOKENIZE_H

/* Runs `mpitrain tokenize ARGS` with argv[0] = "tokenize". Prints to stdout / stderr and
 * returns the exit status: 0 done, 1 failure (the message names the file), 2 bad usage. */
int mpt_cli_tokenize(int argc, char **argv);

#endif
