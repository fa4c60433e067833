/* `mpitrain hang-report`: the flight recorder's dumps merged into a report (src/cli/hang_report.c,
 * docs/hangs.md). */
#ifndef MPT_CLI_HANG_REPORT_H
#define MPT_CLI_HANG_REPORT_H

/* Runs `mpitrain hang-report ARGS` with argv[0] = "hang-report". Prints the report to stdout
 * (errors to stderr) and returns the exit status: 0 report printed, 1 no dump could be read,
 * 2 bad usage. */
int mpt_cli_hang_report(int argc, char **argv);

#endif
