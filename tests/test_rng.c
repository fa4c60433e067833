/* Tests of the seeded RNG (include/mpitrain/core.h, src/core/rng.c) at the edges of its
 * documented ranges: mpt_rng_uniform is in [0, 1) and mpt_rng_fill_uniform in [lo, hi) even
 * for the largest draw, 1 - 2^-24, where lo + (hi - lo) u can round up to hi in float (lo 1,
 * hi 2: 2 - 2^-24 is a tie between 2 - 2^-23 and 2, and ties go to the even 2). The largest draw
 * is forced by setting the state: xoshiro256** returns rotl(5 s[1], 7) 9, and
 * s[1] = 0x4fc71c71c71c71c7 makes that 2^64 - 1 (its top 24 bits are all ones). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "mpitrain/core.h"

/* A state whose next draw is the largest: mpt_rng_next returns UINT64_MAX. */
static mpt_rng largest_draw_state(void) {
  mpt_rng rng = {{0, 0x4fc71c71c71c71c7ULL, 0, 0}};
  mpt_rng probe = rng;
  ck_assert_uint_eq(mpt_rng_next(&probe), UINT64_MAX); /* the construction itself */
  return rng;
}

START_TEST(test_rng_uniform_largest_draw_is_below_one) {
  mpt_rng rng = largest_draw_state();
  const float u = mpt_rng_uniform(&rng);
  ck_assert_float_eq(u, 1.0f - 0x1p-24f);
}
END_TEST

START_TEST(test_rng_fill_uniform_stays_below_hi_for_the_largest_draw) {
  /* [lo, hi) with the draw 1 - 2^-24: the exact value lo + (hi - lo) (1 - 2^-24) is below hi,
   * and so must be the float written (the largest float below hi where it rounds up). */
  static const float ranges[][2] = {{1.0f, 2.0f}, {0.5f, 1.0f}, {3.0f, 4.0f}, {-1.0f, 1.0f},
                                    {0.0f, 1.0f}, {100.0f, 101.0f}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    const float lo = ranges[i][0], hi = ranges[i][1];
    mpt_rng rng = largest_draw_state();
    float x = -1.0f;
    mpt_rng_fill_uniform(&rng, &x, 1, lo, hi);
    ck_assert_msg(x >= lo && x < hi, "fill_uniform [%g, %g): got %.9g", (double)lo,
                  (double)hi, (double)x);
    ck_assert_msg(x >= nextafterf(hi, lo) - (hi - lo) * 0x1p-23f,
                  "fill_uniform [%g, %g): got %.9g, not next to hi", (double)lo, (double)hi,
                  (double)x);
  }
}
END_TEST

START_TEST(test_rng_fill_uniform_keeps_ordinary_draws) {
  /* Away from the edge the values are lo + (hi - lo) u exactly as computed in float. */
  mpt_rng a, b;
  mpt_rng_seed(&a, 7);
  mpt_rng_seed(&b, 7);
  float x[1000];
  mpt_rng_fill_uniform(&a, x, 1000, 1.0f, 2.0f);
  for (int i = 0; i < 1000; i++) {
    const float want = 1.0f + 1.0f * mpt_rng_uniform(&b);
    ck_assert_float_eq(x[i], want);
  }
}
END_TEST

int main(void) {
  Suite *suite = suite_create("rng");
  TCase *tc = tcase_create("rng");
  tcase_add_test(tc, test_rng_uniform_largest_draw_is_below_one);
  tcase_add_test(tc, test_rng_fill_uniform_stays_below_hi_for_the_largest_draw);
  tcase_add_test(tc, test_rng_fill_uniform_keeps_ordinary_draws);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
