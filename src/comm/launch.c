/* The launcher decision (see launch.h for the rules) and MPI thread-level names. Pure functions
 * over a snapshot of the environment and MPI's view; mpt__launch_env_capture is the only
 * function here that reads the process environment. No MPI calls (mpi.h only for the constants
 * of the thread levels). */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/launch.h"

void mpt__launch_env_clear(mpt__launch_env *env) { memset(env, 0, sizeof *env); }

mpt_status mpt__launch_env_set(mpt__launch_env *env, const char *name, const char *value) {
  if (!env || !name) return MPT_FAIL(MPT_EINVAL, "NULL launcher environment or variable name");
  if (!value) value = "";
#define MPT__LAUNCH_SET(field, var)                              \
  if (strcmp(name, var) == 0) {                                  \
    snprintf(env->field, sizeof env->field, "%s", value);        \
    return MPT_OK;                                               \
  }
  MPT__LAUNCH_VARS(MPT__LAUNCH_SET)
#undef MPT__LAUNCH_SET
  return MPT_FAIL(MPT_EINVAL, "'%s' is not a launcher variable this layer reads", name);
}

void mpt__launch_env_capture(mpt__launch_env *env) {
  mpt__launch_env_clear(env);
#define MPT__LAUNCH_GET(field, var) mpt__launch_env_set(env, var, getenv(var));
  MPT__LAUNCH_VARS(MPT__LAUNCH_GET)
#undef MPT__LAUNCH_GET
}

/* Parses a non-negative decimal int; -1 when unset, -2 when malformed. */
static int parse_count(const char *text) {
  if (!text || !text[0]) return -1;
  char *end;
  long v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 0 || v > 1 << 30) return -2;
  return (int)v;
}

/* Appends one sentence to the notes (cut when full). */
static void note(mpt__launch_result *r, const char *fmt, ...) MPT_PRINTF(2, 3);
static void note(mpt__launch_result *r, const char *fmt, ...) {
  size_t used = strlen(r->notes);
  if (used + 2 >= sizeof r->notes) return;
  if (used) {
    r->notes[used++] = ';';
    r->notes[used++] = ' ';
    r->notes[used] = '\0';
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->notes + used, sizeof r->notes - used, fmt, ap);
  va_end(ap);
}

/* Compares a launcher variable with MPI's value; disagreements and malformed values are notes. */
static void cross_check(mpt__launch_result *r, const char *var, const char *text, int mpi_value,
                        const char *what) {
  int v = parse_count(text);
  if (v == -2)
    note(r, "%s='%s' is not a number (ignored)", var, text);
  else if (v >= 0 && v != mpi_value)
    note(r, "%s=%d disagrees with MPI's %s %d (MPI's value is used)", var, v, what, mpi_value);
}

/* The task count Slurm claims: the step's when known, else the allocation's. */
static void slurm_tasks(mpt__launch_result *r, const mpt__launch_env *env, int step_tasks,
                        int ntasks) {
  if (step_tasks == -2)
    note(r, "SLURM_STEP_NUM_TASKS='%s' is not a number (ignored)", env->slurm_step_num_tasks);
  if (ntasks == -2)
    note(r, "SLURM_NTASKS='%s' is not a number (ignored)", env->slurm_ntasks);
  if (step_tasks >= 0) {
    r->launcher_var = "SLURM_STEP_NUM_TASKS";
    r->launcher_tasks = step_tasks;
  } else if (ntasks >= 0) {
    r->launcher_var = "SLURM_NTASKS";
    r->launcher_tasks = ntasks;
  }
}

mpt_status mpt__launch_resolve(const mpt__launch_env *env, const mpt__mpi_view *mpi,
                               mpt__launch_result *r) {
  if (!env || !mpi || !r) return MPT_FAIL(MPT_EINVAL, "NULL argument to the launcher decision");
  memset(r, 0, sizeof *r);
  r->launcher = MPT_LAUNCHER_PLAIN;
  r->rank = mpi->rank;
  r->world_size = mpi->world_size;
  r->local_rank = mpi->local_rank;
  r->local_size = mpi->local_size;
  r->launcher_tasks = -1;

  int ompi_size = parse_count(env->ompi_world_size);
  int in_step = env->slurm_step_id[0] || env->slurm_stepid[0];
  int step_tasks = parse_count(env->slurm_step_num_tasks);
  int ntasks = parse_count(env->slurm_ntasks);
  int has_slurm = env->slurm_ntasks[0] || env->slurm_procid[0] || env->slurm_localid[0] ||
                  env->slurm_step_num_tasks[0] || in_step;

  if (ompi_size != -1) {
    /* mpirun (possibly inside a Slurm allocation: its SLURM_* are the batch shell's). */
    r->launcher = MPT_LAUNCHER_MPIRUN;
    r->launcher_var = "OMPI_COMM_WORLD_SIZE";
    if (ompi_size == -2)
      note(r, "OMPI_COMM_WORLD_SIZE='%s' is not a number (ignored)", env->ompi_world_size);
    else
      r->launcher_tasks = ompi_size;
    cross_check(r, "OMPI_COMM_WORLD_RANK", env->ompi_world_rank, mpi->rank, "rank");
    cross_check(r, "OMPI_COMM_WORLD_LOCAL_RANK", env->ompi_local_rank, mpi->local_rank,
                "local rank");
    cross_check(r, "OMPI_COMM_WORLD_LOCAL_SIZE", env->ompi_local_size, mpi->local_size,
                "local size");
    if (has_slurm) {
      int localid = parse_count(env->slurm_localid);
      if (localid >= 0 && localid != mpi->local_rank)
        note(r, "SLURM_LOCALID=%d was inherited from the Slurm allocation and is ignored under "
                "mpirun (local rank %d from MPI)", localid, mpi->local_rank);
      else
        note(r, "SLURM_* variables belong to the surrounding allocation and are ignored under "
                "mpirun");
    }
  } else if (in_step) {
    r->launcher = MPT_LAUNCHER_SRUN;
    slurm_tasks(r, env, step_tasks, ntasks);
    cross_check(r, "SLURM_PROCID", env->slurm_procid, mpi->rank, "rank");
    cross_check(r, "SLURM_LOCALID", env->slurm_localid, mpi->local_rank, "local rank");
  } else if (has_slurm) {
    /* Inside an allocation but not in a step: the program was started directly (a batch
     * script without srun or mpirun). */
    slurm_tasks(r, env, step_tasks, ntasks);
  }

  int n = r->launcher_tasks;
  if (n > 1 && mpi->world_size == 1) {
    switch (r->launcher) {
      case MPT_LAUNCHER_MPIRUN:
        return MPT_FAIL(MPT_EMISMATCH,
                        "%s=%d says mpirun started %d processes, but MPI sees a world of 1: each "
                        "process would train alone. Likely cause: mpirun from a different MPI "
                        "than the one this program was built with (use the mpirun of the MPI "
                        "that mpicc belongs to)",
                        r->launcher_var, n, n);
      case MPT_LAUNCHER_SRUN:
        return MPT_FAIL(MPT_EMISMATCH,
                        "%s=%d says srun started %d tasks, but MPI sees a world of 1: each task "
                        "would train alone. Likely cause: srun without a working PMI plugin; "
                        "use srun --mpi=pmix (check with srun --mpi=list)",
                        r->launcher_var, n, n);
      default:
        return MPT_FAIL(MPT_EMISMATCH,
                        "%s=%d says the Slurm allocation has %d tasks, but MPI sees a world of "
                        "1. Likely cause: srun without a working PMI plugin (use srun "
                        "--mpi=pmix), or the program was started without srun or mpirun inside "
                        "the allocation (use srun --mpi=pmix or mpirun -np %d)",
                        r->launcher_var, n, n, n);
    }
  }
  if (n >= 0 && n != mpi->world_size)
    note(r, "%s=%d disagrees with MPI's world size %d (MPI's value is used)", r->launcher_var,
         n, mpi->world_size);
  return MPT_OK;
}

const char *mpt__mpi_thread_level_name(int level) {
  static _Thread_local char other[32];
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  snprintf(other, sizeof other, "MPI_THREAD_<%d>", level);
  return other;
}

mpt_status mpt__mpi_thread_level_check(int required, int provided) {
  if (provided >= required) return MPT_OK;
  return MPT_FAIL(MPT_ECOMM,
                  "MPI provides thread level %s but mpitrain needs %s (the communication "
                  "worker thread calls MPI while the caller's thread may too); use an MPI "
                  "built with thread support, or initialise MPI with %s before mpt_comm_init",
                  mpt__mpi_thread_level_name(provided), mpt__mpi_thread_level_name(required),
                  mpt__mpi_thread_level_name(required));
}
