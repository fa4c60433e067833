/* Tests for src/ckpt (include/mpitrain/ckpt.h): round trips of checkpoints, the atomic writer,
 * directories of checkpoints, and (with --mpi, under mpirun) the collective wrappers. The
 * reader's checks of the format (layout, damaged files, versions, a different model or
 * optimizer, bad arguments) are tested in tests/test_ckpt_format.c.
 *
 * Oracles: a round trip is compared byte for byte (memcmp) with what was saved, and a resumed
 * optimizer step with an uninterrupted one; a failed load must give an error status and leave
 * the model's bytes untouched; a writer killed (SIGKILL, through MPT_TEST_CKPT_KILL) leaves the previous checkpoint loadable
 * with its own values.
 *
 * Models are tiny and built by hand (parameters and buffers with chosen names and shapes), on
 * the CPU (tests/ckpt_util.h). Each test works in its own temporary directory. Without --mpi the tests fork (Check's
 * default), so a crash in the reader is reported as a failed test, not a dead program. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h" /* MPT_FAULT_INJECTION: the killed-writer tests need its hook */
#include "mpitrain.h"
#include "ckpt_util.h"

/* ------------------------------------------------------------------------------------------ */
/* Round trips                                                                                */

START_TEST(test_ckpt_round_trip_is_bit_exact) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  mpt_model *b = make_model(MODEL_BASE, 99);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 1, 5);
  mpt_ckpt_meta want = sample_meta(), got = mpt_ckpt_meta_default();
  ck_assert_int_eq(mpt_ckpt_load(path, b, ob, &got), MPT_OK);
  check_same_model(a, b);
  check_same_opt(oa, ob);
  check_same_meta(&want, &got);
  ck_assert_int_eq(mpt_optimizer_step_count(ob), 3);
  /* read_meta sees the same meta and the optimizer state. */
  mpt_ckpt_meta m2;
  int has_opt = 0;
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &m2, &has_opt), MPT_OK);
  check_same_meta(&want, &m2);
  ck_assert_int_eq(has_opt, 1);
  mpt_optimizer_free(oa), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* Resuming: one more step after a load equals one more step of the original, bit for bit. */
START_TEST(test_ckpt_resumed_step_equals_uninterrupted_step) {
  const struct { mpt_optim_kind kind; float momentum; } cases[] = {
      {MPT_OPTIM_ADAMW, 0}, {MPT_OPTIM_SGD, 0.9f}, {MPT_OPTIM_SGD, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    mpt_model *a = make_model(MODEL_BASE, 3), *b = make_model(MODEL_BASE, 4);
    mpt_optimizer *oa = make_opt(a, cases[c].kind, cases[c].momentum, 2, 8);
    mpt_optimizer *ob = make_opt(b, cases[c].kind, cases[c].momentum, 0, 8);
    const char *path = tmp_path("resume.mpt");
    ck_assert_int_eq(mpt_ckpt_save(path, a, oa, NULL), MPT_OK);
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_OK);
    int64_t n = mpt_model_param_count(a);
    float *g = malloc((size_t)n * sizeof *g);
    mpt_rng rng;
    mpt_rng_seed(&rng, 1000 + c);
    mpt_rng_fill_uniform(&rng, g, n, -1.0f, 1.0f);
    ck_assert_int_eq(mpt_optimizer_step(oa, NULL, mpt_model_params(a), g, 0.05f), MPT_OK);
    ck_assert_int_eq(mpt_optimizer_step(ob, NULL, mpt_model_params(b), g, 0.05f), MPT_OK);
    check_same_model(a, b);
    check_same_opt(oa, ob);
    free(g);
    mpt_optimizer_free(oa), mpt_optimizer_free(ob);
    mpt_model_free(a), mpt_model_free(b);
  }
}
END_TEST

START_TEST(test_ckpt_without_optimizer_round_trips_and_refuses_an_optimizer) {
  mpt_model *a = make_model(MODEL_BASE, 1), *b = make_model(MODEL_BASE, 2);
  const char *path = tmp_path("noopt.mpt");
  ck_assert_int_eq(mpt_ckpt_save(path, a, NULL, NULL), MPT_OK);
  int has_opt = 1;
  mpt_ckpt_meta meta;
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &meta, &has_opt), MPT_OK);
  ck_assert_int_eq(has_opt, 0);
  ck_assert_int_eq(meta.world_size, 1);
  ck_assert_int_eq(meta.global_step, 0);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_SGD, 0.9f, 0, 1);
  snapshot s = take_snapshot(b);
  ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_ESHAPE);
  check_detail("no optimizer state", "no optimizer state", "sgd", NULL);
  check_snapshot(&s, b, "a load refused for the optimizer");
  ck_assert_int_eq(mpt_ckpt_load(path, b, NULL, NULL), MPT_OK);
  check_same_model(a, b);
  free_snapshot(&s);
  mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* A file with optimizer state loads into a model alone (evaluation). */
START_TEST(test_ckpt_optimizer_state_is_ignored_without_an_optimizer) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  mpt_model *b = make_model(MODEL_BASE, 5);
  ck_assert_int_eq(mpt_ckpt_load(path, b, NULL, NULL), MPT_OK);
  check_same_model(a, b);
  mpt_optimizer_free(oa);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST
/* ------------------------------------------------------------------------------------------ */
/* Crashes during a write                                                                     */

#ifdef MPT_FAULT_INJECTION
/* Saves model `m` over `path` in a child process that kills itself at `point`; returns the
 * child's pid after checking that it died of SIGKILL. */
static pid_t save_and_die(const char *path, mpt_model *m, mpt_optimizer *opt, const char *point) {
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("MPT_TEST_CKPT_KILL", point, 1);
    mpt_ckpt_save(path, m, opt, NULL);
    _exit(3); /* not reached when the hook works */
  }
  int wst = 0;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert_msg(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "the writer was not killed at %s",
                point);
  return pid;
}

START_TEST(test_ckpt_killed_writer_leaves_previous_checkpoint_intact) {
  const char *points[] = {"mid-write", "before-rename"};
  for (int p = 0; p < 2; p++) {
    mpt_model *a;
    mpt_optimizer *oa;
    const char *path = save_base(&a, &oa);
    snapshot saved = take_snapshot(a);
    /* change the model, then die while writing it over the old file */
    mpt_model *newer = make_model(MODEL_BASE, 77);
    mpt_optimizer *on = make_opt(newer, MPT_OPTIM_ADAMW, 0, 5, 9);
    pid_t pid = save_and_die(path, newer, on, points[p]);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)pid);
    ck_assert_msg(file_exists(tmp), "%s: no temporary file %s", points[p], tmp);
    /* the old checkpoint is intact and loads with its own values */
    mpt_model *b = make_model(MODEL_BASE, 5);
    mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 0, 1);
    mpt_ckpt_meta meta, want = sample_meta();
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, &meta), MPT_OK);
    check_snapshot(&saved, b, points[p]);
    check_same_opt(oa, ob);
    check_same_meta(&want, &meta);
    /* the temporary file is partial (mid-write) or complete (before rename) */
    mpt_status st = mpt_ckpt_read_meta(tmp, NULL, NULL);
    ck_assert_int_eq(st, p == 0 ? MPT_EFORMAT : MPT_OK);
    /* and a later save over it works (the stale temporary file does not get in the way) */
    ck_assert_int_eq(mpt_ckpt_save(path, newer, on, NULL), MPT_OK);
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_OK);
    check_same_model(newer, b);
    unlink(tmp);
    free_snapshot(&saved);
    mpt_optimizer_free(oa), mpt_optimizer_free(ob), mpt_optimizer_free(on);
    mpt_model_free(a), mpt_model_free(b), mpt_model_free(newer);
  }
}
END_TEST
#endif /* MPT_FAULT_INJECTION */

/* A save onto a directory is refused before anything is written (core/atomic_file replaces
 * only a regular file): no temporary file is left and what was there stays. (A rename that
 * fails is the fault-injection case MPT_TEST_CKPT_FAIL=rename.) */
START_TEST(test_ckpt_failed_save_removes_its_temporary_file) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  const char *target = tmp_path("adir");
  ck_assert_int_eq(mkdir(target, 0700), 0);
  char inner[600];
  snprintf(inner, sizeof inner, "%s/keep", target);
  write_file(inner, "x", 1);
  ck_assert_int_eq(mpt_ckpt_save(target, a, NULL, NULL), MPT_EINVAL);
  check_detail("folder", "is not a regular file", "a folder", NULL);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", target, (long)getpid());
  ck_assert(!file_exists(tmp));
  ck_assert(file_exists(inner));
  unlink(inner);
  rmdir(target);
  mpt_model_free(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Directories                                                                                */

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

START_TEST(test_ckpt_keep_last_k_deletes_the_oldest) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  char dir[600], path[700];
  snprintf(dir, sizeof dir, "%s/run/ckpts", tmpdir); /* created, with its parent */
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  for (int64_t step = 100; step <= 500; step += 100) {
    meta.global_step = step;
    ck_assert_int_eq(mpt_ckpt_save_dir(dir, 3, a, NULL, &meta, path, sizeof path), MPT_OK);
    char want[700];
    snprintf(want, sizeof want, "%s/ckpt-step%08lld.mpt", dir, (long long)step);
    ck_assert_str_eq(path, want);
    if (step == 100) { /* things that are not checkpoints are never deleted */
      char other[700];
      snprintf(other, sizeof other, "%s/notes.txt", dir);
      write_file(other, "n", 1);
      snprintf(other, sizeof other, "%s/ckpt-step00000001.mpt.tmp.999", dir);
      write_file(other, "t", 1);
    }
  }
  const char *want_present[] = {"ckpt-step00000300.mpt", "ckpt-step00000400.mpt",
                                "ckpt-step00000500.mpt", "notes.txt",
                                "ckpt-step00000001.mpt.tmp.999"};
  for (size_t i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, want_present[i]);
    ck_assert_msg(file_exists(path), "%s was deleted", want_present[i]);
  }
  ck_assert_int_eq(count_entries(dir), 5);
  /* A stale later checkpoint: the one just written is kept anyway (K = 1). */
  meta.global_step = 50;
  ck_assert_int_eq(mpt_ckpt_save_dir(dir, 1, a, NULL, &meta, path, sizeof path), MPT_OK);
  ck_assert(file_exists(path));
  snprintf(path, sizeof path, "%s/ckpt-step00000500.mpt", dir);
  ck_assert(file_exists(path));
  ck_assert_int_eq(count_entries(dir), 4); /* 500, 50, notes, tmp */
  /* K = 0 keeps everything */
  for (int64_t step = 1; step <= 3; step++) {
    meta.global_step = step;
    ck_assert_int_eq(mpt_ckpt_save_dir(dir, 0, a, NULL, &meta, NULL, 0), MPT_OK);
  }
  ck_assert_int_eq(count_entries(dir), 7);
  /* clean up the nested directories */
  remove_dir(dir);
  snprintf(dir, sizeof dir, "%s/run", tmpdir);
  rmdir(dir);
  mpt_model_free(a);
}
END_TEST

START_TEST(test_ckpt_find_latest_picks_the_highest_step) {
  char buf[700], want[700];
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, sizeof buf), MPT_ENOENT);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmp_path("nope"), buf, sizeof buf), MPT_ENOENT);
  const char *names[] = {"ckpt-step00000009.mpt", "ckpt-step00000010.mpt", "ckpt-step100.mpt",
                         "ckpt-step00000999.mpt.tmp.123", "ckpt-step.mpt", "ckpt-stepx.mpt",
                         "ckpt-step00005000.mpt.bak", "xckpt-step00007000.mpt"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) write_file(tmp_path(names[i]), "", 0);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, sizeof buf), MPT_OK);
  snprintf(want, sizeof want, "%s/ckpt-step100.mpt", tmpdir);
  ck_assert_str_eq(buf, want);
  /* a trailing slash does not double */
  char slash[600];
  snprintf(slash, sizeof slash, "%s/", tmpdir);
  ck_assert_int_eq(mpt_ckpt_find_latest(slash, buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, want);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, 10), MPT_EINVAL);
  /* resolve: a directory gives the latest, a file itself, a missing path ENOENT */
  ck_assert_int_eq(mpt_ckpt_resolve(tmpdir, buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, want);
  ck_assert_int_eq(mpt_ckpt_resolve(tmp_path(names[0]), buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, tmp_path(names[0]));
  ck_assert_int_eq(mpt_ckpt_resolve(tmp_path("missing"), buf, sizeof buf), MPT_ENOENT);
}
END_TEST

#ifdef MPT_FAULT_INJECTION
/* The latest checkpoint after a killed write is the last complete one, and it loads. */
START_TEST(test_ckpt_resume_dir_after_a_killed_write_loads_the_last_complete_one) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.global_step = 10;
  ck_assert_int_eq(mpt_ckpt_save_dir(tmpdir, 2, a, NULL, &meta, NULL, 0), MPT_OK);
  snapshot s = take_snapshot(a);
  mpt_model *newer = make_model(MODEL_BASE, 2);
  save_and_die(tmp_path("ckpt-step00000020.mpt"), newer, NULL, "mid-write");
  char path[700];
  ck_assert_int_eq(mpt_ckpt_resolve(tmpdir, path, sizeof path), MPT_OK);
  ck_assert_str_eq(path, tmp_path("ckpt-step00000010.mpt"));
  mpt_ckpt_meta got;
  ck_assert_int_eq(mpt_ckpt_load(path, newer, NULL, &got), MPT_OK);
  ck_assert_int_eq(got.global_step, 10);
  check_snapshot(&s, newer, "resume");
  free_snapshot(&s);
  mpt_model_free(a), mpt_model_free(newer);
}
END_TEST
#endif /* MPT_FAULT_INJECTION */

/* ------------------------------------------------------------------------------------------ */
/* Collective wrappers (--mpi, under mpirun; every rank runs every test in the same order)    */

static mpt_comm *comm;
static int rank, world;

START_TEST(test_ckpt_collective_save_then_every_rank_loads_rank0s_state) {
  /* every rank trains differently; rank 0's state is what gets saved */
  mpt_model *a = make_model(MODEL_BASE, 1 + (uint64_t)rank);
  mpt_optimizer *oa = make_opt(a, MPT_OPTIM_ADAMW, 0, 2 + rank, 7 + (uint64_t)rank);
  mpt_ckpt_meta meta = sample_meta(), got;
  meta.world_size = world;
  meta.global_step = 40;
  char path[700];
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 2, a, oa, &meta, path, sizeof path),
                   MPT_OK);
  ck_assert_str_eq(path, tmp_path("ckpt-step00000040.mpt"));
  ck_assert(file_exists(path)); /* complete and renamed before any rank returns */
  mpt_model *ref = make_model(MODEL_BASE, 1);
  mpt_optimizer *oref = make_opt(ref, MPT_OPTIM_ADAMW, 0, 2, 7);
  mpt_model *b = make_model(MODEL_BASE, 50 + (uint64_t)rank);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 0, 1);
  /* from the directory: its latest checkpoint is the one just written */
  ck_assert_int_eq(mpt_ckpt_load_collective(comm, tmpdir, b, ob, &got), MPT_OK);
  check_same_model(ref, b);
  check_same_opt(oref, ob);
  ck_assert_int_eq(got.world_size, world);
  ck_assert_int_eq(got.global_step, 40);
  mpt_optimizer_free(oa), mpt_optimizer_free(oref), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(ref), mpt_model_free(b);
}
END_TEST

START_TEST(test_ckpt_collective_save_error_reaches_every_rank) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  char bad[700];
  snprintf(bad, sizeof bad, "%s/afile/sub", tmpdir);
  if (rank == 0) write_file(tmp_path("afile"), "x", 1); /* only rank 0 looks at the dir */
  char path[700] = "";
  mpt_status st = mpt_ckpt_save_collective(comm, bad, 2, a, NULL, NULL, path, sizeof path);
  ck_assert_msg(st == MPT_EIO, "rank %d: %s (%s)", rank, mpt_status_name(st), mpt_last_error());
  check_detail("collective save", "rank 0 could not write the checkpoint", "afile", NULL);
  mpt_model_free(a);
}
END_TEST

START_TEST(test_ckpt_collective_load_failure_on_one_rank_stops_every_rank) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.global_step = 60;
  char path[700], other[700];
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 0, a, NULL, &meta, path, sizeof path),
                   MPT_OK);
  mpt_model *a2 = make_model(MODEL_BASE, 2);
  meta.global_step = 70;
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 0, a2, NULL, &meta, other,
                                            sizeof other), MPT_OK);
  mpt_model *b = make_model(MODEL_BASE, 3);
  snapshot s = take_snapshot(b);
  /* the last rank cannot find its file */
  int last = world - 1;
  mpt_status st = mpt_ckpt_load_collective(comm, rank == last ? tmp_path("missing.mpt") : path,
                                           b, NULL, NULL);
  ck_assert_msg(st == MPT_ENOENT, "rank %d: %s (%s)", rank, mpt_status_name(st), mpt_last_error());
  char who[32];
  snprintf(who, sizeof who, "rank %d could not load", last);
  check_detail("one rank fails", who, NULL);
  check_snapshot(&s, b, "a collective load that failed on one rank");
  if (world > 1) { /* the last rank loads another (valid) checkpoint */
    st = mpt_ckpt_load_collective(comm, rank == last ? other : path, b, NULL, NULL);
    ck_assert_msg(st == MPT_EMISMATCH, "rank %d: %s (%s)", rank, mpt_status_name(st),
                  mpt_last_error());
    check_detail("different files", "different checkpoints", NULL);
    check_snapshot(&s, b, "a collective load of different files");
  }
  free_snapshot(&s);
  mpt_model_free(a), mpt_model_free(a2), mpt_model_free(b);
}
END_TEST

static int run_mpi(void) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  if (mpt_comm_init(&comm, &cfg) != MPT_OK) {
    fprintf(stderr, "test_ckpt: mpt_comm_init: %s\n", mpt_last_error());
    return EXIT_FAILURE;
  }
  rank = mpt_comm_rank(comm);
  world = mpt_comm_world_size(comm);
  memset(tmpdir, 0, sizeof tmpdir);
  if (rank == 0) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_ckpt_mpi_XXXXXX");
    if (!mkdtemp(tmpdir)) tmpdir[0] = '\0';
  }
  if (mpt_comm_broadcast_sync(comm, tmpdir, sizeof tmpdir, MPT_U8, 0) != MPT_OK || !tmpdir[0]) {
    fprintf(stderr, "test_ckpt: rank %d: no shared temporary directory\n", rank);
    mpt_comm_abort(comm, 1);
  }
  Suite *s = suite_create("ckpt_mpi");
  TCase *tc = tcase_create("collective");
  tcase_add_test(tc, test_ckpt_collective_save_then_every_rank_loads_rank0s_state);
  tcase_add_test(tc, test_ckpt_collective_save_error_reaches_every_rank);
  tcase_add_test(tc, test_ckpt_collective_load_failure_on_one_rank_stops_every_rank);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr), any = 0;
  srunner_free(sr);
  mpt_comm_allreduce_sync(comm, &failed, &any, 1, MPT_I32, MPT_REDUCE_MAX);
  mpt_comm_barrier_sync(comm);
  if (rank == 0) remove_dir(tmpdir);
  mpt_comm_free(comm);
  mpt_comm_finalize();
  return any == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ------------------------------------------------------------------------------------------ */

static Suite *ckpt_suite(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("round_trip");
  tcase_add_checked_fixture(tc, make_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 20);
  tcase_add_test(tc, test_ckpt_round_trip_is_bit_exact);
  tcase_add_test(tc, test_ckpt_resumed_step_equals_uninterrupted_step);
  tcase_add_test(tc, test_ckpt_without_optimizer_round_trips_and_refuses_an_optimizer);
  tcase_add_test(tc, test_ckpt_optimizer_state_is_ignored_without_an_optimizer);
  suite_add_tcase(s, tc);
  TCase *tw = tcase_create("atomic_write_and_directories");
  tcase_add_checked_fixture(tw, make_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tw, 20);
#ifdef MPT_FAULT_INJECTION /* else the MPT_TEST_CKPT_KILL hook is not built: left out */
  tcase_add_test(tw, test_ckpt_killed_writer_leaves_previous_checkpoint_intact);
#endif
  tcase_add_test(tw, test_ckpt_failed_save_removes_its_temporary_file);
  tcase_add_test(tw, test_ckpt_keep_last_k_deletes_the_oldest);
  tcase_add_test(tw, test_ckpt_find_latest_picks_the_highest_step);
#ifdef MPT_FAULT_INJECTION
  tcase_add_test(tw, test_ckpt_resume_dir_after_a_killed_write_loads_the_last_complete_one);
#endif
  suite_add_tcase(s, tw);
  return s;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--mpi") == 0) return run_mpi();
  return run_suite(ckpt_suite());
}
