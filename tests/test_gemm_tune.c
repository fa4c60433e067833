/* MPT_CPU_GEMM_TUNE (include/mpitrain/ops.h, "CPU GEMM tuning"; src/core/cpu/gemm_choice.c and
 * gemm_tune.c): the per-shape table decides mpt_cpu_gemm_for and so the bits of mpt_op_gemm,
 * the recording notes the shapes and transposes, the timing fills a consistent choice, and the
 * cache file round-trips, refusing a cut, edited or foreign file and naming what is wrong. No
 * time is asserted. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "check_util.h"

static int have_onednn(void) {
  const int yes = mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN) == MPT_OK;
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  return yes;
}

static float *filled(int64_t count, unsigned seed) {
  float *x = malloc((size_t)count * sizeof *x);
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < count; i++) {
    seed = seed * 1103515245u + 12345u;
    x[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
  }
  return x;
}

/* C = A B (96 x 64 x 1152: OpenBLAS and oneDNN give other bits here) under the current setting. */
static void product(const float *a, const float *b, float *c) {
  OK(mpt_op_gemm(NULL, 0, 0, 96, 64, 1152, 1.0f, a, 1152, b, 64, 0.0f, c, 64));
}

/* The table answers for its shapes under TUNE, the rule for the rest; the op's bits follow it:
 * the table's openblas gives --gemm openblas's bits, its onednn --gemm onednn's. */
START_TEST(test_gemm_tune_table_decides_the_library_and_the_bits) {
  OK(mpt_cpu_set_threads(1));
  const int onednn = have_onednn();
  const mpt_cpu_gemm rule_other = mpt_cpu_gemm_for(2048, 384, 384); /* AUTO */
  const mpt_cpu_gemm rule_this = mpt_cpu_gemm_for(96, 64, 1152);
  mpt_cpu_gemm_tuned t[2] = {{.m = 96, .n = 64, .k = 1152, .gemm = MPT_CPU_GEMM_OPENBLAS},
                             {.m = 64, .n = 512, .k = 784, .gemm = MPT_CPU_GEMM_OPENBLAS}};
  OK(mpt_cpu_gemm_table_set(t, 2));
  /* AUTO answers with the fixed rule, whose choice for this shape depends on the ISA's
   * kernels (tests/test_sgemm_dnnl checks the rule): the table must not change it */
  ck_assert_int_eq(mpt_cpu_gemm_for(96, 64, 1152), rule_this);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_TUNE));
  ck_assert_int_eq(mpt_cpu_gemm_setting(), MPT_CPU_GEMM_TUNE);
  ck_assert_str_eq(mpt_cpu_gemm_name(MPT_CPU_GEMM_TUNE), "tune");
  ck_assert_int_eq(mpt_cpu_gemm_for(96, 64, 1152), MPT_CPU_GEMM_OPENBLAS);
  ck_assert_int_eq(mpt_cpu_gemm_for(64, 512, 784), MPT_CPU_GEMM_OPENBLAS);
  ck_assert_int_eq(mpt_cpu_gemm_for(2048, 384, 384), rule_other); /* not in the table */
  ck_assert_int_eq(mpt_cpu_gemm_for(1, 512, 784), MPT_CPU_GEMM_OPENBLAS);
  float *a = filled(96 * 1152, 1), *b = filled(1152 * 64, 2);
  float *ct = malloc(96 * 64 * sizeof(float)), *cf = malloc(96 * 64 * sizeof(float));
  product(a, b, ct);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_OPENBLAS));
  product(a, b, cf);
  ck_assert_msg(memcmp(ct, cf, 96 * 64 * sizeof(float)) == 0,
                "the table says openblas, the bits are not --gemm openblas's");
  if (onednn) {
    t[0].gemm = MPT_CPU_GEMM_ONEDNN;
    OK(mpt_cpu_gemm_table_set(t, 2));
    OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_TUNE));
    ck_assert_int_eq(mpt_cpu_gemm_for(96, 64, 1152), MPT_CPU_GEMM_ONEDNN);
    product(a, b, ct);
    ck_assert_msg(memcmp(ct, cf, 96 * 64 * sizeof(float)) != 0,
                  "both libraries give the same bits here: the routing is not observable");
    OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN));
    product(a, b, cf);
    ck_assert_msg(memcmp(ct, cf, 96 * 64 * sizeof(float)) == 0,
                  "the table says onednn, the bits are not --gemm onednn's");
  }
  mpt_cpu_gemm_tuned back[4];
  ck_assert_int_eq(mpt_cpu_gemm_table(back, 4), 2);
  ck_assert_int_eq(back[1].m, 64);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  OK(mpt_cpu_gemm_table_set(NULL, 0));
  free(a), free(b), free(ct), free(cf);
}
END_TEST

START_TEST(test_gemm_tune_table_refuses_bad_entries_and_stays) {
  mpt_cpu_gemm_tuned good = {.m = 8, .n = 8, .k = 8, .gemm = MPT_CPU_GEMM_OPENBLAS};
  OK(mpt_cpu_gemm_table_set(&good, 1));
  mpt_cpu_gemm_tuned bad[2] = {good, good};
  ck_assert_int_eq(mpt_cpu_gemm_table_set(bad, 2), MPT_EINVAL); /* a shape twice */
  bad[1].n = 9;
  bad[1].gemm = MPT_CPU_GEMM_AUTO;
  ck_assert_int_eq(mpt_cpu_gemm_table_set(bad, 2), MPT_EINVAL);
  bad[1].gemm = MPT_CPU_GEMM_OPENBLAS;
  bad[1].k = 0;
  ck_assert_int_eq(mpt_cpu_gemm_table_set(bad, 2), MPT_EINVAL);
  ck_assert_int_eq(mpt_cpu_gemm_table_set(NULL, 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_cpu_gemm_table_set(bad, MPT_CPU_GEMM_TABLE_MAX + 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_cpu_gemm_table(NULL, 0), 1); /* unchanged */
  OK(mpt_cpu_gemm_table_set(NULL, 0));
  ck_assert_int_eq(mpt_cpu_gemm_table(NULL, 0), 0);
}
END_TEST

/* Recording notes each shape once with the transposes it was used with; products with m or
 * n of 1 (dots, always OpenBLAS) and k of 0 are not noted; off stops, on starts afresh. */
START_TEST(test_gemm_tune_recording_notes_shapes_and_transposes) {
  float *a = filled(64 * 64, 3), *b = filled(64 * 64, 4), *c = filled(64 * 64, 5);
  mpt_cpu_gemm_record(1);
  OK(mpt_op_gemm(NULL, 0, 1, 16, 32, 8, 1.0f, a, 8, b, 8, 0.0f, c, 32));
  OK(mpt_op_gemm(NULL, 1, 0, 16, 32, 8, 1.0f, a, 16, b, 32, 0.0f, c, 32));
  OK(mpt_op_gemm(NULL, 0, 0, 16, 32, 8, 1.0f, a, 8, b, 32, 0.0f, c, 32));
  OK(mpt_op_gemm(NULL, 0, 0, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8));
  OK(mpt_op_gemm(NULL, 0, 0, 1, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8));
  OK(mpt_op_gemm(NULL, 0, 0, 8, 8, 0, 1.0f, a, 8, b, 8, 0.0f, c, 8));
  mpt_cpu_gemm_record(0);
  OK(mpt_op_gemm(NULL, 0, 0, 4, 4, 4, 1.0f, a, 4, b, 4, 0.0f, c, 4)); /* not noted */
  mpt_cpu_gemm_tuned s[8];
  ck_assert_int_eq(mpt_cpu_gemm_recorded(s, 8), 2);
  ck_assert(s[0].m == 16 && s[0].n == 32 && s[0].k == 8);
  ck_assert_uint_eq(s[0].trans, 1u | 2u | 4u); /* (N,N), (N,T), (T,N) */
  ck_assert(s[1].m == 8 && s[1].n == 8 && s[1].k == 8 && s[1].trans == 1u);
  ck_assert_int_eq(s[1].gemm, mpt_cpu_gemm_for(8, 8, 8)); /* the rule's answer (AUTO) */
  mpt_cpu_gemm_record(1);
  ck_assert_int_eq(mpt_cpu_gemm_recorded(NULL, 0), 0);
  mpt_cpu_gemm_record(0);
  free(a), free(b), free(c);
}
END_TEST

/* Timing fills both medians and keeps the rule's library unless the other is 5 % faster (no
 * figure asserted); a budget of 0 leaves
 * every shape untimed with the rule's answer. */
START_TEST(test_gemm_tune_timing_chooses_the_faster) {
  OK(mpt_cpu_set_threads(1));
  const int onednn = have_onednn();
  mpt_cpu_gemm_tuned s[2] = {{.m = 64, .n = 48, .k = 32, .trans = 1u | 4u},
                             {.m = 16, .n = 16, .k = 16, .trans = 0}};
  OK(mpt_cpu_gemm_time_shapes(s, 2, 3, 10000));
  for (int i = 0; i < 2; i++) {
    if (!onednn) {
      ck_assert_int_eq(s[i].gemm, MPT_CPU_GEMM_OPENBLAS);
      continue;
    }
    ck_assert(s[i].openblas_ms > 0 && s[i].onednn_ms > 0);
    /* the rule's library unless the other is 5 % faster */
    const mpt_cpu_gemm rule = mpt_cpu_gemm_for(s[i].m, s[i].n, s[i].k);
    const double mine = rule == MPT_CPU_GEMM_ONEDNN ? s[i].onednn_ms : s[i].openblas_ms;
    const double other = rule == MPT_CPU_GEMM_ONEDNN ? s[i].openblas_ms : s[i].onednn_ms;
    ck_assert_int_eq(s[i].gemm, other < 0.95 * mine ? (rule == MPT_CPU_GEMM_ONEDNN
                                                           ? MPT_CPU_GEMM_OPENBLAS
                                                           : MPT_CPU_GEMM_ONEDNN)
                                                     : rule);
  }
  OK(mpt_cpu_gemm_time_shapes(s, 2, 3, 0));
  for (int i = 0; i < 2; i++) {
    ck_assert(s[i].openblas_ms == 0 && s[i].onednn_ms == 0);
    ck_assert_int_eq(s[i].gemm, mpt_cpu_gemm_for(s[i].m, s[i].n, s[i].k));
  }
  s[0].k = 0;
  ck_assert_int_eq(mpt_cpu_gemm_time_shapes(s, 2, 3, 10), MPT_EINVAL);
  ck_assert_int_eq(mpt_cpu_gemm_time_shapes(s, 1, 0, 10), MPT_EINVAL);
}
END_TEST

static char dir[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *text = calloc(1, 65536);
  fread(text, 1, 65535, f);
  fclose(f);
  return text;
}

static const mpt_cpu_gemm_tuned entries[3] = {
    {.m = 64, .n = 512, .k = 784, .trans = 2, .gemm = MPT_CPU_GEMM_OPENBLAS,
     .openblas_ms = 0.5, .onednn_ms = 0.75},
    {.m = 512, .n = 784, .k = 64, .trans = 4, .gemm = MPT_CPU_GEMM_ONEDNN,
     .openblas_ms = 0.375, .onednn_ms = 0.25},
    {.m = 2, .n = 3, .k = 2147483647, .trans = 15, .gemm = MPT_CPU_GEMM_OPENBLAS,
     .openblas_ms = 0, .onednn_ms = 1024.0625}};

START_TEST(test_gemm_tune_cache_round_trip) {
  char key[2048], path[256];
  OK(mpt_cpu_gemm_cache_key(key, sizeof key));
  ck_assert_ptr_nonnull(strstr(key, "host "));
  ck_assert_ptr_nonnull(strstr(key, "\nthreads "));
  path_in(path, sizeof path, "sub/dir/cache.txt"); /* the folders are created */
  OK(mpt_cpu_gemm_cache_write(path, key, entries, 3));
  mpt_cpu_gemm_tuned back[4];
  int count = -1;
  OK(mpt_cpu_gemm_cache_read(path, key, back, 4, &count));
  ck_assert_int_eq(count, 3);
  for (int i = 0; i < 3; i++) {
    ck_assert(back[i].m == entries[i].m && back[i].n == entries[i].n && back[i].k == entries[i].k);
    ck_assert_uint_eq(back[i].trans, entries[i].trans);
    ck_assert_int_eq(back[i].gemm, entries[i].gemm);
    ck_assert(back[i].openblas_ms == entries[i].openblas_ms);
    ck_assert(back[i].onednn_ms == entries[i].onednn_ms);
  }
  OK(mpt_cpu_gemm_cache_write(path, key, NULL, 0)); /* replaced, empty */
  OK(mpt_cpu_gemm_cache_read(path, key, back, 4, &count));
  ck_assert_int_eq(count, 0);
  ck_assert_int_eq(mpt_cpu_gemm_cache_read(path, key, back, 2, &count), MPT_OK);
  OK(mpt_cpu_gemm_cache_write(path, key, entries, 3));
  ck_assert_int_eq(mpt_cpu_gemm_cache_read(path, key, back, 2, &count), MPT_EFORMAT); /* cap */
  ck_assert_int_eq(count, 0);
  ck_assert_int_eq(mpt_cpu_gemm_cache_write("/proc/mpitrain-no/cache.txt", key, entries, 3),
                   MPT_EIO);
}
END_TEST

/* Each damaged copy of a good file is refused with its status, *count 0, and a message. */
START_TEST(test_gemm_tune_cache_refuses_corrupt_and_foreign_files) {
  char key[2048], good[256], bad[256];
  OK(mpt_cpu_gemm_cache_key(key, sizeof key));
  path_in(good, sizeof good, "good.txt");
  path_in(bad, sizeof bad, "bad.txt");
  OK(mpt_cpu_gemm_cache_write(good, key, entries, 3));
  char *text = read_text(good);
  const char *first_shape = strstr(text, "shapes 3\n") + strlen("shapes 3\n");
  struct {
    const char *from, *to; /* the first `from` in the file replaced by `to` */
    mpt_status want;
  } cases[] = {
      {"mpitrain-gemm-cache 1", "mpitrain-gemm-cache 2", MPT_EFORMAT},
      {"shapes 3", "shapes 4", MPT_EFORMAT},  /* count line disagrees */
      {"shapes 3", "shapes 2", MPT_EFORMAT},
      {"openblas 0.5000", "blis 0.5000", MPT_EFORMAT},
      {"64 512 784", "64 -512 784", MPT_EFORMAT},
      {"64 512 784", "64 512x 784", MPT_EFORMAT},
      {"0.5000 0.7500", "nan 0.7500", MPT_EFORMAT},
      {"0.5000 0.7500", "0.5000 0.7500 9", MPT_EFORMAT},
      {"512 784 64", "64 512 784", MPT_EFORMAT}, /* a shape twice */
      {"end\n", "", MPT_EFORMAT},                /* cut */
      {"end\n", "end\nmore\n", MPT_EFORMAT},
      {"host ", "host x", MPT_EMISMATCH},      /* another host */
      {"threads ", "threads 9", MPT_EMISMATCH}, /* another thread count */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *at = strstr(text, cases[i].from);
    if (cases[i].from[0] >= '0' && cases[i].from[0] <= '9' && strncmp(cases[i].from, "0.", 2))
      at = strstr(first_shape, cases[i].from);
    ck_assert_ptr_nonnull(at);
    char *edited = calloc(1, strlen(text) + 64);
    memcpy(edited, text, (size_t)(at - text));
    strcat(edited, cases[i].to);
    strcat(edited, at + strlen(cases[i].from));
    if (i == 8) { /* the second shape line becomes a copy of the first */
      const char *l1 = first_shape, *l2 = strchr(l1, '\n') + 1, *l3 = strchr(l2, '\n') + 1;
      snprintf(edited, strlen(text) + 64, "%.*s%.*s%s", (int)(l2 - text), text,
               (int)(l2 - l1), l1, l3);
    }
    write_text(bad, edited);
    mpt_cpu_gemm_tuned back[4];
    int count = -1;
    const mpt_status st = mpt_cpu_gemm_cache_read(bad, key, back, 4, &count);
    ck_assert_msg(st == cases[i].want, "case %zu (%s -> %s): %s, want %s (%s)", i,
                  cases[i].from, cases[i].to, mpt_status_name(st),
                  mpt_status_name(cases[i].want), mpt_last_error());
    ck_assert_int_eq(count, 0);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), bad));
    free(edited);
  }
  write_text(bad, "\x01\x02 binary");
  int count = -1;
  mpt_cpu_gemm_tuned back[4];
  ck_assert_int_eq(mpt_cpu_gemm_cache_read(bad, key, back, 4, &count), MPT_EFORMAT);
  path_in(bad, sizeof bad, "missing.txt");
  ck_assert_int_eq(mpt_cpu_gemm_cache_read(bad, key, back, 4, &count), MPT_ENOENT);
  OK(mpt_cpu_gemm_cache_read(good, key, back, 4, &count)); /* the good one still reads */
  ck_assert_int_eq(count, 3);
  free(text);
}
END_TEST

/* The default path: MPT_GEMM_CACHE, else XDG_CACHE_HOME, else HOME/.cache; one file per key. */
START_TEST(test_gemm_tune_cache_path) {
  char p1[4200], p2[4200];
  unsetenv("MPT_GEMM_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  OK(mpt_cpu_gemm_cache_path("host a\n", p1, sizeof p1));
  OK(mpt_cpu_gemm_cache_path("host b\n", p2, sizeof p2));
  ck_assert_int_eq(strncmp(p1, "/xdg/mpitrain/gemm-", 19), 0);
  ck_assert_str_ne(p1, p2);
  setenv("XDG_CACHE_HOME", "", 1);
  setenv("HOME", "/home/u", 1);
  OK(mpt_cpu_gemm_cache_path("host a\n", p2, sizeof p2));
  ck_assert_int_eq(strncmp(p2, "/home/u/.cache/mpitrain/gemm-", 29), 0);
  ck_assert_str_eq(strrchr(p1, '/'), strrchr(p2, '/'));
  setenv("MPT_GEMM_CACHE", "/tmp/named.txt", 1);
  OK(mpt_cpu_gemm_cache_path("host a\n", p2, sizeof p2));
  ck_assert_str_eq(p2, "/tmp/named.txt");
  unsetenv("MPT_GEMM_CACHE");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  ck_assert_int_eq(mpt_cpu_gemm_cache_path("host a\n", p2, sizeof p2), MPT_ENOENT);
  setenv("HOME", "/home/u", 1);
  ck_assert_int_eq(mpt_cpu_gemm_cache_path("host a\n", p2, 4), MPT_EINVAL);
}
END_TEST

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/mpt-gemm-tune-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  Suite *s = suite_create("gemm_tune");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gemm_tune_table_decides_the_library_and_the_bits);
  tcase_add_test(tc, test_gemm_tune_table_refuses_bad_entries_and_stays);
  tcase_add_test(tc, test_gemm_tune_recording_notes_shapes_and_transposes);
  tcase_add_test(tc, test_gemm_tune_timing_chooses_the_faster);
  tcase_add_test(tc, test_gemm_tune_cache_round_trip);
  tcase_add_test(tc, test_gemm_tune_cache_refuses_corrupt_and_foreign_files);
  tcase_add_test(tc, test_gemm_tune_cache_path);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return failed ? 1 : 0;
}
