/* mpitrain: the program. Parses the command line, then runs the trainer. Exit status: 0 done,
 * 1 failure (the message names the rank and cause), 2 bad usage, 75 preempted. */
#include <stdio.h>

#include "cli/options.h"
#include "cli/train.h"

int main(int argc, char **argv) {
  static mpt_cli_options opts;
  static char msg[8192];
  int r = mpt_cli_parse(argc, argv, &opts, msg, sizeof msg);
  if (r == MPT_CLI_EXIT_OK) {
    printf("%s\n", msg);
    return 0;
  }
  if (r == MPT_CLI_EXIT_USAGE) {
    fprintf(stderr, "mpitrain: %s\n\n%s", msg, mpt_cli_usage());
    return 2;
  }
  return mpt_cli_train(&opts);
}
