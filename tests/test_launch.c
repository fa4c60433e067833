/* Tests of the launcher decision (src/comm/launch.c) on fake environments: no MPI is started
 * for these cases (docs/faults.md F12, F14, F15).
 *
 * `test_launch --init` instead creates a real comm with the process's environment and prints
 * "launcher: <name>, world <n>" (exit 0) or the error (exit 1); tests/test_launch_singleton.sh
 * uses it for F14 end to end. */
#include "config.h"

#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/launch.h"
#include "mpitrain/comm.h"

/* Builds an environment from "NAME=value" strings (NULL-terminated). */
static mpt__launch_env make_env(const char *const *vars) {
  mpt__launch_env env;
  mpt__launch_env_clear(&env);
  for (; *vars; vars++) {
    char name[64];
    const char *eq = strchr(*vars, '=');
    ck_assert_ptr_nonnull(eq);
    snprintf(name, sizeof name, "%.*s", (int)(eq - *vars), *vars);
    ck_assert_int_eq(mpt__launch_env_set(&env, name, eq + 1), MPT_OK);
  }
  return env;
}

START_TEST(test_launch_plain_process_is_plain) {
  const char *vars[] = {NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_PLAIN);
  ck_assert_int_eq(r.launcher_tasks, -1);
  ck_assert_int_eq(r.world_size, 1);
  ck_assert_str_eq(r.notes, "");
}
END_TEST

START_TEST(test_launch_mpirun_is_detected) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=2",
                        "OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=4", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {4, 2, 2, 4};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_MPIRUN);
  ck_assert_int_eq(r.launcher_tasks, 4);
  ck_assert_str_eq(r.launcher_var, "OMPI_COMM_WORLD_SIZE");
  ck_assert_int_eq(r.rank, 2);
  ck_assert_int_eq(r.local_rank, 2);
  ck_assert_str_eq(r.notes, "");
}
END_TEST

START_TEST(test_launch_srun_is_detected) {
  const char *vars[] = {"SLURM_STEP_ID=0", "SLURM_NTASKS=4", "SLURM_PROCID=3",
                        "SLURM_LOCALID=1", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {4, 3, 1, 2};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_SRUN);
  ck_assert_int_eq(r.launcher_tasks, 4);
  ck_assert_str_eq(r.launcher_var, "SLURM_NTASKS");
  ck_assert_int_eq(r.local_rank, 1);
  ck_assert_str_eq(r.notes, "");
}
END_TEST

START_TEST(test_launch_srun_step_count_beats_allocation_count) {
  /* srun -n 2 inside a 4-task allocation: the step's count is the one that matters. */
  const char *vars[] = {"SLURM_STEP_ID=1", "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=2",
                        "SLURM_PROCID=1", "SLURM_LOCALID=1", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {2, 1, 1, 2};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_SRUN);
  ck_assert_int_eq(r.launcher_tasks, 2);
  ck_assert_str_eq(r.launcher_var, "SLURM_STEP_NUM_TASKS");
  ck_assert_str_eq(r.notes, "");
}
END_TEST

START_TEST(test_launch_srun_without_pmi_names_mpi_pmix) {
  const char *vars[] = {"SLURM_STEP_ID=0", "SLURM_NTASKS=4", "SLURM_PROCID=2",
                        "SLURM_LOCALID=2", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1}; /* every task is a singleton */
  mpt__launch_result r;
  mpt_error_clear();
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_EMISMATCH);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_SRUN);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "SLURM_NTASKS=4"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "world of 1"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "srun --mpi=pmix"));
}
END_TEST

START_TEST(test_launch_allocation_without_launcher_names_mpi_pmix) {
  /* The program started directly in a 4-task batch script (or srun that set no step id). */
  const char *vars[] = {"SLURM_NTASKS=4", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1};
  mpt__launch_result r;
  mpt_error_clear();
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_EMISMATCH);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_PLAIN);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "SLURM_NTASKS=4"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "--mpi=pmix"));
}
END_TEST

START_TEST(test_launch_mpirun_of_other_mpi_is_an_error) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=3", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1};
  mpt__launch_result r;
  mpt_error_clear();
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_EMISMATCH);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_MPIRUN);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "OMPI_COMM_WORLD_SIZE=4"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "world of 1"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "different MPI"));
}
END_TEST

START_TEST(test_launch_mpirun_in_allocation_ignores_stale_slurm_localid) {
  /* F12: mpirun -np 4 inside an 8-task allocation; every rank inherited SLURM_LOCALID=0 and
   * SLURM_PROCID=0 from the batch shell. Local ranks must be Open MPI's / MPI's 0..3. */
  for (int rank = 0; rank < 4; rank++) {
    char ompi_rank[64], ompi_local[64];
    snprintf(ompi_rank, sizeof ompi_rank, "OMPI_COMM_WORLD_RANK=%d", rank);
    snprintf(ompi_local, sizeof ompi_local, "OMPI_COMM_WORLD_LOCAL_RANK=%d", rank);
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE=4", ompi_rank, ompi_local,
                          "OMPI_COMM_WORLD_LOCAL_SIZE=4", "SLURM_NTASKS=8", "SLURM_LOCALID=0",
                          "SLURM_PROCID=0", "SLURM_STEP_ID=0", NULL};
    mpt__launch_env env = make_env(vars);
    mpt__mpi_view mpi = {4, rank, rank, 4};
    mpt__launch_result r;
    ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
    ck_assert_int_eq(r.launcher, MPT_LAUNCHER_MPIRUN);
    ck_assert_int_eq(r.launcher_tasks, 4);
    ck_assert_int_eq(r.local_rank, rank);
    ck_assert_int_eq(r.rank, rank);
    if (rank > 0) ck_assert_ptr_nonnull(strstr(r.notes, "SLURM_LOCALID=0"));
  }
}
END_TEST

START_TEST(test_launch_mpirun_np1_in_allocation_is_fine) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE=1", "SLURM_NTASKS=4", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_MPIRUN);
  ck_assert_int_eq(r.launcher_tasks, 1);
}
END_TEST

START_TEST(test_launch_mpi_local_rank_wins_over_launcher) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1",
                        "OMPI_COMM_WORLD_LOCAL_RANK=5", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {2, 1, 1, 2};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.local_rank, 1);
  ck_assert_ptr_nonnull(strstr(r.notes, "OMPI_COMM_WORLD_LOCAL_RANK=5"));
}
END_TEST

START_TEST(test_launch_malformed_count_is_a_note) {
  const char *vars[] = {"SLURM_STEP_ID=0", "SLURM_NTASKS=four", NULL};
  mpt__launch_env env = make_env(vars);
  mpt__mpi_view mpi = {1, 0, 0, 1};
  mpt__launch_result r;
  ck_assert_int_eq(mpt__launch_resolve(&env, &mpi, &r), MPT_OK);
  ck_assert_int_eq(r.launcher, MPT_LAUNCHER_SRUN);
  ck_assert_int_eq(r.launcher_tasks, -1);
  ck_assert_ptr_nonnull(strstr(r.notes, "SLURM_NTASKS='four'"));
}
END_TEST

START_TEST(test_launch_unknown_variable_is_rejected) {
  mpt__launch_env env;
  mpt__launch_env_clear(&env);
  ck_assert_int_eq(mpt__launch_env_set(&env, "SLURM_NOPE", "1"), MPT_EINVAL);
  ck_assert_int_eq(mpt__launch_env_set(&env, "SLURM_NTASKS", "3"), MPT_OK);
  ck_assert_str_eq(env.slurm_ntasks, "3");
  ck_assert_int_eq(mpt__launch_env_set(&env, "SLURM_NTASKS", NULL), MPT_OK);
  ck_assert_str_eq(env.slurm_ntasks, "");
}
END_TEST

START_TEST(test_launch_thread_level_too_low_names_both_levels) {
  mpt_error_clear();
  ck_assert_int_eq(mpt__mpi_thread_level_check(MPI_THREAD_MULTIPLE, MPI_THREAD_SERIALIZED),
                   MPT_ECOMM);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "MPI_THREAD_SERIALIZED"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "MPI_THREAD_MULTIPLE"));
  ck_assert_int_eq(mpt__mpi_thread_level_check(MPI_THREAD_MULTIPLE, MPI_THREAD_MULTIPLE),
                   MPT_OK);
  ck_assert_str_eq(mpt__mpi_thread_level_name(MPI_THREAD_FUNNELED), "MPI_THREAD_FUNNELED");
}
END_TEST

START_TEST(test_launch_names) {
  ck_assert_str_eq(mpt_launcher_name(MPT_LAUNCHER_PLAIN), "plain process");
  ck_assert_str_eq(mpt_launcher_name(MPT_LAUNCHER_MPIRUN), "mpirun");
  ck_assert_str_eq(mpt_launcher_name(MPT_LAUNCHER_SRUN), "srun");
  ck_assert_str_eq(mpt_launcher_name((mpt_launcher)99), "unknown");
  ck_assert_str_eq(mpt_reduce_op_name(MPT_REDUCE_AVG), "avg");
  ck_assert_str_eq(mpt_comm_backend_name(MPT_COMM_BACKEND_NCCL), "nccl");
}
END_TEST

/* NCCL: not built -> MPT_ENOTSUP; built, but asked for on the CPU -> MPT_EINVAL. Both before
 * MPI is touched. */
START_TEST(test_launch_nccl_backend_needs_nccl_and_a_cuda_device) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.backend = MPT_COMM_BACKEND_NCCL;
  mpt_comm *comm = (mpt_comm *)1;
#ifdef MPT_HAVE_NCCL
  ck_assert_int_eq(mpt_comm_init(&comm, &cfg), MPT_EINVAL);
#else
  ck_assert_int_eq(mpt_comm_init(&comm, &cfg), MPT_ENOTSUP);
#endif
  ck_assert_ptr_null(comm);
  cfg = mpt_comm_config_default();
  cfg.timeout_ms = 0;
  ck_assert_int_eq(mpt_comm_init(&comm, &cfg), MPT_EINVAL);
}
END_TEST

/* F14 end to end: a real comm from the real environment. */
static int run_init(void) {
  mpt_comm *comm = NULL;
  mpt_status st = mpt_comm_init(&comm, NULL);
  if (st != MPT_OK) {
    fprintf(stderr, "test_launch: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_finalize();
    return 1;
  }
  const char *yield = getenv("OMPI_MCA_mpi_yield_when_idle");
  printf("launcher: %s, world %d, rank %d, local rank %d of %d, host %s, yield when idle %s\n",
         mpt_launcher_name(mpt_comm_launcher(comm)), mpt_comm_world_size(comm),
         mpt_comm_rank(comm), mpt_comm_local_rank(comm), mpt_comm_local_size(comm),
         mpt_comm_hostname(comm), yield ? yield : "(unset)");
  mpt_comm_free(comm);
  st = mpt_comm_finalize();
  return st == MPT_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--init") == 0) return run_init();
  Suite *s = suite_create("launch");
  TCase *tc = tcase_create("launch");
  tcase_add_test(tc, test_launch_plain_process_is_plain);
  tcase_add_test(tc, test_launch_mpirun_is_detected);
  tcase_add_test(tc, test_launch_srun_is_detected);
  tcase_add_test(tc, test_launch_srun_step_count_beats_allocation_count);
  tcase_add_test(tc, test_launch_srun_without_pmi_names_mpi_pmix);
  tcase_add_test(tc, test_launch_allocation_without_launcher_names_mpi_pmix);
  tcase_add_test(tc, test_launch_mpirun_of_other_mpi_is_an_error);
  tcase_add_test(tc, test_launch_mpirun_in_allocation_ignores_stale_slurm_localid);
  tcase_add_test(tc, test_launch_mpirun_np1_in_allocation_is_fine);
  tcase_add_test(tc, test_launch_mpi_local_rank_wins_over_launcher);
  tcase_add_test(tc, test_launch_malformed_count_is_a_note);
  tcase_add_test(tc, test_launch_unknown_variable_is_rejected);
  tcase_add_test(tc, test_launch_thread_level_too_low_names_both_levels);
  tcase_add_test(tc, test_launch_names);
  tcase_add_test(tc, test_launch_nccl_backend_needs_nccl_and_a_cuda_device);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
