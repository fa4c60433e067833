/* mpitrain: the program. Parses the command line, then runs the trainer. Exit status: 0 done,
 * 1 failure (the message names the rank and cause), 2 bad usage, 75 preempted.
 *
 * Bad usage under a launcher (mpirun -np N, srun) would otherwise print the same message N
 * times: only rank 0 prints it, with a one-line hint instead of the whole usage; --help and
 * --version print on rank 0 only. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/ckpt_info.h"
#include "cli/generate.h"
#include "cli/hang_report.h"
#include "cli/options.h"
#include "cli/tokenize.h"
#include "cli/train.h"
#include "cli/version.h"

int main(int argc, char **argv) {
  static mpt_cli_options opts;
  static char msg[16384]; /* the usage of --help: as large as mpt_cli_usage's text */
  /* tokenize and generate are one-process commands: under mpirun -np N (or srun) rank 0 does
   * the work and the other ranks exit at once (N copies of the text, or N writers racing on
   * one output folder, before) */
  const int single = argc > 1 && (strcmp(argv[1], "tokenize") == 0 ||
                                  strcmp(argv[1], "generate") == 0 ||
                                  strcmp(argv[1], "hang-report") == 0 ||
                                  strcmp(argv[1], "ckpt") == 0);
  if (single && mpt_cli_launcher_rank() > 0) return 0;
  if (argc > 1 && strcmp(argv[1], "tokenize") == 0) /* text to token shards */
    return mpt_cli_tokenize(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "generate") == 0) /* sample from a GPT model file */
    return mpt_cli_generate(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "hang-report") == 0) /* the flight recorder's dumps, merged */
    return mpt_cli_hang_report(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "ckpt") == 0) /* ckpt info: what a checkpoint holds */
    return mpt_cli_ckpt(argc - 1, argv + 1);
  int r = mpt_cli_parse(argc, argv, &opts, msg, sizeof msg);
  if (r == MPT_CLI_EXIT_OK) {
    if (mpt_cli_launcher_rank() > 0) return 0; /* --help under mpirun -np N: once, not N times */
    if (strcmp(opts.command, "version") == 0)
      mpt_cli_print_version(stdout);
    else
      printf("%s\n", msg);
    return 0;
  }
  if (r == MPT_CLI_EXIT_USAGE) {
    int rank = mpt_cli_launcher_rank();
    /* the error and where the options are listed, not the 100 lines of usage, which pushed
     * the error off the screen */
    const int no_command = strncmp(msg, "unknown command", 15) == 0 ||
                           strncmp(msg, "no command", 10) == 0;
    if (rank < 0)
      fprintf(stderr, "mpitrain: %s\n(%s)\n", msg,
              no_command ? "`mpitrain train --help`, `mpitrain tokenize --help`, `mpitrain "
                           "generate --help`, `mpitrain hang-report --help` and `mpitrain ckpt --help` list "
                           "the options"
                         : "`mpitrain train --help` lists the options");
    else if (rank == 0)
      fprintf(stderr, "mpitrain: %s\nmpitrain: every rank stops (status 2); `mpitrain train "
              "--help` lists the options\n", msg);
    else /* let rank 0 print first: the launcher kills the job when the first rank exits */
      sleep(3);
    return 2;
  }
  return mpt_cli_train(&opts);
}
