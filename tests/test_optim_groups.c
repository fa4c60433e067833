/* Tests for the optimizers' parameter groups (src/optim/optimizer.c mpt_optimizer_set_groups,
 * src/optim/groups.c mpt_param_groups_split_decay) against values worked by hand.
 *
 * Four parameters, all p = 1 and grad 0.5 at both steps, in four groups:
 *   A: group weight_decay 0.5, lr_scale 1     B: group weight_decay 0, lr_scale 1
 *   C: group weight_decay 0, lr_scale 0.5     D: in no group (config weight_decay 0.25)
 * SGD, lr 0.5, momentum 0.5 (g = grad + wd p; buf = g, then 0.5 buf + g; p -= lr' buf):
 *   A: g = 1,       buf = 1,       p = 0.5;     g = 0.75,    buf = 1.25,    p = -0.125
 *   B: g = 0.5,     buf = 0.5,     p = 0.75;    g = 0.5,     buf = 0.75,    p = 0.375
 *   C: (lr 0.25)    buf = 0.5,     p = 0.875;                buf = 0.75,    p = 0.6875
 *   D: g = 0.75,    buf = 0.75,    p = 0.625;   g = 0.65625, buf = 1.03125, p = 0.109375
 * AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8: with a constant gradient m_hat = 0.5 and
 * v_hat = 0.25 at both steps, so each step is p = p (1 - lr' wd) - lr' 0.5 / (0.5 + 1e-8):
 *   A: 1 * 0.95 - 0.1 = 0.85;        0.85 * 0.95 - 0.1 = 0.7075
 *   B: 0.9;                          0.8
 *   C: (lr 0.05) 0.95;               0.9
 *   D: 1 * 0.975 - 0.1 = 0.875;      0.875 * 0.975 - 0.1 = 0.753125
 * (the eps term moves the results by about 2e-9 relative). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"

static const mpt_param_group GROUPS[3] = {
    {0, 1, 0.5f, 1.0f}, {1, 1, 0.0f, 1.0f}, {2, 1, 0.0f, 0.5f}};

static void run_two_steps(const mpt_optimizer_config *cfg, const mpt_param_group *groups,
                          int ngroups, float lr, float p[2][4]) {
  mpt_optimizer *opt = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&opt, cfg, mpt_device_cpu(), 4), MPT_OK);
  ck_assert_msg(mpt_optimizer_set_groups(opt, groups, ngroups) == MPT_OK, "%s", mpt_last_error());
  ck_assert_int_eq(mpt_optimizer_num_groups(opt), ngroups);
  float param[4] = {1, 1, 1, 1};
  const float grad[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(mpt_optimizer_step(opt, NULL, param, grad, lr), MPT_OK);
    memcpy(p[s], param, sizeof param);
  }
  mpt_optimizer_free(opt);
}

START_TEST(test_groups_sgd_decayed_and_undecayed_match_hand_values) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.momentum = 0.5f;
  c.weight_decay = 0.25f;
  float p[2][4];
  /* Given in a shuffled order: groups need not be sorted. */
  const mpt_param_group shuffled[3] = {GROUPS[2], GROUPS[0], GROUPS[1]};
  run_two_steps(&c, shuffled, 3, 0.5f, p);
  const float want[2][4] = {{0.5f, 0.75f, 0.875f, 0.625f}, {-0.125f, 0.375f, 0.6875f, 0.109375f}};
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 4; i++)
      ck_assert_msg(p[s][i] == want[s][i], "step %d param %d: %.9g, want %.9g", s + 1, i,
                    (double)p[s][i], (double)want[s][i]);
}
END_TEST

START_TEST(test_groups_adamw_decayed_and_undecayed_match_hand_values) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  c.weight_decay = 0.25f;
  float p[2][4];
  run_two_steps(&c, GROUPS, 3, 0.1f, p);
  const double want[2][4] = {{0.85, 0.9, 0.95, 0.875}, {0.7075, 0.8, 0.9, 0.753125}};
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 4; i++)
      ck_assert_msg(fabs(p[s][i] - want[s][i]) <= 1e-6 * want[s][i],
                    "step %d param %d: %.9g, want %.9g", s + 1, i, (double)p[s][i],
                    want[s][i]);
}
END_TEST

/* Groups that repeat the config's settings change nothing, bit for bit; removing the groups
 * restores the plain behaviour. */
START_TEST(test_groups_equal_to_the_config_are_bit_identical_to_none) {
  enum { n = 1000 };
  for (int kind = 0; kind < 2; kind++) {
    mpt_optimizer_config c = mpt_optimizer_config_default();
    c.kind = kind ? MPT_OPTIM_ADAMW : MPT_OPTIM_SGD;
    c.momentum = 0.9f;
    c.weight_decay = 0.01f;
    static float p1[n], p2[n], g[n];
    mpt_rng rng;
    mpt_rng_seed(&rng, 5);
    mpt_rng_fill_uniform(&rng, p1, n, -1, 1);
    memcpy(p2, p1, sizeof p1);
    mpt_optimizer *a = NULL, *b = NULL;
    ck_assert_int_eq(mpt_optimizer_init(&a, &c, mpt_device_cpu(), n), MPT_OK);
    ck_assert_int_eq(mpt_optimizer_init(&b, &c, mpt_device_cpu(), n), MPT_OK);
    const mpt_param_group same[2] = {{10, 300, 0.01f, 1.0f}, {500, 77, 0.01f, 1.0f}};
    ck_assert_int_eq(mpt_optimizer_set_groups(b, same, 2), MPT_OK);
    for (int s = 0; s < 3; s++) {
      mpt_rng_fill_uniform(&rng, g, n, -1, 1);
      ck_assert_int_eq(mpt_optimizer_step(a, NULL, p1, g, 0.05f), MPT_OK);
      ck_assert_int_eq(mpt_optimizer_step(b, NULL, p2, g, 0.05f), MPT_OK);
    }
    ck_assert_mem_eq(p1, p2, sizeof p1);
    ck_assert_int_eq(mpt_optimizer_set_groups(b, NULL, 0), MPT_OK);
    ck_assert_int_eq(mpt_optimizer_num_groups(b), 0);
    ck_assert_ptr_null(mpt_optimizer_group(b, 0));
    mpt_optimizer_free(a);
    mpt_optimizer_free(b);
  }
}
END_TEST

/* The state of a grouped optimizer, copied into a fresh one with the same groups (what a
 * checkpoint does), continues exactly as the uninterrupted run. */
START_TEST(test_groups_restored_state_continues_the_run) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  c.weight_decay = 0.25f;
  float pa[4] = {1, 1, 1, 1}, pb[4];
  const float g1[4] = {0.5f, -1, 2, 0.25f}, g2[4] = {1, 0.25f, -0.5f, 0.5f};
  mpt_optimizer *a = NULL, *b = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&a, &c, mpt_device_cpu(), 4), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_set_groups(a, GROUPS, 3), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step(a, NULL, pa, g1, 0.1f), MPT_OK);
  memcpy(pb, pa, sizeof pa);
  ck_assert_int_eq(mpt_optimizer_init(&b, &c, mpt_device_cpu(), 4), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_set_groups(b, GROUPS, 3), MPT_OK);
  mpt_optimizer_state sa, sb;
  ck_assert_int_eq(mpt_optimizer_get_state(a, &sa), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_get_state(b, &sb), MPT_OK);
  ck_assert_int_eq(sa.nbuffers, 2);
  ck_assert_str_eq(sa.names[0], "exp_avg"); /* the state layout does not change with groups */
  for (int i = 0; i < 2; i++) memcpy(sb.buffers[i], sa.buffers[i], 4 * sizeof(float));
  ck_assert_int_eq(mpt_optimizer_set_step_count(b, sa.step_count), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step(a, NULL, pa, g2, 0.1f), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step(b, NULL, pb, g2, 0.1f), MPT_OK);
  ck_assert_mem_eq(pa, pb, sizeof pa);
  mpt_optimizer_free(a);
  mpt_optimizer_free(b);
}
END_TEST

START_TEST(test_groups_bad_slices_are_rejected_and_keep_the_old_groups) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  mpt_optimizer *opt = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), 10), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_set_groups(opt, GROUPS, 3), MPT_OK);
  const mpt_param_group bad[][2] = {
      {{0, 5, 0, 1}, {4, 2, 0, 1}},      /* overlap */
      {{8, 3, 0, 1}, {0, 1, 0, 1}},      /* past the end */
      {{-1, 2, 0, 1}, {5, 1, 0, 1}},     /* negative offset */
      {{0, 1, -0.1f, 1}, {5, 1, 0, 1}},  /* negative weight decay */
      {{0, 1, 0, NAN}, {5, 1, 0, 1}},    /* lr_scale not finite */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(mpt_optimizer_set_groups(opt, bad[i], 2), MPT_EINVAL);
    ck_assert_int_eq(mpt_optimizer_num_groups(opt), 3);
  }
  ck_assert_int_eq(mpt_optimizer_set_groups(opt, NULL, 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_set_groups(NULL, GROUPS, 3), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_group(opt, 1)->offset, 1);
  ck_assert(mpt_optimizer_group(opt, 2)->lr_scale == 0.5f);
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_groups_split_decays_weights_not_biases_or_norms) {
  /* MLP 6-4-3: fc1.weight [4,6], fc1.bias [4], fc2.weight [3,4], fc2.bias [3]. */
  mpt_mlp_config mc = mpt_mlp_config_default();
  mc.input_size = 6;
  mc.num_hidden = 1;
  mc.hidden[0] = 4;
  mc.num_classes = 3;
  mpt_model *m = NULL;
  ck_assert_int_eq(mpt_model_init_mlp(&m, mpt_device_cpu(), &mc, 1), MPT_OK);
  int n = -1;
  ck_assert_int_eq(mpt_param_groups_split_decay(m, 0.1f, NULL, 0, &n), MPT_OK);
  ck_assert_int_eq(n, 4);
  mpt_param_group g[4];
  ck_assert_int_eq(mpt_param_groups_split_decay(m, 0.1f, g, 3, &n), MPT_EINVAL);
  ck_assert_int_eq(mpt_param_groups_split_decay(m, 0.1f, g, 4, &n), MPT_OK);
  const mpt_param_group want[4] = {
      {0, 24, 0.1f, 1}, {24, 4, 0, 1}, {28, 12, 0.1f, 1}, {40, 3, 0, 1}};
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(g[i].offset, want[i].offset);
    ck_assert_int_eq(g[i].count, want[i].count);
    ck_assert(g[i].weight_decay == want[i].weight_decay);
    ck_assert(g[i].lr_scale == 1.0f);
  }
  ck_assert_int_eq(mpt_param_groups_split_decay(m, -1.0f, g, 4, &n), MPT_EINVAL);
  mpt_model_free(m);

  /* CNN with BatchNorm: conv1.weight | conv1.bias bn1.weight bn1.bias | conv2.weight | conv2.bias
   * bn2.weight bn2.bias | fc1.weight | fc1.bias | fc2.weight | fc2.bias: consecutive 1-D
   * parameters merge into one group. */
  mpt_cnn_config cc = mpt_cnn_config_default();
  cc.batchnorm = 1;
  ck_assert_int_eq(mpt_model_init_cnn(&m, mpt_device_cpu(), &cc, 1), MPT_OK);
  mpt_param_group cg[16];
  ck_assert_int_eq(mpt_param_groups_split_decay(m, 5e-4f, cg, 16, &n), MPT_OK);
  ck_assert_int_eq(n, 8);
  int64_t covered = 0;
  for (int i = 0; i < n; i++) {
    ck_assert_int_eq(cg[i].offset, covered);
    covered += cg[i].count;
    ck_assert(cg[i].weight_decay == (i % 2 == 0 ? 5e-4f : 0.0f));
  }
  ck_assert_int_eq(covered, mpt_model_param_count(m));
  /* The biases and norms group after conv1: conv1.bias [16], bn1.weight [16], bn1.bias [16]. */
  ck_assert_int_eq(cg[1].count, 48);
  /* Every parameter is decayed exactly when it has two or more dimensions. */
  for (int p = 0; p < mpt_model_num_params(m); p++) {
    const mpt_param_info *info = mpt_model_param_info(m, p);
    for (int i = 0; i < n; i++)
      if (info->offset >= cg[i].offset && info->offset < cg[i].offset + cg[i].count)
        ck_assert_msg((cg[i].weight_decay > 0) == (info->ndim >= 2), "%s", info->name);
  }
  mpt_model_free(m);
}
END_TEST

/* A sharded optimizer (mpt_optimizer_init_ranges, ZeRO-1) over the four parameters above: its
 * state covers the ranges only, the elements of the ranges get the hand values of the whole
 * buffer (whatever group cuts them), the others are never read (NaN gradients there) nor
 * written. */
START_TEST(test_ranges_step_their_elements_only_with_the_groups_hand_values) {
  static const float want_sgd[4] = {-0.125f, 0.375f, 0.6875f, 0.109375f};
  static const float want_adamw[4] = {0.7075f, 0.8f, 0.9f, 0.753125f};
  const mpt_optim_range cases[2][2] = {{{1, 1, 0}, {3, 1, 0}}, {{0, 3, 0}, {0, 0, 0}}};
  const int ncases[2] = {2, 1};
  for (int adam = 0; adam < 2; adam++)
    for (int k = 0; k < 2; k++) {
      mpt_optimizer_config c = mpt_optimizer_config_default();
      c.kind = adam ? MPT_OPTIM_ADAMW : MPT_OPTIM_SGD;
      c.momentum = 0.5f;
      c.weight_decay = 0.25f;
      const float lr = adam ? 0.1f : 0.5f;
      mpt_optimizer *opt = NULL;
      ck_assert_msg(mpt_optimizer_init_ranges(&opt, &c, mpt_device_cpu(), 4, cases[k],
                                              ncases[k]) == MPT_OK, "%s", mpt_last_error());
      ck_assert_int_eq(mpt_optimizer_set_groups(opt, GROUPS, 3), MPT_OK);
      ck_assert_int_eq(mpt_optimizer_num_ranges(opt), ncases[k]);
      mpt_optimizer_state st;
      ck_assert_int_eq(mpt_optimizer_get_state(opt, &st), MPT_OK);
      ck_assert_int_eq(st.count, k == 0 ? 2 : 3);
      ck_assert_int_eq(st.nbuffers, adam ? 2 : 1);
      int owned[4] = {0, 0, 0, 0};
      for (int r = 0; r < ncases[k]; r++)
        for (int64_t i = cases[k][r].offset; i < cases[k][r].offset + cases[k][r].count; i++)
          owned[i] = 1;
      float param[4] = {1, 1, 1, 1}, grad[4];
      for (int i = 0; i < 4; i++) grad[i] = owned[i] ? 0.5f : NAN;
      for (int s = 0; s < 2; s++) ck_assert_int_eq(mpt_optimizer_step(opt, NULL, param, grad, lr),
                                                   MPT_OK);
      for (int i = 0; i < 4; i++) {
        const float want = !owned[i] ? 1.0f : adam ? want_adamw[i] : want_sgd[i];
        ck_assert_msg(fabsf(param[i] - want) <= 1e-6f, "%s case %d element %d: %.9g, want %.9g",
                      adam ? "adamw" : "sgd", k, i, param[i], want);
      }
      mpt_optimizer_free(opt);
    }
}
END_TEST

START_TEST(test_ranges_bad_ones_are_rejected) {
  const mpt_optim_range overlap[2] = {{0, 2, 0}, {1, 2, 0}}, unsorted[2] = {{2, 1, 0}, {0, 1, 0}},
                        outside[1] = {{3, 2, 0}};
  const mpt_optim_range *bad[3] = {overlap, unsorted, outside};
  const int n[3] = {2, 2, 1};
  mpt_optimizer_config c = mpt_optimizer_config_default();
  for (int i = 0; i < 3; i++) {
    mpt_optimizer *opt = (mpt_optimizer *)&c; /* must be reset to NULL */
    ck_assert_int_eq(mpt_optimizer_init_ranges(&opt, &c, mpt_device_cpu(), 4, bad[i], n[i]),
                     MPT_EINVAL);
    ck_assert_ptr_null(opt);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "optimizer range"));
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("optim_groups");
  TCase *tc = tcase_create("groups");
  tcase_add_test(tc, test_groups_sgd_decayed_and_undecayed_match_hand_values);
  tcase_add_test(tc, test_groups_adamw_decayed_and_undecayed_match_hand_values);
  tcase_add_test(tc, test_groups_equal_to_the_config_are_bit_identical_to_none);
  tcase_add_test(tc, test_groups_restored_state_continues_the_run);
  tcase_add_test(tc, test_groups_bad_slices_are_rejected_and_keep_the_old_groups);
  tcase_add_test(tc, test_groups_split_decays_weights_not_biases_or_norms);
  tcase_add_test(tc, test_ranges_step_their_elements_only_with_the_groups_hand_values);
  tcase_add_test(tc, test_ranges_bad_ones_are_rejected);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
