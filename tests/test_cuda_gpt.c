/* Tests of the GPT model (src/nn/gpt.c) and mpt_clip_grad_norm (src/optim/clip.c) on a CUDA
 * device, against the same on the CPU. Exits 77 (automake's SKIP) with "SKIP: no CUDA device"
 * when no GPU is present.
 *
 * - Initialisation is drawn on the host: a GPT built on the GPU from a seed has bit for bit the
 *   CPU's parameters; mpt_gpt_save from the GPU writes the same bytes as from the CPU, and
 *   mpt_gpt_load into a GPU model of another seed gives them back bit for bit.
 * - Forward + backward of the tiny GPT (L 2, H 2, C 16, T 8, V 23 -> Vp 128, B 2): the loss to
 *   1e-5 relative, every gradient to 1e-4 of the largest (cuBLAS runs plain FP32; the CUDA
 *   kernels differ from the CPU's by float rounding, as tests/backend_op_cases.c states).
 * - mpt_clip_grad_norm on the GPU (a GEMM dot product on the model's stream): the norm to 1e-5
 *   relative of the CPU's (double) one, and the clipped gradients as the CPU's.
 * - Training, the trainer's step (src/cli/train_gpt.c) on both devices from the same start:
 *   5 steps of forward, backward, clipping at 0.5 (active) and SGD (momentum 0.9, lr 0.1,
 *   weight decay 0.01 on the >= 2-D weights only, as mpt_param_groups_split_decay splits them)
 *   on the GPU state: every loss to 1e-5 relative, the parameters' changes to 2e-4 of the
 *   largest change. Why: SGD with momentum is linear in the gradients, which agree to 1e-4 of
 *   the largest (above), and clipping scales both sides alike; a missing clip, a wrong decay
 *   group or a lost momentum buffer changes them by percents. (AdamW is not used here: it
 *   divides each gradient by its own RMS, so rounding-level gradients, e.g. the key biases',
 *   move by up to lr either way; tests/test_train_gpt_cuda.sh compares AdamW runs in norm.)
 * Check runs without forking: a CUDA context does not survive fork(). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/ops.h"
#include "mpitrain/optim.h"
#include "mpitrain/gpt_file.h"
#include "mpitrain/transformer.h"
#include "check_util.h"

#define TIMEOUT_MS 60000.0

enum { TB = 2, TT = 8 };

static const mpt_device GPU = {MPT_DEVICE_CUDA, 0};

static mpt_gpt_config tiny_config(void) {
  mpt_gpt_config c = {.max_seq_len = TT, .vocab_size = 23, .num_layers = 2, .num_heads = 2,
                      .channels = 16, .padded_vocab_size = 0};
  return c;
}

typedef struct side {
  mpt_model *m;
  mpt_stream *s; /* NULL on the CPU */
  mpt_tape *tape;
  mpt_tensor tok, tgt;
} side;

static void down(mpt_stream *s, void *dst, const void *src, size_t nbytes) {
  OK(mpt_op_memcpy(s, mpt_device_cpu(), dst, GPU, src, nbytes));
  OK(mpt_stream_synchronize(s, TIMEOUT_MS));
}

static void side_init(side *x, mpt_device dev, uint64_t seed, const int32_t *tok,
                      const int32_t *tgt) {
  mpt_gpt_config c = tiny_config();
  memset(x, 0, sizeof *x);
  OK(mpt_model_init_gpt(&x->m, dev, &c, seed));
  if (dev.type == MPT_DEVICE_CUDA) OK(mpt_stream_init(&x->s, dev, MPT_STREAM_INLINE));
  OK(mpt_tape_init(&x->tape, x->m, x->s));
  const int64_t shape[2] = {TB, TT};
  void *dt = (void *)tok, *dg = (void *)tgt;
  if (x->s) {
    OK(mpt_device_alloc(dev, TB * TT * sizeof *tok, &dt));
    OK(mpt_device_alloc(dev, TB * TT * sizeof *tgt, &dg));
    OK(mpt_op_memcpy(x->s, dev, dt, mpt_device_cpu(), tok, TB * TT * sizeof *tok));
    OK(mpt_op_memcpy(x->s, dev, dg, mpt_device_cpu(), tgt, TB * TT * sizeof *tgt));
    OK(mpt_stream_synchronize(x->s, TIMEOUT_MS));
  }
  x->tok = mpt_tensor_view(dt, dev, MPT_I32, 2, shape);
  x->tgt = mpt_tensor_view(dg, dev, MPT_I32, 2, shape);
}

static float side_step(side *x) {
  mpt_var *in = NULL, *logits = NULL, *loss = NULL;
  float value = 0;
  OK(mpt_model_zero_grad(x->m, x->s));
  mpt_tape_reset(x->tape, 1);
  OK(mpt_tape_input(x->tape, &x->tok, &in));
  OK(mpt_model_forward(x->m, x->tape, in, &logits));
  OK(mpt_nn_cross_entropy_vocab(x->tape, logits, &x->tgt, 23, &loss));
  OK(mpt_tape_backward(x->tape, loss, 1.0f));
  OK(mpt_var_item(x->tape, loss, &value));
  return value;
}

static void side_free(side *x) {
  if (x->s) {
    mpt_device_free(x->tok.device, x->tok.data);
    mpt_device_free(x->tgt.device, x->tgt.data);
  }
  mpt_tape_free(x->tape);
  mpt_stream_free(x->s);
  mpt_model_free(x->m);
}

static void check_close(const char *what, const float *got, const float *want, int64_t n,
                        double rel_of_max) {
  double wmax = 0, err = 0;
  for (int64_t i = 0; i < n; i++) wmax = fmax(wmax, fabs(want[i]));
  for (int64_t i = 0; i < n; i++) err = fmax(err, fabs((double)got[i] - want[i]));
  ck_assert_msg(err <= rel_of_max * wmax, "%s: max |diff| %.3g > %.3g", what, err,
                rel_of_max * wmax);
}

START_TEST(test_gpt_on_cuda_matches_cpu) {
  int32_t tok[TB * TT], tgt[TB * TT];
  for (int i = 0; i < TB * TT; i++) {
    tok[i] = (int32_t)((i * 7 + 3) % 23);
    tgt[i] = (int32_t)((i * 5 + 1) % 23);
  }
  side cpu, gpu;
  side_init(&cpu, mpt_device_cpu(), 3, tok, tgt);
  side_init(&gpu, GPU, 3, tok, tgt);
  const int64_t n = mpt_model_param_count(cpu.m);
  const size_t nbytes = (size_t)n * sizeof(float);
  float *host = malloc(nbytes);
  ck_assert_ptr_nonnull(host);
  down(gpu.s, host, mpt_model_params(gpu.m), nbytes);
  ck_assert_mem_eq(host, mpt_model_params(cpu.m), nbytes);
  /* forward + backward */
  const float lc = side_step(&cpu), lg = side_step(&gpu);
  ck_assert_msg(fabsf(lc - lg) <= 1e-5f * fabsf(lc), "loss: cpu %.9g, cuda %.9g", lc, lg);
  down(gpu.s, host, mpt_model_grads(gpu.m), nbytes);
  check_close("gradients", host, mpt_model_grads(cpu.m), n, 1e-4);
  /* clipping: the norm and the clipped gradients */
  float nc = 0, ng = 0;
  OK(mpt_clip_grad_norm(cpu.m, NULL, 0.1f, &nc));
  OK(mpt_clip_grad_norm(gpu.m, gpu.s, 0.1f, &ng));
  ck_assert_msg(nc > 0.1f, "norm %g: clipping inactive", (double)nc);
  ck_assert_msg(fabsf(nc - ng) <= 1e-5f * nc, "norm: cpu %.9g, cuda %.9g", nc, ng);
  down(gpu.s, host, mpt_model_grads(gpu.m), nbytes);
  check_close("clipped gradients", host, mpt_model_grads(cpu.m), n, 1e-4);
  ck_assert_int_eq(mpt_clip_grad_norm(gpu.m, NULL, 0.1f, &ng), MPT_EINVAL); /* no stream */
  free(host);
  side_free(&cpu);
  side_free(&gpu);
}
END_TEST

static void sgd_init(mpt_optimizer **opt, const mpt_model *m, mpt_device dev) {
  mpt_optimizer_config oc = mpt_optimizer_config_default();
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  oc.weight_decay = 0.01f;
  mpt_param_group groups[64];
  int ngroups = 0;
  OK(mpt_optimizer_init(opt, &oc, dev, mpt_model_param_count(m)));
  OK(mpt_param_groups_split_decay(m, oc.weight_decay, groups, 64, &ngroups));
  ck_assert_int_gt(ngroups, 1);
  OK(mpt_optimizer_set_groups(*opt, groups, ngroups));
}

START_TEST(test_gpt_training_on_cuda_tracks_cpu) {
  int32_t tok[TB * TT], tgt[TB * TT];
  for (int i = 0; i < TB * TT; i++) {
    tok[i] = (int32_t)((i * 11 + 2) % 23);
    tgt[i] = (int32_t)((i * 3 + 7) % 23);
  }
  side cpu, gpu;
  side_init(&cpu, mpt_device_cpu(), 4, tok, tgt);
  side_init(&gpu, GPU, 4, tok, tgt);
  mpt_optimizer *oc = NULL, *og = NULL;
  sgd_init(&oc, cpu.m, mpt_device_cpu());
  sgd_init(&og, gpu.m, GPU);
  const int64_t n = mpt_model_param_count(cpu.m);
  const size_t nbytes = (size_t)n * sizeof(float);
  float *start = malloc(nbytes), *host = malloc(nbytes), *dc = malloc(nbytes);
  ck_assert(start && host && dc);
  memcpy(start, mpt_model_params(cpu.m), nbytes);
  for (int k = 0; k < 5; k++) {
    const float lc = side_step(&cpu), lg = side_step(&gpu);
    ck_assert_msg(fabsf(lc - lg) <= 1e-5f * fabsf(lc), "step %d loss: cpu %.9g, cuda %.9g", k,
                  lc, lg);
    float nc = 0, ng = 0;
    OK(mpt_clip_grad_norm(cpu.m, NULL, 0.5f, &nc));
    OK(mpt_clip_grad_norm(gpu.m, gpu.s, 0.5f, &ng));
    ck_assert_msg(nc > 0.5f, "step %d: norm %g, clipping inactive", k, (double)nc);
    OK(mpt_optimizer_step_model(oc, cpu.m, NULL, 0.1f));
    OK(mpt_optimizer_step_model(og, gpu.m, gpu.s, 0.1f));
  }
  down(gpu.s, host, mpt_model_params(gpu.m), nbytes);
  for (int64_t i = 0; i < n; i++) { /* the changes from the start */
    dc[i] = mpt_model_params(cpu.m)[i] - start[i];
    host[i] -= start[i];
  }
  check_close("parameter changes after 5 steps", host, dc, n, 2e-4);
  mpt_optimizer_free(oc);
  mpt_optimizer_free(og);
  free(start);
  free(host);
  free(dc);
  side_free(&cpu);
  side_free(&gpu);
}
END_TEST

static char *slurp(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)*len);
  ck_assert_ptr_nonnull(buf);
  ck_assert_int_eq(fread(buf, 1, (size_t)*len, f), *len);
  fclose(f);
  return buf;
}

START_TEST(test_gpt_files_from_and_to_cuda) {
  char dir[] = "/tmp/test_cuda_gpt_XXXXXX", pc[256], pg[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(pc, sizeof pc, "%s/cpu.bin", dir);
  snprintf(pg, sizeof pg, "%s/gpu.bin", dir);
  mpt_gpt_config c = tiny_config();
  mpt_model *cpu = NULL, *gpu = NULL, *other = NULL;
  OK(mpt_model_init_gpt(&cpu, mpt_device_cpu(), &c, 5));
  OK(mpt_model_init_gpt(&gpu, GPU, &c, 5));
  OK(mpt_model_init_gpt(&other, GPU, &c, 6));
  OK(mpt_gpt_save(cpu, &c, pc));
  OK(mpt_gpt_save(gpu, &c, pg));
  long lc = 0, lg = 0;
  char *bc = slurp(pc, &lc), *bg = slurp(pg, &lg);
  ck_assert_int_eq(lc, lg);
  ck_assert(memcmp(bc, bg, (size_t)lc) == 0);
  OK(mpt_gpt_load(other, &c, pc));
  const size_t nbytes = (size_t)mpt_model_param_count(cpu) * sizeof(float);
  float *host = malloc(nbytes);
  mpt_stream *s = NULL;
  ck_assert_ptr_nonnull(host);
  OK(mpt_stream_init(&s, GPU, MPT_STREAM_INLINE));
  down(s, host, mpt_model_params(other), nbytes);
  ck_assert_mem_eq(host, mpt_model_params(cpu), nbytes);
  mpt_stream_free(s);
  free(host);
  free(bc);
  free(bg);
  unlink(pc);
  unlink(pg);
  rmdir(dir);
  mpt_model_free(cpu);
  mpt_model_free(gpu);
  mpt_model_free(other);
}
END_TEST

int main(void) {
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *suite = suite_create("cuda_gpt");
  TCase *tc = tcase_create("cuda_gpt");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gpt_on_cuda_matches_cpu);
  tcase_add_test(tc, test_gpt_files_from_and_to_cuda);
  tcase_add_test(tc, test_gpt_training_on_cuda_tracks_cpu);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
