/* Bootstrap of a comm over MPI: MPI_Init_thread (MPI_THREAD_MULTIPLE) unless MPI is already
 * initialised, the thread-level check (F15), the comm's own communicator (MPI_COMM_WORLD
 * duplicated with a deadline, errors returned), the local rank from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the hostname, the agreement of the settings that
 * must be equal on every rank, and the launcher decision (launch.c; F12, F14).
 *
 * Runs on the caller's thread. Process-wide state: whether this layer called MPI_Init_thread
 * (so that mpt_comm_finalize knows whether to call MPI_Finalize), and the stage the running
 * bootstrap waits in (mpt_comm_bootstrap_stage, read by watchdogs on other threads); MPI itself
 * is process-wide. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm/launch.h"

static atomic_int mpi_owned;
static _Atomic(const char *) boot_stage; /* see mpt_comm_bootstrap_stage; NULL: none */

int mpt__comm_mpi_owned(void) { return atomic_load(&mpi_owned); }

const char *mpt_comm_bootstrap_stage(void) {
  const char *s = atomic_load(&boot_stage);
  return s ? s : "";
}

/* MPT_CHECK_COLLECTIVES: set and not "0" (or "no"/"false"/"off") turns checked mode on. */
static int env_check_collectives(void) {
  const char *v = getenv("MPT_CHECK_COLLECTIVES");
  if (!v || !v[0]) return 0;
  return strcmp(v, "0") != 0 && strcmp(v, "no") != 0 && strcmp(v, "false") != 0 &&
         strcmp(v, "off") != 0;
}

/* Makes the settings that shape the sequence of MPI calls equal on every rank: checked mode
 * and agreement are on if any rank wants them, the chunk size is the smallest, and the progress
 * mode is polling if any rank asks for it (MPI does not match a blocking collective with a
 * non-blocking one, so the mode must be the same everywhere). */
static mpt_status agree_settings(mpt_comm *c, double deadline_ms) {
  int64_t mine[4] = {c->config.check_collectives ? 1 : 0, c->config.confirm_collectives ? 1 : 0,
                     -c->config.max_chunk_count, c->config.blocking ? 0 : 1};
  int64_t all[4];
  MPI_Request req;
  int done = 0;
  int rc = MPI_Iallreduce(mine, all, 4, MPI_INT64_T, MPI_MAX, c->mpi_comm, &req);
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS)
    return MPT_MPI_FAIL(rc, c->rank, "MPI_Iallreduce of the comm settings (bootstrap)");
  if (!done)
    return MPT_FAIL(MPT_ETIMEOUT,
                    "bootstrap: the settings exchange did not complete within %g s on rank %d",
                    c->config.timeout_ms / 1000.0, c->rank);
  c->config.check_collectives = (int)all[0];
  c->config.confirm_collectives = (int)all[1];
  c->config.max_chunk_count = -all[2];
  c->config.blocking = all[3] ? 0 : 1;
  return MPT_OK;
}

static mpt_status bootstrap(mpt_comm *c, const mpt_comm_config *config);

mpt_status mpt__comm_bootstrap(mpt_comm *c, const mpt_comm_config *config) {
  mpt_status st = bootstrap(c, config);
  atomic_store(&boot_stage, NULL);
  return st;
}

static mpt_status bootstrap(mpt_comm *c, const mpt_comm_config *config) {
  mpt_status st = MPT_OK;
  mpt__launch_env env;
  mpt__launch_env_capture(&env); /* before MPI_Init: MPI may write to the environment */
  c->config = *config;
  if (env_check_collectives()) c->config.check_collectives = 1;
  c->mpi_comm = MPI_COMM_NULL;
  c->rank = -1;

  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return MPT_FAIL(MPT_ESTATE, "MPI was already finalized: a comm cannot be created any more");
  if (!initialized) {
    /* Open MPI's progress engine spins while a blocking collective waits for its peers; the comm
     * worker overlaps collectives with the backward pass, so its spinning takes the core from
     * the rank's compute threads (or the other rank's) whenever threads outnumber cores.
     * mpi_yield_when_idle makes it yield instead (comm.h, mpt_comm_init). A value the user or
     * mpirun's --mca set wins; the call runs before any thread of ours reads the environment. */
    if (setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0) != 0)
      return MPT_FAIL(MPT_ENOMEM, "setenv(OMPI_MCA_mpi_yield_when_idle): %s", strerror(errno));
    atomic_store(&boot_stage, "MPI_Init_thread, which returns once every process of the job has "
                              "started and initialised MPI");
    mpt__init_watchdog *wd = NULL;
    if (config->init_timeout_ms > 0)
      MPT_RETURN_IF(mpt__init_watchdog_start(config->init_timeout_ms / 1e3, &wd));
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    mpt__init_watchdog_stop(wd);
    if (rc != MPI_SUCCESS) return MPT_MPI_FAIL(rc, -1, "MPI_Init_thread(MPI_THREAD_MULTIPLE)");
    atomic_store(&mpi_owned, 1);
  } else {
    MPT_MPI_CHECK(MPI_Query_thread(&provided), -1, fail);
  }
  MPT_CHECK(mpt__mpi_thread_level_check(MPI_THREAD_MULTIPLE, provided), fail);

  /* Open MPI 4.1 raises errors of non-blocking collectives (libnbc) on MPI_COMM_WORLD's handler
   * whatever their communicator, so it must return errors too, or a failed collective would
   * kill the process before we can name it. */
  MPT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), -1, fail);
  MPT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->world_size), -1, fail);
  MPT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), -1, fail);

  /* The duplicate, with a deadline: it completes only when every rank has reached this point,
   * and after it the blocking MPI_Comm_split_type cannot wait for an absent rank. */
  double deadline_ms = mpt_time_ms() + c->config.timeout_ms;
  atomic_store(&boot_stage, "MPI_Comm_idup of MPI_COMM_WORLD, which completes once every rank "
                            "has reached mpt_comm_init");
  MPI_Request req;
  int done = 0;
  MPT_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &c->mpi_comm, &req), c->rank, fail);
  int rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS) {
    st = MPT_MPI_FAIL(rc, c->rank, "MPI_Comm_idup of MPI_COMM_WORLD (bootstrap)");
    goto fail;
  }
  if (!done) {
    c->mpi_comm = MPI_COMM_NULL; /* not valid until the duplication completes */
    st = MPT_FAIL(MPT_ETIMEOUT,
                  "bootstrap: not every rank reached mpt_comm_init within %g s (rank %d of %d "
                  "waited in MPI_Comm_idup)",
                  c->config.timeout_ms / 1000.0, c->rank, c->world_size);
    goto fail;
  }
  MPT_MPI_CHECK(MPI_Comm_set_errhandler(c->mpi_comm, MPI_ERRORS_RETURN), c->rank, fail_comm);

  atomic_store(&boot_stage, "MPI_Comm_split_type (the ranks of each host)");
  MPI_Comm node = MPI_COMM_NULL;
  MPT_MPI_CHECK(MPI_Comm_split_type(c->mpi_comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL,
                                    &node),
                c->rank, fail_comm);
  int rc_rank = MPI_Comm_rank(node, &c->local_rank);
  int rc_size = MPI_Comm_size(node, &c->local_size);
  if (gethostname(c->hostname, sizeof c->hostname) != 0)
    snprintf(c->hostname, sizeof c->hostname, "unknown-host");
  c->hostname[sizeof c->hostname - 1] = '\0';
  atomic_store(&boot_stage, "MPI_Win_allocate_shared of the progress records (the ranks of "
                            "each host)");
  if (rc_rank == MPI_SUCCESS && rc_size == MPI_SUCCESS) mpt__progress_init(c, node);
  MPI_Comm_free(&node);
  MPT_MPI_CHECK(rc_rank, c->rank, fail_comm);
  MPT_MPI_CHECK(rc_size, c->rank, fail_comm);

  atomic_store(&boot_stage, "the exchange of the comm settings between the ranks");
  MPT_CHECK(agree_settings(c, deadline_ms), fail_comm);
  atomic_store(&boot_stage, "the exchange of the ranks' hosts and process ids");
  MPT_CHECK(mpt__flight_gather_peers(c, deadline_ms), fail_comm);

  mpt__mpi_view view = {c->world_size, c->rank, c->local_rank, c->local_size};
  mpt__launch_result launch;
  MPT_CHECK(mpt__launch_resolve(&env, &view, &launch), fail_comm);
  c->launcher = launch.launcher;
  snprintf(c->launch_notes, sizeof c->launch_notes, "%s", launch.notes);
  return MPT_OK;

fail_comm:
  MPI_Comm_free(&c->mpi_comm);
  c->mpi_comm = MPI_COMM_NULL;
fail:
  return st;
}
