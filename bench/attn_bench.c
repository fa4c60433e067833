/* mpt_attn_bench: the fp32 causal attention layer (mpt_nn_causal_attention) on the CPU, the
 * reference that materialises [B, H, T, T] (src/nn/attention.c) against the fused op
 * (src/core/cpu/attn_cpu.c), side by side (bench/README.md "mpt_attn_bench").
 *
 *   mpt_attn_bench [B T C H [threads [reps [only]]]]   (default 8 256 384 6 1 20: gpt-mini's layer)
 *
 * only (for a profiler): `fused` or `reference` times that one alone (the other's column is 0).
 *
 * Each repetition runs forward + backward (the upstream gradient a fixed random dy, through
 * y * dy summed: a small elementwise cost in both) on a fresh tape pass, reference then fused,
 * alternating (R F R F ...) so that a noisy machine hits both alike; after one untimed warm-up
 * of each. Prints the times and ratios, and whether y and dqkv agree bit
 * for bit (they must: attn_cpu.c). Columns: the median wall time, and the median CPU time of the
 * process (all threads: at one thread it does not count the time other processes hold the
 * core). Threads: mpt_cpu_set_threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/autograd.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/transformer.h"
#include "nn/gpt_ops.h"

#define DIE_IF(expr)                                                                       \
  do {                                                                                     \
    mpt_status st_ = (expr);                                                               \
    if (st_ != MPT_OK) {                                                                   \
      fprintf(stderr, "attn_bench: %s: %s: %s\n", #expr, mpt_status_name(st_),             \
              mpt_last_error());                                                           \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static double now_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct run {
  mpt_model *model;
  mpt_tape *tape;
  mpt_tensor dyt; /* the upstream gradient [B, T, C] */
  int nh;
} run;

/* One forward + backward; fused 0: the reference. Returns wall seconds; *cpu_s: the process's
 * CPU seconds (all its threads). */
static double pass(run *r, int fused, double *cpu_s) {
  mpt_var *qkv = NULL, *y = NULL, *dy = NULL, *loss = NULL;
  const double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
  DIE_IF(mpt_model_zero_grad(r->model, NULL));
  mpt_tape_reset(r->tape, 1);
  DIE_IF(mpt_tape_param(r->tape, 0, &qkv));
  const int nh = r->nh;
  DIE_IF(fused ? mpt_nn_causal_attention(r->tape, qkv, nh, &y)
               : mpt__causal_attention_reference(r->tape, qkv, nh, &y));
  DIE_IF(mpt_tape_input(r->tape, &r->dyt, &dy));
  DIE_IF(mpt_nn_mul(r->tape, y, dy, &y));
  DIE_IF(mpt_nn_sum(r->tape, y, &loss));
  DIE_IF(mpt_tape_backward(r->tape, loss, 1.0f));
  if (cpu_s) *cpu_s = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
  return now_s(CLOCK_MONOTONIC) - t0;
}

int main(int argc, char **argv) {
  int64_t nb = 8, nt = 256, c = 384, nh = 6;
  int threads = 1, reps = 20;
  if (argc > 1 && argc < 5) {
    fprintf(stderr, "usage: mpt_attn_bench [B T C H [threads [reps [fused|reference]]]]\n");
    return 2;
  }
  if (argc >= 5) {
    nb = atoll(argv[1]);
    nt = atoll(argv[2]);
    c = atoll(argv[3]);
    nh = atoll(argv[4]);
  }
  if (argc >= 6) threads = atoi(argv[5]);
  if (argc >= 7) reps = atoi(argv[6]);
  int only = 0; /* 1: fused alone, 2: reference alone */
  if (argc >= 8) only = !strcmp(argv[7], "fused") ? 1 : !strcmp(argv[7], "reference") ? 2 : -1;
  if (only < 0) {
    fprintf(stderr, "mpt_attn_bench: only: fused or reference, not %s\n", argv[7]);
    return 2;
  }
  if (nb < 1 || nt < 1 || c < 1 || nh < 1 || c % nh || threads < 1 || reps < 1) {
    fprintf(stderr, "mpt_attn_bench: bad sizes (B %lld T %lld C %lld H %lld threads %d reps %d)\n",
            (long long)nb, (long long)nt, (long long)c, (long long)nh, threads, reps);
    return 2;
  }
  DIE_IF(mpt_cpu_set_threads(threads));
  run r = {0};
  const int64_t shape[3] = {nb, nt, 3 * c}, yshape[3] = {nb, nt, c};
  DIE_IF(mpt_model_init(&r.model, mpt_device_cpu()));
  DIE_IF(mpt_model_add_param(r.model, "qkv", 3, shape, MPT_INIT_FAN_IN, 16, NULL));
  DIE_IF(mpt_model_finalize(r.model));
  DIE_IF(mpt_model_init_params(r.model, 5));
  DIE_IF(mpt_tape_init(&r.tape, r.model, NULL));
  const int64_t ycount = nb * nt * c, gcount = nb * nt * 3 * c;
  float *dyv = malloc((size_t)ycount * sizeof *dyv);
  float *yref = malloc((size_t)ycount * sizeof *yref);
  float *gref = malloc((size_t)gcount * sizeof *gref);
  double *tr = malloc((size_t)reps * sizeof *tr), *tf = malloc((size_t)reps * sizeof *tf);
  double *cr = malloc((size_t)reps * sizeof *cr), *cf = malloc((size_t)reps * sizeof *cf);
  if (!dyv || !yref || !gref || !tr || !tf || !cr || !cf) return 1;
  mpt_rng rng;
  mpt_rng_seed(&rng, 9);
  mpt_rng_fill_uniform(&rng, dyv, ycount, -1.0f, 1.0f);
  r.dyt = mpt_tensor_view(dyv, mpt_device_cpu(), MPT_F32, 3, yshape);
  r.nh = (int)nh;
  /* warm-up, and the reference's gradient for the comparison */
  pass(&r, 0, NULL);
  memcpy(gref, mpt_model_grad(r.model, 0).data, (size_t)gcount * sizeof *gref);
  int same_g;
  pass(&r, 1, NULL);
  same_g = !memcmp(gref, mpt_model_grad(r.model, 0).data, (size_t)gcount * sizeof *gref);
  for (int i = 0; i < reps; i++) {
    tr[i] = cr[i] = tf[i] = cf[i] = 0.0;
    if (only != 1) tr[i] = pass(&r, 0, &cr[i]);
    if (only != 2) tf[i] = pass(&r, 1, &cf[i]);
  }
  qsort(tr, (size_t)reps, sizeof *tr, cmp_double);
  qsort(tf, (size_t)reps, sizeof *tf, cmp_double);
  qsort(cr, (size_t)reps, sizeof *cr, cmp_double);
  qsort(cf, (size_t)reps, sizeof *cf, cmp_double);
  /* forward outputs: one more pass each, without grad */
  mpt_var *qkv = NULL, *y = NULL;
  mpt_tape_reset(r.tape, 1);
  mpt_tape_set_grad_enabled(r.tape, 0);
  DIE_IF(mpt_tape_param(r.tape, 0, &qkv));
  DIE_IF(mpt__causal_attention_reference(r.tape, qkv, (int)nh, &y));
  memcpy(yref, mpt_var_value(y)->data, (size_t)ycount * sizeof *yref);
  DIE_IF(mpt_nn_causal_attention(r.tape, qkv, (int)nh, &y));
  const int same_y = !memcmp(yref, mpt_var_value(y)->data, (size_t)ycount * sizeof *yref);
  printf("# mpt_attn_bench: causal attention fp32, forward + backward, B %lld T %lld C %lld "
         "H %lld, %d thread(s), %d reps alternating, medians (ms): wall, and CPU time of all "
         "threads\n",
         (long long)nb, (long long)nt, (long long)c, (long long)nh, threads, reps);
  const int m = reps / 2;
  printf("%10s %10s %8s %10s %10s %8s %8s %8s\n", "wall-ref", "wall-fused", "ratio", "cpu-ref",
         "cpu-fused", "ratio", "y", "dqkv");
  printf("%10.3f %10.3f %8.3f %10.3f %10.3f %8.3f %8s %8s\n", 1e3 * tr[m], 1e3 * tf[m],
         tr[m] / tf[m], 1e3 * cr[m], 1e3 * cf[m], cr[m] / cf[m], same_y ? "same" : "DIFFER",
         same_g ? "same" : "DIFFER");
  mpt_tape_free(r.tape);
  mpt_model_free(r.model);
  free(dyv);
  free(yref);
  free(gref);
  free(tr);
  free(tf);
  free(cr);
  free(cf);
  return same_y && same_g ? 0 : 1;
}
