/* Tests of the Chrome trace (include/mpitrain/core.h, src/core/trace.c): a full trace counts the
 * events it drops (the trainer reports them, so a short trace is never silent), and the file
 * names every lane that has events, including the DataParallel device lanes 2, 3, ... */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "check_util.h"


START_TEST(test_trace_counts_the_events_it_drops) {
  mpt_trace *t = NULL;
  OK(mpt_trace_init(&t, 0, 3));
  for (int i = 0; i < 5; i++) mpt_trace_add(t, "forward", 0, i, 1, i);
  ck_assert_int_eq(mpt_trace_count(t), 3);
  ck_assert_int_eq(mpt_trace_dropped(t), 2);
  ck_assert_int_eq(mpt_trace_dropped(NULL), 0);
  mpt_trace_free(t);
}
END_TEST

START_TEST(test_trace_names_the_device_lanes) {
  char path[] = "/tmp/mpt_test_trace.XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  mpt_trace *t = NULL;
  OK(mpt_trace_init(&t, 1, 8));
  mpt_trace_add(t, "forward", 3, 0, 1, 1); /* device 1 of a DP rank */
  OK(mpt_trace_append(t, path, 1, 1));
  mpt_trace_free(t);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  unlink(path);
  ck_assert_ptr_nonnull(strstr(buf, "\"tid\":3,\"args\":{\"name\":\"device 1\"}"));
  ck_assert_ptr_nonnull(strstr(buf, "\"tid\":2,\"args\":{\"name\":\"device 0\"}"));
  ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"forward\",\"ph\":\"X\",\"pid\":1,\"tid\":3"));
}
END_TEST

int main(void) {
  Suite *suite = suite_create("trace");
  TCase *tc = tcase_create("trace");
  tcase_add_test(tc, test_trace_counts_the_events_it_drops);
  tcase_add_test(tc, test_trace_names_the_device_lanes);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
