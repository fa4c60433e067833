/* The program's --version text and the launcher's rank as seen before MPI starts. */
#ifndef MPT_CLI_VERSION_H
#define MPT_CLI_VERSION_H

#include <stdio.h>

/* Prints the version, the build's features (CUDA, NCCL, oneDNN, fault injection) and the
 * versions of the libraries loaded (MPI, OpenBLAS, zlib, oneDNN, CUDA, NCCL), one per line. */
void mpt_cli_print_version(FILE *f);
/* This process's rank from the launcher's environment (mpirun, srun, PMIx, PMI), or -1 when no
 * launcher started it. Used before MPI is initialised (bad usage: print once, not per rank). */
int mpt_cli_launcher_rank(void);

#endif
