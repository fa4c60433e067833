/* Scaffolding of the Check programs that write files (tests/test_gpt_file.c,
 * test_llama_file.c, test_safetensors.c, test_tokens.c).
 *
 * setup() / teardown(): an unchecked fixture that makes a fresh directory
 * /tmp/mpt_<FILE_CHECK_NAME>_XXXXXX into tmpdir and removes it with everything in it.
 * path_of(name): tmpdir/name, in one of 4 rotating buffers (so up to 4 paths stay valid at
 * once). ASSERT_ERR(expr, status, needles...): expr returns `status` and the library's error
 * detail (mpt_last_error) contains every needle. file_check_main(name, timeout_s, add_tests):
 * the whole main: one suite and one case named `name` with the fixture above, the timeout and
 * the tests add_tests adds, run; EXIT_SUCCESS when every test passed, else EXIT_FAILURE.
 * The including file defines FILE_CHECK_NAME
 * (a string, the program's name) before including this header. */
#ifndef MPT_TESTS_FILE_CHECK_H
#define MPT_TESTS_FILE_CHECK_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"

static char tmpdir[256];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_" FILE_CHECK_NAME "_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

static const char *path_of(const char *name) {
  static char paths[4][512];
  static int next = 0;
  char *p = paths[next++ % 4];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

#define ASSERT_ERR(expr, status, ...)                                                    \
  do {                                                                                   \
    mpt_status st_ = (expr);                                                             \
    ck_assert_msg(st_ == (status), "%s gave %s (%s)", #expr, mpt_status_name(st_),       \
                  mpt_last_error());                                                     \
    const char *needles_[] = {__VA_ARGS__};                                              \
    for (size_t n_ = 0; n_ < sizeof needles_ / sizeof needles_[0]; n_++)                 \
      ck_assert_msg(strstr(mpt_last_error(), needles_[n_]), "'%s' not in: %s", needles_[n_], \
                    mpt_last_error());                                                   \
  } while (0)

static int file_check_main(const char *name, double timeout_s, void (*add_tests)(TCase *tc)) {
  Suite *s = suite_create(name);
  TCase *tc = tcase_create(name);
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, timeout_s);
  add_tests(tc);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
