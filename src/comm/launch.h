/* How the job was launched, decided from a snapshot of the launcher's environment variables and
 * MPI's own view of the world. Everything here is pure (no getenv after the snapshot, no MPI
 * calls), so tests feed fake environments (tests/test_launch.c).
 *
 * The rules (docs/faults.md F12, F14):
 * - OMPI_COMM_WORLD_SIZE present: Open MPI's mpirun started us. SLURM_* variables then belong to
 *   the surrounding allocation (mpirun inside sbatch) and are ignored: SLURM_NTASKS is the
 *   allocation's task count, and SLURM_LOCALID / SLURM_PROCID were inherited from the batch
 *   shell (stale, usually 0 on every rank).
 * - Otherwise SLURM_STEP_ID (or SLURM_STEPID) present: srun started us (a job step); its task
 *   count is SLURM_STEP_NUM_TASKS, else SLURM_NTASKS.
 * - Otherwise a plain process; SLURM_NTASKS without a step means the program was started
 *   directly inside an allocation (a batch script without srun or mpirun).
 * - A launcher that says N > 1 tasks while MPI sees a world of 1 is an error (MPT_EMISMATCH):
 *   every rank would train alone. Other disagreements of counts are notes only.
 * - MPI is the authority for rank, world size and local rank (MPI_Comm_split_type); where the
 *   launcher's variables disagree the disagreement is written to the notes (logged at debug). */
#ifndef MPT_COMM_LAUNCH_H
#define MPT_COMM_LAUNCH_H

#include "mpitrain/comm.h"

/* The variables read, in the order of the fields of mpt__launch_env. */
#define MPT__LAUNCH_VARS(X)                                    \
  X(ompi_world_size, "OMPI_COMM_WORLD_SIZE")                   \
  X(ompi_world_rank, "OMPI_COMM_WORLD_RANK")                   \
  X(ompi_local_rank, "OMPI_COMM_WORLD_LOCAL_RANK")             \
  X(ompi_local_size, "OMPI_COMM_WORLD_LOCAL_SIZE")             \
  X(slurm_ntasks, "SLURM_NTASKS")                              \
  X(slurm_step_num_tasks, "SLURM_STEP_NUM_TASKS")              \
  X(slurm_procid, "SLURM_PROCID")                              \
  X(slurm_localid, "SLURM_LOCALID")                            \
  X(slurm_step_id, "SLURM_STEP_ID")                            \
  X(slurm_stepid, "SLURM_STEPID")

/* A snapshot of the variables: each value copied (empty string = unset). */
typedef struct mpt__launch_env {
#define MPT__LAUNCH_FIELD(field, name) char field[32];
  MPT__LAUNCH_VARS(MPT__LAUNCH_FIELD)
#undef MPT__LAUNCH_FIELD
} mpt__launch_env;

/* MPI's view: world size and rank of MPI_COMM_WORLD, rank and size in the shared-memory
 * communicator (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). */
typedef struct mpt__mpi_view {
  int world_size, rank, local_rank, local_size;
} mpt__mpi_view;

typedef struct mpt__launch_result {
  mpt_launcher launcher;
  int rank, world_size, local_rank, local_size; /* always MPI's */
  int launcher_tasks;        /* the task count the launcher claims, -1 when it says nothing */
  const char *launcher_var;  /* the variable that said so ("SLURM_NTASKS"), or NULL */
  char notes[768];           /* disagreements and ignored variables, "" if none */
} mpt__launch_result;

/* Clears the snapshot (all unset). */
void mpt__launch_env_clear(mpt__launch_env *env);
/* Sets one variable by its name ("SLURM_NTASKS"); NULL or "" unsets it. Values longer than the
 * field are cut (they are malformed anyway). Errors: MPT_EINVAL for a name not in the table. */
mpt_status mpt__launch_env_set(mpt__launch_env *env, const char *name, const char *value);
/* Fills the snapshot from the process environment (getenv). Call it before MPI_Init: some MPI
 * libraries write OMPI_* or PMI variables into the environment during initialisation. */
void mpt__launch_env_capture(mpt__launch_env *env);

/* The pure decision. Always fills *result (launcher, MPI's numbers, notes). Returns MPT_OK, or
 * MPT_EMISMATCH with a detail naming the variable, the task count and the likely cause when a
 * launcher says N > 1 tasks and MPI sees a world of 1. Errors: MPT_EINVAL on NULL arguments. */
mpt_status mpt__launch_resolve(const mpt__launch_env *env, const mpt__mpi_view *mpi,
                               mpt__launch_result *result);

/* "MPI_THREAD_MULTIPLE" etc. for the MPI constants; "MPI_THREAD_<n>" for anything else. */
const char *mpt__mpi_thread_level_name(int level);
/* MPT_OK when provided >= required, else MPT_ECOMM with a detail naming both levels. */
mpt_status mpt__mpi_thread_level_check(int required, int provided);

#endif
