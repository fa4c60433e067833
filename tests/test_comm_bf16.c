/* Tests of the bfloat16 reductions of the comm layer rounded once (include/mpitrain/comm.h
 * "bfloat16"; src/comm/comm_mpi_call.c run_bf16_reduce), under mpirun: the tests
 * tests/test_comm_bf16_npN.mpi run this program with 2, 3, 4 and 8 ranks. Check runs without
 * forking (MPI). Three passes, each with its own comm: blocking, polling, and blocking with
 * max_chunk_count 3 (the reduction in rounds of one element per rank).
 *
 * Oracle: small cases whose exact sum is computed here (in double, exact for these values) and
 * rounded to bfloat16 once; the result of every bf16 all-reduce and reduce-scatter (sum and
 * average) must be those bits. The cases are chosen so that adding the ranks' values one by one
 * with a bfloat16 rounding after each addition (what an MPI_Op on bfloat16 does at each hop)
 * gives another value, computed here too: at 3, 4 and 8 ranks at least one case must differ,
 * else the test would not tell the two apart. (At 2 ranks there is one addition, so one
 * rounding either way: the cases only check the exact values.) */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"

static mpt_comm *comm;
static int rank, world;
static const char *pass_name;

/* The cases, one per element (element i is case i % NCASES). u: one bfloat16 ulp at 1, 2^-7. */
enum { NCASES = 7, REPEAT = 5 };
static const char *const case_name[NCASES] = {
    "every rank 65/512",       "rank 0: 1, others 3/1024", "rank 0: 1, others 1/512",
    "rank 0: -1, others -1/512", "last rank: 1, others 1/512", "rank r: r + 1",
    "rank 0: 256, others 1"};

static float case_value(int k, int r) {
  switch (k) {
    case 0:
      return 65.0f / 512; /* 8 ranks: 1.015625, one by one 1.0078125 */
    case 1:
      return r == 0 ? 1.0f : 3.0f / 1024; /* 3 ranks: 1 + 3/512 -> 1.0078125, one by one 1 */
    case 2:
      return r == 0 ? 1.0f : 1.0f / 512;
    case 3:
      return r == 0 ? -1.0f : -1.0f / 512;
    case 4:
      return r == world - 1 ? 1.0f : 1.0f / 512;
    case 5:
      return (float)(r + 1);
    default:
      return r == 0 ? 256.0f : 1.0f; /* one by one: 256 + 1 -> 256 each time */
  }
}

static double exact_sum(int k) {
  double s = 0;
  for (int r = 0; r < world; r++) s += case_value(k, r);
  ck_assert_msg((double)(float)s == s, "case %d: the exact sum is not a float", k);
  return s;
}

/* The one rounding: the float32 sum (exact here) rounded to bfloat16; avg: divided by W in
 * float32 first (comm.h). */
static uint16_t rounded_once(int k, int avg) {
  float s = (float)exact_sum(k);
  return mpt_bf16_from_f32(avg ? s / (float)world : s);
}

/* Rank by rank, rounding to bfloat16 after each addition. */
static uint16_t per_hop(int k) {
  uint16_t acc = mpt_bf16_from_f32(case_value(k, 0));
  for (int r = 1; r < world; r++)
    acc = mpt_bf16_from_f32(mpt_bf16_to_f32(acc) + mpt_bf16_to_f32(
                                                       mpt_bf16_from_f32(case_value(k, r))));
  return acc;
}

static int64_t count_of(void) { return (int64_t)NCASES * REPEAT + 3; }

static void fill(uint16_t *h, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float v = case_value((int)(i % NCASES), rank);
    h[i] = mpt_bf16_from_f32(v);
    ck_assert_float_eq(mpt_bf16_to_f32(h[i]), v); /* the inputs are bfloat16 already */
  }
}

static void sync_comm(void) {
  mpt_event *ev = NULL;
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  mpt_status st = mpt_event_record(ev, mpt_comm_stream(comm));
  if (st == MPT_OK) st = mpt_event_synchronize(ev, 120000.0);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s\n", rank, mpt_last_error());
  mpt_event_free(ev);
  ck_assert_int_eq(st, MPT_OK);
}

/* Elements [from, to) of h hold the expected bits; returns the number that do not. */
static int64_t wrong_elements(const uint16_t *h, int64_t from, int64_t to, int avg,
                              const char *what) {
  int64_t wrong = 0;
  for (int64_t i = from; i < to; i++) {
    const int k = (int)(i % NCASES);
    const uint16_t want = rounded_once(k, avg);
    if (h[i] == want) continue;
    if (wrong++ < 3)
      fprintf(stderr, "rank %d, %s, %s, element %lld (%s): %.9g, want %.9g (one by one %.9g)\n",
              rank, pass_name, what, (long long)i, case_name[k], mpt_bf16_to_f32(h[i]),
              mpt_bf16_to_f32(want), mpt_bf16_to_f32(per_hop(k)));
  }
  return wrong;
}

START_TEST(test_bf16_cases_tell_one_rounding_from_rounding_per_hop) {
  int differ = 0;
  for (int k = 0; k < NCASES; k++) differ += per_hop(k) != rounded_once(k, 0);
  if (world >= 3)
    ck_assert_msg(differ > 0, "at %d ranks no case tells one rounding from a rounding per hop",
                  world);
  else
    ck_assert_int_eq(differ, 0); /* one addition: one rounding either way */
}
END_TEST

START_TEST(test_bf16_allreduce_rounds_once) {
  const int64_t n = count_of();
  uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n), *o = malloc(sizeof(uint16_t) * (size_t)n);
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(o);
  fill(h, n);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, h, h, n, MPT_BF16, MPT_REDUCE_SUM), MPT_OK);
  sync_comm();
  int64_t wrong = wrong_elements(h, 0, n, 0, "all-reduce sum, in place");
  if (rank == 0 && strcmp(pass_name, "blocking") == 0)
    for (int k = 0; k < NCASES; k++)
      printf("bf16 sum at %d ranks, %-28s per hop %-10.9g rounded once %-10.9g expected "
             "%.9g\n", world, case_name[k], mpt_bf16_to_f32(per_hop(k)),
             mpt_bf16_to_f32(h[k]), mpt_bf16_to_f32(rounded_once(k, 0)));
  fill(h, n);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, h, o, n, MPT_BF16, MPT_REDUCE_AVG), MPT_OK);
  sync_comm();
  wrong += wrong_elements(o, 0, n, 1, "all-reduce avg");
  for (int64_t i = 0; i < n; i++) /* the input is left alone out of place */
    ck_assert_uint_eq(h[i], mpt_bf16_from_f32(case_value((int)(i % NCASES), rank)));
  free(h);
  free(o);
  ck_assert_msg(wrong == 0, "rank %d: %lld wrong elements", rank, (long long)wrong);
}
END_TEST

START_TEST(test_bf16_reduce_scatter_rounds_once) {
  const int64_t n = count_of();
  int64_t off, mine;
  mpt_comm_shard(n, world, rank, &off, &mine);
  uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n), *o = malloc(sizeof(uint16_t) * (size_t)n);
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(o);
  fill(h, n);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, h, h + off, n, MPT_BF16, MPT_REDUCE_SUM),
                   MPT_OK);
  sync_comm();
  int64_t wrong = wrong_elements(h, off, off + mine, 0, "reduce-scatter sum, in place");
  fill(h, n);
  memset(o, 0, sizeof(uint16_t) * (size_t)n);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, h, o + off, n, MPT_BF16, MPT_REDUCE_AVG),
                   MPT_OK);
  sync_comm();
  wrong += wrong_elements(o, off, off + mine, 1, "reduce-scatter avg");
  for (int64_t i = 0; i < n; i++) /* nothing outside the shard is written */
    if (i < off || i >= off + mine) ck_assert_uint_eq(o[i], 0);
  free(h);
  free(o);
  ck_assert_msg(wrong == 0, "rank %d: %lld wrong elements", rank, (long long)wrong);
}
END_TEST

/* NaN anywhere gives NaN; infinities of both signs give NaN; one infinity stays. */
START_TEST(test_bf16_allreduce_keeps_nan_and_infinities) {
  uint16_t h[3] = {mpt_bf16_from_f32(rank == world - 1 ? NAN : 1.0f),
                   mpt_bf16_from_f32(rank == 0 ? INFINITY : (rank == 1 ? -INFINITY : 2.0f)),
                   mpt_bf16_from_f32(rank == 1 ? -INFINITY : 0.5f)};
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, h, h, 3, MPT_BF16, MPT_REDUCE_SUM), MPT_OK);
  sync_comm();
  ck_assert(isnan(mpt_bf16_to_f32(h[0])));
  ck_assert(isnan(mpt_bf16_to_f32(h[1])));
  ck_assert(isinf(mpt_bf16_to_f32(h[2])) && mpt_bf16_to_f32(h[2]) < 0);
}
END_TEST

static int run_pass(const char *name, int blocking, int64_t chunk) {
  pass_name = name;
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  cfg.blocking = blocking;
  cfg.configure_log = 0;
  if (chunk > 0) cfg.max_chunk_count = chunk;
  mpt_status st = mpt_comm_init(&comm, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "test_comm_bf16: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  rank = mpt_comm_rank(comm);
  world = mpt_comm_world_size(comm);
  Suite *s = suite_create(name);
  TCase *tc = tcase_create("bf16");
  tcase_add_test(tc, test_bf16_cases_tell_one_rounding_from_rounding_per_hop);
  tcase_add_test(tc, test_bf16_allreduce_rounds_once);
  tcase_add_test(tc, test_bf16_reduce_scatter_rounds_once);
  tcase_add_test(tc, test_bf16_allreduce_keeps_nan_and_infinities);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(comm);
  comm = NULL;
  return failed;
}

int main(void) {
  int failed = run_pass("blocking", 1, 0);
  failed += run_pass("polling", 0, 0);
  failed += run_pass("chunked", 1, 3);
  mpt_status st = mpt_comm_finalize();
  if (st != MPT_OK) fprintf(stderr, "test_comm_bf16: %s\n", mpt_last_error());
  return failed == 0 && st == MPT_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
