/* Tests for the nn model (src/nn/model.c): the parameter registry and its flat buffers,
 * initialisation from the rng in registration order, zeroing the gradient, and replication.
 * Everything runs on the CPU with the NULL stream (tests/tape_util.h). The ops' gradients are
 * tested in tests/test_tape_ops.c, the tape's use counts, hooks and arena in tests/test_tape.c. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"
#include "mpitrain/autograd.h"
#include "nn/tape.h"
#include "tape_util.h"

START_TEST(test_model_flat_buffers_are_contiguous_in_registration_order) {
  mpt_model *m = new_model();
  const int64_t s0[2] = {3, 4}, s1[1] = {4}, s2[3] = {2, 2, 2}, s3[1] = {1}, sb[1] = {4};
  int i0, i1, i2, i3, b0, b1;
  OK(mpt_model_add_param(m, "a.weight", 2, s0, MPT_INIT_FAN_IN, 4, &i0));
  OK(mpt_model_add_buffer(m, "a.running", 1, sb, MPT_INIT_ONES, &b0));
  OK(mpt_model_add_param(m, "a.bias", 1, s1, MPT_INIT_ZEROS, 0, &i1));
  OK(mpt_model_add_param(m, "cube", 3, s2, MPT_INIT_ONES, 0, &i2));
  OK(mpt_model_add_buffer(m, "b.running", 1, sb, MPT_INIT_ZEROS, &b1));
  OK(mpt_model_add_param(m, "one", 1, s3, MPT_INIT_ONES, 0, &i3));
  ck_assert_int_eq(i0, 0);
  ck_assert_int_eq(i1, 1);
  ck_assert_int_eq(i2, 2);
  ck_assert_int_eq(i3, 3);
  ck_assert_int_eq(b0, 0);
  ck_assert_int_eq(b1, 1);
  OK(mpt_model_finalize(m));

  ck_assert_int_eq(mpt_model_num_params(m), 4);
  ck_assert_int_eq(mpt_model_num_buffers(m), 2);
  ck_assert_int_eq(mpt_model_param_count(m), 12 + 4 + 8 + 1);
  ck_assert_int_eq(mpt_model_buffer_count(m), 8);
  const int64_t want_offset[4] = {0, 12, 16, 24}, want_count[4] = {12, 4, 8, 1};
  const char *want_name[4] = {"a.weight", "a.bias", "cube", "one"};
  for (int i = 0; i < 4; i++) {
    const mpt_param_info *info = mpt_model_param_info(m, i);
    ck_assert_ptr_nonnull(info);
    ck_assert_str_eq(info->name, want_name[i]);
    ck_assert_int_eq(info->offset, want_offset[i]);
    ck_assert_int_eq(info->count, want_count[i]);
    ck_assert_int_eq(info->dtype, MPT_F32);
    mpt_tensor pv = mpt_model_param(m, i), gv = mpt_model_grad(m, i);
    ck_assert_ptr_eq(pv.data, mpt_model_params(m) + want_offset[i]);
    ck_assert_ptr_eq(gv.data, mpt_model_grads(m) + want_offset[i]);
    ck_assert_int_eq(pv.count, want_count[i]);
    ck_assert_int_eq(pv.ndim, info->ndim);
    for (int d = 0; d < info->ndim; d++) ck_assert_int_eq(pv.shape[d], info->shape[d]);
  }
  ck_assert_int_eq(mpt_model_param_info(m, 2)->ndim, 3);
  ck_assert_int_eq(mpt_model_param_info(m, 0)->shape[0], 3);
  ck_assert_int_eq(mpt_model_param_info(m, 0)->shape[1], 4);
  ck_assert_int_eq(mpt_model_buffer_info(m, 1)->offset, 4);
  ck_assert_ptr_eq(mpt_model_buffer(m, 1).data, mpt_model_buffers(m) + 4);
  ck_assert_ptr_null(mpt_model_param_info(m, 4));
  ck_assert_ptr_null(mpt_model_param_info(m, -1));
  ck_assert_ptr_null(mpt_model_buffer_info(m, 2));
  ck_assert_ptr_null(mpt_model_param(m, 4).data);
  /* The three flat buffers are distinct and start zeroed. */
  ck_assert_ptr_ne(mpt_model_params(m), mpt_model_grads(m));
  for (int64_t i = 0; i < mpt_model_param_count(m); i++) {
    ck_assert_float_eq(mpt_model_params(m)[i], 0.0f);
    ck_assert_float_eq(mpt_model_grads(m)[i], 0.0f);
  }
  for (int64_t i = 0; i < mpt_model_buffer_count(m); i++)
    ck_assert_float_eq(mpt_model_buffers(m)[i], 0.0f);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_model_registry_rejects_bad_entries) {
  mpt_model *m = new_model();
  const int64_t ok[2] = {2, 3}, zero[2] = {2, 0}, neg[1] = {-1};
  OK(mpt_model_add_param(m, "fc1.weight", 2, ok, MPT_INIT_FAN_IN, 3, NULL));
  FAILS(mpt_model_add_param(m, "fc1.weight", 2, ok, MPT_INIT_ZEROS, 0, NULL), MPT_EINVAL);
  ck_assert_msg(strstr(mpt_last_error(), "fc1.weight"), "error names the duplicate: %s",
                mpt_last_error());
  FAILS(mpt_model_add_buffer(m, "fc1.weight", 2, ok, MPT_INIT_ZEROS, NULL), MPT_EINVAL);
  FAILS(mpt_model_add_param(m, "z", 2, zero, MPT_INIT_ZEROS, 0, NULL), MPT_EINVAL);
  FAILS(mpt_model_add_param(m, "n", 1, neg, MPT_INIT_ZEROS, 0, NULL), MPT_EINVAL);
  FAILS(mpt_model_add_param(m, "r", MPT_MAX_DIMS + 1, ok, MPT_INIT_ZEROS, 0, NULL), MPT_EINVAL);
  FAILS(mpt_model_add_param(m, "f", 2, ok, MPT_INIT_FAN_IN, 0, NULL), MPT_EINVAL);
  ck_assert_msg(strstr(mpt_last_error(), "fan_in"), "%s", mpt_last_error());
  FAILS(mpt_model_add_buffer(m, "bf", 2, ok, MPT_INIT_FAN_IN, NULL), MPT_EINVAL);
  FAILS(mpt_model_add_param(m, "", 2, ok, MPT_INIT_ZEROS, 0, NULL), MPT_EINVAL);
  FAILS(mpt_model_init_params(m, 1), MPT_ESTATE);
  FAILS(mpt_model_zero_grad(m, NULL), MPT_ESTATE);
  mpt_model *rep = NULL;
  FAILS(mpt_model_replicate(m, mpt_device_cpu(), &rep), MPT_ESTATE);
  ck_assert_ptr_null(rep);
  ck_assert_int_eq(mpt_model_num_params(m), 1); /* failed adds leave nothing behind */
  OK(mpt_model_finalize(m));
  FAILS(mpt_model_finalize(m), MPT_ESTATE);
  FAILS(mpt_model_add_param(m, "late", 2, ok, MPT_INIT_ZEROS, 0, NULL), MPT_ESTATE);
  ck_assert_msg(strstr(mpt_last_error(), "late"), "%s", mpt_last_error());
  FAILS(mpt_model_add_buffer(m, "late", 2, ok, MPT_INIT_ZEROS, NULL), MPT_ESTATE);
  mpt_tape *t = NULL;
  mpt_var *v = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  FAILS(mpt_tape_param(t, 1, &v), MPT_EINVAL);
  FAILS(mpt_model_forward(m, t, v, &v), MPT_EINVAL); /* NULL input */
  mpt_tape_free(t);
  mpt_model_free(m);
  mpt_model_free(NULL);
  mpt_tape_free(NULL);
}
END_TEST

START_TEST(test_model_init_params_follows_the_rng_in_registration_order) {
  mpt_model *m = new_model();
  mpt_linear fc1, fc2;
  int ones, zeros, bones, bzeros;
  const int64_t s3[1] = {3}, s2[1] = {2};
  OK(mpt_linear_add(m, "fc1", 5, 3, 1, &fc1));
  OK(mpt_model_add_buffer(m, "stat.ones", 1, s3, MPT_INIT_ONES, &bones));
  OK(mpt_model_add_param(m, "gamma", 1, s3, MPT_INIT_ONES, 0, &ones));
  OK(mpt_linear_add(m, "fc2", 3, 2, 1, &fc2));
  OK(mpt_model_add_param(m, "beta", 1, s2, MPT_INIT_ZEROS, 0, &zeros));
  OK(mpt_model_add_buffer(m, "stat.zeros", 1, s2, MPT_INIT_ZEROS, &bzeros));
  ck_assert_str_eq(mpt_model_param_info(m, fc1.weight)->name, "fc1.weight");
  ck_assert_str_eq(mpt_model_param_info(m, fc2.bias)->name, "fc2.bias");
  ck_assert_int_eq(mpt_model_param_info(m, fc1.weight)->shape[0], 3); /* [out, in] */
  ck_assert_int_eq(mpt_model_param_info(m, fc1.weight)->shape[1], 5);
  OK(mpt_model_finalize(m));
  /* Garbage in the buffers first: init must overwrite everything. */
  for (int64_t i = 0; i < mpt_model_param_count(m); i++) mpt_model_params(m)[i] = 7.0f;
  for (int64_t i = 0; i < mpt_model_buffer_count(m); i++) mpt_model_buffers(m)[i] = 7.0f;
  OK(mpt_model_init_params(m, 42));

  /* The oracle: one rng, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) drawn for the FAN_IN parameters
   * only, in registration order (weights then biases, layer by layer). */
  mpt_rng rng;
  mpt_rng_seed(&rng, 42);
  const struct { int index; int64_t fan_in; } fan[4] = {
      {fc1.weight, 5}, {fc1.bias, 5}, {fc2.weight, 3}, {fc2.bias, 3}};
  for (int k = 0; k < 4; k++) {
    const int64_t n = mpt_model_param_info(m, fan[k].index)->count;
    const float bound = (float)(1.0 / sqrt((double)fan[k].fan_in));
    float want[16], largest = 0;
    mpt_rng_fill_uniform(&rng, want, n, -bound, bound);
    const float *got = param_data(m, fan[k].index);
    for (int64_t i = 0; i < n; i++) {
      ck_assert_msg(got[i] == want[i], "param %d [%lld] = %.9g, want %.9g", fan[k].index,
                    (long long)i, got[i], want[i]);
      ck_assert(got[i] >= -bound && got[i] <= bound);
      largest = fmaxf(largest, fabsf(got[i]));
    }
    if (n >= 6) ck_assert_msg(largest > bound / 2, "values should spread over the bound");
  }
  for (int i = 0; i < 3; i++) ck_assert_float_eq(param_data(m, ones)[i], 1.0f);
  for (int i = 0; i < 2; i++) ck_assert_float_eq(param_data(m, zeros)[i], 0.0f);
  const float *buf_ones = mpt_model_buffer(m, bones).data;
  const float *buf_zeros = mpt_model_buffer(m, bzeros).data;
  for (int i = 0; i < 3; i++) ck_assert_float_eq(buf_ones[i], 1.0f);
  for (int i = 0; i < 2; i++) ck_assert_float_eq(buf_zeros[i], 0.0f);
  mpt_model_free(m);
}
END_TEST

static mpt_model *small_mlp_model(mpt_linear *l1, mpt_linear *l2, uint64_t seed) {
  mpt_model *m = new_model();
  const int64_t sb[1] = {4};
  OK(mpt_linear_add(m, "fc1", 6, 4, 1, l1));
  OK(mpt_model_add_buffer(m, "stat", 1, sb, MPT_INIT_ONES, NULL));
  OK(mpt_linear_add(m, "fc2", 4, 3, 1, l2));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, seed));
  return m;
}

START_TEST(test_model_init_params_is_deterministic_per_seed) {
  mpt_linear l1, l2;
  mpt_model *a = small_mlp_model(&l1, &l2, 7), *b = small_mlp_model(&l1, &l2, 7);
  mpt_model *c = small_mlp_model(&l1, &l2, 8);
  const size_t nbytes = (size_t)mpt_model_param_count(a) * sizeof(float);
  ck_assert_int_eq(memcmp(mpt_model_params(a), mpt_model_params(b), nbytes), 0);
  ck_assert_int_ne(memcmp(mpt_model_params(a), mpt_model_params(c), nbytes), 0);
  /* Re-initialising with the first seed restores the same bytes. */
  OK(mpt_model_init_params(c, 7));
  ck_assert_int_eq(memcmp(mpt_model_params(a), mpt_model_params(c), nbytes), 0);
  mpt_model_free(a);
  mpt_model_free(b);
  mpt_model_free(c);
}
END_TEST

START_TEST(test_model_zero_grad_zeroes_the_flat_gradient) {
  mpt_linear l1, l2;
  mpt_model *m = small_mlp_model(&l1, &l2, 1);
  for (int64_t i = 0; i < mpt_model_param_count(m); i++) mpt_model_grads(m)[i] = (float)i + 1;
  OK(mpt_model_zero_grad(m, NULL));
  for (int64_t i = 0; i < mpt_model_param_count(m); i++)
    ck_assert_float_eq(mpt_model_grads(m)[i], 0.0f);
  mpt_model_free(m);
}
END_TEST

typedef struct fwd_ctx {
  mpt_linear l1, l2;
} fwd_ctx;

static int g_ctx_frees;

static void free_fwd_ctx(void *c) {
  g_ctx_frees++;
  free(c);
}

/* fc2(relu(fc1(x))) */
static mpt_status two_layer_forward(mpt_model *m, mpt_tape *t, void *c_, mpt_var *input,
                                    mpt_var **out) {
  (void)m;
  fwd_ctx *c = c_;
  mpt_var *h = NULL, *r = NULL;
  MPT_RETURN_IF(mpt_linear_forward(t, &c->l1, input, &h));
  MPT_RETURN_IF(mpt_nn_relu(t, h, &r));
  return mpt_linear_forward(t, &c->l2, r, out);
}

static float forward_sum(mpt_model *m, const float *x, int64_t n) {
  mpt_tape *t = NULL;
  mpt_var *in = NULL, *out = NULL, *loss = NULL;
  float v = NAN;
  const int64_t shape[2] = {n, 6};
  mpt_tensor xt = mpt_tensor_view((void *)x, mpt_model_device(m), MPT_F32, 2, shape);
  OK(mpt_tape_init(&t, m, NULL));
  mpt_tape_reset(t, 0);
  OK(mpt_tape_input(t, &xt, &in));
  OK(mpt_model_forward(m, t, in, &out));
  ck_assert_int_eq(mpt_var_value(out)->shape[0], n);
  ck_assert_int_eq(mpt_var_value(out)->shape[1], 3);
  OK(mpt_nn_sum(t, out, &loss));
  OK(mpt_var_item(t, loss, &v));
  mpt_tape_free(t);
  return v;
}

START_TEST(test_model_replicate_copies_values_and_shares_forward) {
  fwd_ctx *ctx = malloc(sizeof *ctx);
  ck_assert_ptr_nonnull(ctx);
  mpt_model *src = small_mlp_model(&ctx->l1, &ctx->l2, 3);
  mpt_model_set_forward(src, two_layer_forward, ctx, free_fwd_ctx);
  for (int64_t i = 0; i < mpt_model_buffer_count(src); i++) mpt_model_buffers(src)[i] = 0.5f * i;
  mpt_model_set_training(src, 0);

  mpt_model *rep = NULL;
  const mpt_device dev1 = {MPT_DEVICE_CPU, 1};
  OK(mpt_model_replicate(src, dev1, &rep));
  ck_assert_int_eq(mpt_model_device(rep).index, 1);
  ck_assert_int_eq(mpt_model_training(rep), 0);
  ck_assert_int_eq(mpt_model_num_params(rep), mpt_model_num_params(src));
  ck_assert_int_eq(mpt_model_num_buffers(rep), mpt_model_num_buffers(src));
  const int64_t np = mpt_model_param_count(src), nb = mpt_model_buffer_count(src);
  ck_assert_int_eq(mpt_model_param_count(rep), np);
  ck_assert_ptr_ne(mpt_model_params(rep), mpt_model_params(src));
  ck_assert_ptr_ne(mpt_model_buffers(rep), mpt_model_buffers(src));
  ck_assert_int_eq(memcmp(mpt_model_params(rep), mpt_model_params(src), (size_t)np * 4), 0);
  ck_assert_int_eq(memcmp(mpt_model_buffers(rep), mpt_model_buffers(src), (size_t)nb * 4), 0);
  for (int64_t i = 0; i < np; i++) ck_assert_float_eq(mpt_model_grads(rep)[i], 0.0f);
  for (int i = 0; i < mpt_model_num_params(src); i++) {
    const mpt_param_info *a = mpt_model_param_info(src, i), *b = mpt_model_param_info(rep, i);
    ck_assert_str_eq(a->name, b->name);
    ck_assert_ptr_ne(a->name, b->name);
    ck_assert_int_eq(a->offset, b->offset);
    ck_assert_int_eq(a->count, b->count);
  }

  /* Same forward, same values: bit-identical outputs. */
  const float x[2 * 6] = {1, -2, 0.5f, 3, -1, 2, 0.25f, 1, -1.5f, 2, 1, -0.5f};
  const float ys = forward_sum(src, x, 2), yr = forward_sum(rep, x, 2);
  ck_assert_msg(memcmp(&ys, &yr, sizeof ys) == 0, "replica %.9g vs source %.9g", yr, ys);
  /* Its own storage: changing the replica leaves the source alone. */
  mpt_model_params(rep)[0] += 1.0f;
  ck_assert_float_ne(mpt_model_params(rep)[0], mpt_model_params(src)[0]);

  mpt_model_free(rep);
  ck_assert_int_eq(g_ctx_frees, 0); /* the shared context belongs to the source */
  mpt_model_free(src);
  ck_assert_int_eq(g_ctx_frees, 1);
}
END_TEST

static Suite *tape_model_suite(void) {
  Suite *s = suite_create("nn_model");
  TCase *model = tcase_create("model");
  tcase_add_test(model, test_model_flat_buffers_are_contiguous_in_registration_order);
  tcase_add_test(model, test_model_registry_rejects_bad_entries);
  tcase_add_test(model, test_model_init_params_follows_the_rng_in_registration_order);
  tcase_add_test(model, test_model_init_params_is_deterministic_per_seed);
  tcase_add_test(model, test_model_zero_grad_zeroes_the_flat_gradient);
  tcase_add_test(model, test_model_replicate_copies_values_and_shares_forward);
  suite_add_tcase(s, model);
  return s;
}

int main(void) { return run_suite(tape_model_suite()); }
