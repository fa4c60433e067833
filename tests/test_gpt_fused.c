/* Tests of the fused transformer ops (include/mpitrain/ops_gpt.h: mpt_op_add_layernorm,
 * mpt_op_bias_gelu and its backward; include/mpitrain/transformer.h: mpt_nn_add_layernorm,
 * mpt_nn_linear_gelu).
 *
 * Oracles:
 * - Each fused core op against the unfused composition it replaces, bit for bit (memcmp), at 1
 *   and 2 threads, at sizes of one and several 256-row blocks (the bias gradient's order
 *   changes there), columns that are not a multiple of the vector width, and in place.
 * - Each fused tape op against the unfused tape ops on the same inputs: the outputs and every
 *   gradient bit for bit; and every gradient against central finite differences in double.
 * - Bad arguments: NULL pointers, outputs that overlap inputs, NULL bias, shape mismatches. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/transformer.h"
#include "check_util.h"


/* Deterministic values in [-a, a). */
static void fill_uniform(float *x, int64_t n, float a, uint32_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = a * ((float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

static float *floats(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void assert_same_bits(const char *what, const float *got, const float *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&got[i], &want[i], sizeof *got) == 0,
                  "%s[%lld]: fused %.9g, unfused %.9g", what, (long long)i, got[i], want[i]);
}

/* ---- core ops against the unfused compositions ---- */

/* Row counts: one block, exactly one, several and a partial last (MPT__CPU_SUM_ROWS = 256). */
static const int64_t ROWS[] = {1, 37, 256, 700};
static const int THREADS[] = {1, 2};

START_TEST(test_add_layernorm_is_add_then_layernorm_bit_for_bit) {
  const int64_t rows = ROWS[_i % 4], c = 77;
  OK(mpt_cpu_set_threads(THREADS[_i / 4]));
  float *a = floats(rows * c), *b = floats(rows * c), *w = floats(c), *bias = floats(c);
  float *s0 = floats(rows * c), *y0 = floats(rows * c), *m0 = floats(rows), *r0 = floats(rows);
  float *s1 = floats(rows * c), *y1 = floats(rows * c), *m1 = floats(rows), *r1 = floats(rows);
  fill_uniform(a, rows * c, 3.0f, 1);
  fill_uniform(b, rows * c, 1.0f, 2);
  for (int64_t i = 0; i < rows * c; i++) a[i] += 0.75f; /* rows with a mean */
  fill_uniform(w, c, 1.5f, 3);
  fill_uniform(bias, c, 0.5f, 4);
  OK(mpt_op_copy(NULL, s0, a, rows * c)); /* mpt_nn_add's forward */
  OK(mpt_op_axpy(NULL, rows * c, 1.0f, b, s0));
  OK(mpt_op_layernorm(NULL, s0, rows, c, w, bias, 1e-5f, y0, m0, r0));
  OK(mpt_op_add_layernorm(NULL, a, b, rows, c, w, bias, 1e-5f, s1, y1, m1, r1));
  assert_same_bits("sum", s1, s0, rows * c);
  assert_same_bits("y", y1, y0, rows * c);
  assert_same_bits("mean", m1, m0, rows);
  assert_same_bits("rstd", r1, r0, rows);
  /* in place: sum over a */
  OK(mpt_op_add_layernorm(NULL, a, b, rows, c, w, bias, 1e-5f, a, y1, m1, r1));
  assert_same_bits("sum in place", a, s0, rows * c);
  assert_same_bits("y (sum in place)", y1, y0, rows * c);
  OK(mpt_cpu_set_threads(1));
  free(a), free(b), free(w), free(bias), free(s0), free(y0), free(m0), free(r0);
  free(s1), free(y1), free(m1), free(r1);
}
END_TEST

START_TEST(test_bias_gelu_is_bias_add_then_gelu_bit_for_bit) {
  const int64_t rows = ROWS[_i % 4], cols = 83;
  OK(mpt_cpu_set_threads(THREADS[_i / 4]));
  float *x = floats(rows * cols), *bias = floats(cols), *y0 = floats(rows * cols);
  float *y1 = floats(rows * cols);
  fill_uniform(x, rows * cols, 6.0f, 5); /* both tails of GELU */
  fill_uniform(bias, cols, 1.0f, 6);
  memcpy(y0, x, (size_t)(rows * cols) * sizeof *x);
  OK(mpt_op_bias_add(NULL, y0, bias, rows, cols, 1));
  OK(mpt_op_gelu(NULL, y0, y0, rows * cols));
  OK(mpt_op_bias_gelu(NULL, y1, x, bias, rows, cols));
  assert_same_bits("y", y1, y0, rows * cols);
  OK(mpt_op_bias_gelu(NULL, x, x, bias, rows, cols)); /* in place */
  assert_same_bits("y in place", x, y0, rows * cols);
  OK(mpt_cpu_set_threads(1));
  free(x), free(bias), free(y0), free(y1);
}
END_TEST

START_TEST(test_bias_gelu_backward_is_gelu_backward_then_bias_backward_bit_for_bit) {
  const int64_t rows = ROWS[_i % 4], cols = 83, n = rows * cols;
  OK(mpt_cpu_set_threads(THREADS[_i / 4]));
  float *x = floats(n), *bias = floats(cols), *dy = floats(n), *pre = floats(n);
  float *dx0 = floats(n), *dx1 = floats(n), *db0 = floats(cols), *db1 = floats(cols);
  fill_uniform(x, n, 6.0f, 7);
  fill_uniform(bias, cols, 1.0f, 8);
  fill_uniform(dy, n, 1.0f, 9);
  fill_uniform(db0, cols, 0.5f, 10); /* dbias accumulates onto what it holds */
  memcpy(db1, db0, (size_t)cols * sizeof *db0);
  memcpy(pre, x, (size_t)n * sizeof *x);
  OK(mpt_op_bias_add(NULL, pre, bias, rows, cols, 1));
  fill_uniform(dx0, n, 9.0f, 11); /* garbage: written, not read */
  fill_uniform(dx1, n, 9.0f, 12);
  OK(mpt_op_gelu_backward_beta(NULL, dx0, dy, pre, n, 0.0f));
  OK(mpt_op_bias_backward(NULL, db0, dx0, rows, cols, 1));
  OK(mpt_op_bias_gelu_backward(NULL, dx1, dy, x, bias, rows, cols, db1));
  assert_same_bits("dx", dx1, dx0, n);
  assert_same_bits("dbias", db1, db0, cols);
  fill_uniform(dx1, n, 9.0f, 13); /* no bias gradient asked for */
  OK(mpt_op_bias_gelu_backward(NULL, dx1, dy, x, bias, rows, cols, NULL));
  assert_same_bits("dx (no dbias)", dx1, dx0, n);
  OK(mpt_cpu_set_threads(1));
  free(x), free(bias), free(dy), free(pre), free(dx0), free(dx1), free(db0), free(db1);
}
END_TEST

START_TEST(test_fused_core_ops_reject_bad_arguments) {
  float a[8] = {0}, b[8] = {0}, w[4] = {1, 1, 1, 1}, bias[4] = {0}, s[8], y[8], m[2], r[2];
  ck_assert_int_eq(mpt_op_add_layernorm(NULL, NULL, b, 2, 4, w, bias, 1e-5f, s, y, m, r),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_op_add_layernorm(NULL, a, b, 2, 4, w, bias, 1e-5f, s, s, m, r),
                   MPT_EINVAL); /* y over sum */
  ck_assert_int_eq(mpt_op_add_layernorm(NULL, a, b, 2, 4, w, bias, -1.0f, s, y, m, r),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_op_add_layernorm(NULL, a, b, -1, 4, w, bias, 1e-5f, s, y, m, r),
                   MPT_EINVAL);
  OK(mpt_op_add_layernorm(NULL, NULL, NULL, 0, 4, NULL, NULL, 1e-5f, NULL, NULL, NULL, NULL));
  ck_assert_int_eq(mpt_op_bias_gelu(NULL, y, a, NULL, 2, 4), MPT_EINVAL);
  OK(mpt_op_bias_gelu(NULL, NULL, NULL, NULL, 0, 4));
  ck_assert_int_eq(mpt_op_bias_gelu_backward(NULL, y, b, a, NULL, 2, 4, bias), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_bias_gelu_backward(NULL, a, b, a, bias, 2, 4, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_bias_gelu_backward(NULL, b, b, a, bias, 2, 4, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_bias_gelu_backward(NULL, y, b, a, bias, 2, -4, NULL), MPT_EINVAL);
}
END_TEST

/* ---- tape ops: fused against unfused, and finite differences ---- */

enum { NR = 6, NCH = 8, NOUT = 12, MAXP = 4 };

/* A model whose parameters are the op's inputs (so every input gets a gradient). */
typedef struct fx {
  mpt_model *model;
  mpt_tape *tape;
  int np, fused, nout;
  int64_t rows, count[2]; /* count: the outputs' elements */
  float *r[2]; /* weights of L = sum_k sum(out_k * r_k) */
} fx;

typedef mpt_status (*build_fn)(fx *f, mpt_var **out);

static mpt_var *pv(fx *f, int index) {
  mpt_var *v = NULL;
  OK(mpt_tape_param(f->tape, index, &v));
  return v;
}

static void fx_init(fx *f, int64_t rows, const int64_t (*shapes)[2], const int *ndims, int np,
                    int nout, int64_t out_count0, int64_t out_count1) {
  memset(f, 0, sizeof *f);
  f->np = np;
  f->nout = nout;
  f->rows = rows;
  OK(mpt_model_init(&f->model, mpt_device_cpu()));
  char name[8] = "p0";
  for (int i = 0; i < np; i++) {
    int index = -1;
    name[1] = (char)('0' + i);
    OK(mpt_model_add_param(f->model, name, ndims[i], shapes[i], MPT_INIT_ZEROS, 1, &index));
  }
  OK(mpt_model_finalize(f->model));
  for (int i = 0; i < np; i++) {
    const mpt_tensor t = mpt_model_param(f->model, i);
    fill_uniform(t.data, t.count, i == 0 ? 2.0f : 1.0f, 100u + (uint32_t)i);
  }
  OK(mpt_tape_init(&f->tape, f->model, NULL));
  f->r[0] = floats(out_count0);
  fill_uniform(f->r[0], out_count0, 1.0f, 200);
  if (nout > 1) {
    f->r[1] = floats(out_count1);
    fill_uniform(f->r[1], out_count1, 1.0f, 201);
  }
}

static void fx_free(fx *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
  free(f->r[0]);
  free(f->r[1]);
}

/* Runs the build; with grad, backpropagates L. Returns L in double (forward values). */
static double run(fx *f, build_fn build, int grad, float **outs) {
  mpt_var *out[2] = {NULL, NULL};
  if (grad) OK(mpt_model_zero_grad(f->model, NULL));
  mpt_tape_reset(f->tape, 7);
  mpt_tape_set_grad_enabled(f->tape, grad);
  OK(build(f, out));
  double l = 0;
  mpt_var *loss = NULL;
  for (int k = 0; k < f->nout; k++) {
    const mpt_tensor *t = mpt_var_value(out[k]);
    const float *v = t->data;
    f->count[k] = t->count;
    for (int64_t i = 0; i < t->count; i++) l += (double)v[i] * f->r[k][i];
    if (outs) {
      outs[k] = floats(t->count);
      memcpy(outs[k], v, (size_t)t->count * sizeof *v);
    }
    if (!grad) continue;
    mpt_var *rv = NULL, *prod = NULL, *part = NULL;
    mpt_tensor rt = mpt_tensor_view(f->r[k], mpt_device_cpu(), MPT_F32, t->ndim, t->shape);
    OK(mpt_tape_input(f->tape, &rt, &rv));
    OK(mpt_nn_mul(f->tape, out[k], rv, &prod));
    OK(mpt_nn_sum(f->tape, prod, &part));
    if (loss)
      OK(mpt_nn_add(f->tape, loss, part, &loss));
    else
      loss = part;
  }
  if (grad) OK(mpt_tape_backward(f->tape, loss, 1.0f));
  mpt_tape_set_grad_enabled(f->tape, 1);
  return l;
}

/* Fused and unfused: the same outputs and gradients, bit for bit. */
static void check_fused_equals_unfused(fx *f, build_fn build) {
  float *outs[2][2] = {{NULL, NULL}, {NULL, NULL}};
  const int64_t total = mpt_model_param_count(f->model);
  float *grads[2];
  for (int fused = 0; fused < 2; fused++) {
    f->fused = fused;
    run(f, build, 1, outs[fused]);
    grads[fused] = floats(total);
    memcpy(grads[fused], mpt_model_grads(f->model), (size_t)total * sizeof(float));
  }
  for (int k = 0; k < f->nout; k++)
    assert_same_bits(k ? "sum" : "y", outs[1][k], outs[0][k], f->count[k]);
  assert_same_bits("gradients", grads[1], grads[0], total);
  for (int fused = 0; fused < 2; fused++) free(grads[fused]);
  for (int k = 0; k < 2; k++) {
    free(outs[0][k]);
    free(outs[1][k]);
  }
}

/* Central differences in double against the fused backward, every element of every input.
 * Tolerance as tests/test_gpt_ops.c (float32 forward, eps 1e-2): 2e-3 relative + 1e-4. */
static void check_finite_differences(fx *f, build_fn build) {
  f->fused = 1;
  run(f, build, 1, NULL);
  const int64_t total = mpt_model_param_count(f->model);
  float *analytic = floats(total);
  memcpy(analytic, mpt_model_grads(f->model), (size_t)total * sizeof(float));
  float *p = mpt_model_params(f->model);
  for (int64_t j = 0; j < total; j++) {
    const float saved = p[j];
    p[j] = saved + 1e-2f;
    const double up = (double)p[j] - saved, lp = run(f, build, 0, NULL);
    p[j] = saved - 1e-2f;
    const double down = (double)saved - p[j], lm = run(f, build, 0, NULL);
    p[j] = saved;
    const double numeric = (lp - lm) / (up + down), err = fabs(numeric - analytic[j]);
    const double tol = 2e-3 * fmax(fabs(numeric), fabs(analytic[j])) + 1e-4;
    ck_assert_msg(err <= tol, "parameter element %lld: analytic %.6g, numeric %.6g (err %.3g)",
                  (long long)j, analytic[j], numeric, err);
  }
  free(analytic);
}

/* y = gelu(x W^T + b): x [2, rows/2, C] (a 3-D input), W [OUT, C], b [OUT]. */
static mpt_status linear_gelu_build(fx *f, mpt_var **out) {
  if (f->fused) return mpt_nn_linear_gelu(f->tape, pv(f, 0), pv(f, 1), pv(f, 2), &out[0]);
  mpt_var *h = NULL;
  MPT_RETURN_IF(mpt_nn_linear_nd(f->tape, pv(f, 0), pv(f, 1), pv(f, 2), &h));
  return mpt_nn_gelu(f->tape, h, &out[0]);
}

static void linear_gelu_fx(fx *f, int64_t rows) {
  const int64_t shapes[3][2] = {{rows, NCH}, {NOUT, NCH}, {NOUT, 0}};
  const int ndims[3] = {2, 2, 1};
  fx_init(f, rows, shapes, ndims, 3, 1, rows * NOUT, 0);
}

START_TEST(test_linear_gelu_equals_linear_then_gelu_bit_for_bit) {
  fx f;
  linear_gelu_fx(&f, _i == 0 ? NR : 600); /* one block of the bias gradient, and three */
  OK(mpt_cpu_set_threads(_i == 0 ? 1 : 2));
  check_fused_equals_unfused(&f, linear_gelu_build);
  OK(mpt_cpu_set_threads(1));
  fx_free(&f);
}
END_TEST

START_TEST(test_linear_gelu_gradients_match_finite_differences) {
  fx f;
  linear_gelu_fx(&f, NR);
  check_finite_differences(&f, linear_gelu_build);
  fx_free(&f);
}
END_TEST

/* sum = a + b and y = LayerNorm(sum), both outputs in L. */
static mpt_status add_ln_build(fx *f, mpt_var **out) {
  if (f->fused)
    return mpt_nn_add_layernorm(f->tape, pv(f, 0), pv(f, 1), pv(f, 2), pv(f, 3), 1e-5f, &out[1],
                                &out[0]);
  MPT_RETURN_IF(mpt_nn_add(f->tape, pv(f, 0), pv(f, 1), &out[1]));
  return mpt_nn_layernorm(f->tape, out[1], pv(f, 2), pv(f, 3), 1e-5f, &out[0]);
}

static void add_ln_fx(fx *f, int64_t rows) {
  const int64_t shapes[4][2] = {{rows, NCH}, {rows, NCH}, {NCH, 0}, {NCH, 0}};
  const int ndims[4] = {2, 2, 1, 1};
  fx_init(f, rows, shapes, ndims, 4, 2, rows * NCH, rows * NCH);
}

START_TEST(test_add_layernorm_equals_add_then_layernorm_bit_for_bit) {
  fx f;
  add_ln_fx(&f, _i == 0 ? NR : 600);
  OK(mpt_cpu_set_threads(_i == 0 ? 1 : 2));
  check_fused_equals_unfused(&f, add_ln_build);
  OK(mpt_cpu_set_threads(1));
  fx_free(&f);
}
END_TEST

START_TEST(test_add_layernorm_gradients_match_finite_differences) {
  fx f;
  add_ln_fx(&f, NR);
  check_finite_differences(&f, add_ln_build);
  fx_free(&f);
}
END_TEST

/* The same on intermediate vars (the residual stream in the GPT is one): a = gelu(p0) and
 * b = gelu(p1) are new vars, so the add's backward hands a its gradient storage
 * (mpt_var_grad_take) instead of a copy; _i = 1 adds a to itself (a is b). */
static mpt_status add_ln_inner_build(fx *f, mpt_var **out) {
  mpt_var *a = NULL, *b = NULL;
  MPT_RETURN_IF(mpt_nn_gelu(f->tape, pv(f, 0), &a));
  if (f->np == 5) /* the a-is-b variant: p1 unused as a term */
    b = a;
  else
    MPT_RETURN_IF(mpt_nn_gelu(f->tape, pv(f, 1), &b));
  if (f->fused)
    return mpt_nn_add_layernorm(f->tape, a, b, pv(f, 2), pv(f, 3), 1e-5f, &out[1], &out[0]);
  MPT_RETURN_IF(mpt_nn_add(f->tape, a, b, &out[1]));
  return mpt_nn_layernorm(f->tape, out[1], pv(f, 2), pv(f, 3), 1e-5f, &out[0]);
}

static void add_ln_inner_fx(fx *f, int same) {
  const int64_t shapes[5][2] = {{NR, NCH}, {NR, NCH}, {NCH, 0}, {NCH, 0}, {1, 0}};
  const int ndims[5] = {2, 2, 1, 1, 1};
  /* the a-is-b variant registers a fifth (unused) parameter to tell the build */
  fx_init(f, NR, shapes, ndims, same ? 5 : 4, 2, NR * NCH, NR * NCH);
}

START_TEST(test_add_layernorm_of_intermediate_vars_equals_unfused_and_differences) {
  fx f;
  add_ln_inner_fx(&f, _i);
  check_fused_equals_unfused(&f, add_ln_inner_build);
  check_finite_differences(&f, add_ln_inner_build);
  fx_free(&f);
}
END_TEST

/* mpt_var_grad_take: only a new var without gradient storage takes a new var's storage. */
START_TEST(test_var_grad_take_moves_storage_only_between_new_vars) {
  fx f;
  add_ln_fx(&f, NR);
  mpt_tape_reset(f.tape, 7);
  mpt_var *p = pv(&f, 0), *u = NULL, *v = NULL, *w = NULL;
  OK(mpt_nn_gelu(f.tape, p, &u)); /* u, v, w: new vars that need gradients */
  OK(mpt_nn_gelu(f.tape, u, &v));
  OK(mpt_nn_gelu(f.tape, v, &w));
  int taken = -1;
  OK(mpt_var_grad_take(f.tape, u, w, &taken)); /* w has no storage yet */
  ck_assert_int_eq(taken, 0);
  ck_assert_ptr_null(mpt_var_grad(u)->data);
  float *gw = NULL;
  OK(mpt_var_grad_acc(f.tape, w, &gw));
  OK(mpt_var_grad_take(f.tape, p, w, &taken)); /* a parameter keeps the model's storage */
  ck_assert_int_eq(taken, 0);
  ck_assert_ptr_eq(mpt_var_grad(p)->data, mpt_model_grad(f.model, 0).data);
  OK(mpt_var_grad_take(f.tape, v, w, &taken));
  ck_assert_int_eq(taken, 1);
  ck_assert_ptr_eq(mpt_var_grad(v)->data, gw);
  float *gu = NULL;
  OK(mpt_var_grad_acc(f.tape, u, &gu));
  OK(mpt_var_grad_take(f.tape, u, w, &taken)); /* u has storage of its own now */
  ck_assert_int_eq(taken, 0);
  ck_assert_ptr_ne(gu, gw);
  ck_assert_int_eq(mpt_var_grad_take(f.tape, NULL, w, &taken), MPT_EINVAL);
  fx_free(&f);
}
END_TEST

START_TEST(test_fused_tape_ops_reject_bad_arguments) {
  fx f;
  add_ln_fx(&f, NR);
  mpt_var *s = NULL, *y = NULL;
  mpt_tape_reset(f.tape, 7);
  /* weight [C] where [rows, C] is given, and a shape mismatch between a and b */
  ck_assert_int_eq(mpt_nn_add_layernorm(f.tape, pv(&f, 0), pv(&f, 2), pv(&f, 2), pv(&f, 3),
                                        1e-5f, &s, &y), MPT_ESHAPE);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(mpt_nn_add_layernorm(f.tape, pv(&f, 0), pv(&f, 1), pv(&f, 0), pv(&f, 3),
                                        1e-5f, &s, &y), MPT_ESHAPE);
  ck_assert_int_eq(mpt_nn_add_layernorm(f.tape, pv(&f, 0), pv(&f, 1), pv(&f, 2), pv(&f, 3),
                                        NAN, &s, &y), MPT_EINVAL);
  /* linear_gelu: no bias; weight [C] (not 2-D) */
  ck_assert_int_eq(mpt_nn_linear_gelu(f.tape, pv(&f, 0), pv(&f, 1), NULL, &y), MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_linear_gelu(f.tape, pv(&f, 0), pv(&f, 2), pv(&f, 3), &y),
                   MPT_ESHAPE);
  ck_assert_ptr_null(y);
  fx_free(&f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpt_fused");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_add_layernorm_is_add_then_layernorm_bit_for_bit, 0, 8);
  tcase_add_loop_test(tc, test_bias_gelu_is_bias_add_then_gelu_bit_for_bit, 0, 8);
  tcase_add_loop_test(tc, test_bias_gelu_backward_is_gelu_backward_then_bias_backward_bit_for_bit,
                      0, 8);
  tcase_add_test(tc, test_fused_core_ops_reject_bad_arguments);
  suite_add_tcase(s, tc);
  TCase *tt = tcase_create("tape");
  tcase_set_timeout(tt, 120);
  tcase_add_loop_test(tt, test_linear_gelu_equals_linear_then_gelu_bit_for_bit, 0, 2);
  tcase_add_test(tt, test_linear_gelu_gradients_match_finite_differences);
  tcase_add_loop_test(tt, test_add_layernorm_equals_add_then_layernorm_bit_for_bit, 0, 2);
  tcase_add_test(tt, test_add_layernorm_gradients_match_finite_differences);
  tcase_add_loop_test(tt, test_add_layernorm_of_intermediate_vars_equals_unfused_and_differences,
                      0, 2);
  tcase_add_test(tt, test_var_grad_take_moves_storage_only_between_new_vars);
  tcase_add_test(tt, test_fused_tape_ops_reject_bad_arguments);
  suite_add_tcase(s, tt);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
