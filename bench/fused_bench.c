/* mpt_fused_bench: the fused GPT ops of include/mpitrain/ops_gpt.h against the unfused ops they
 * replace, on the shapes of one GPT block (M = B*T rows), in one process, alternating
 * (unfused, fused, unfused, fused, ...) so that a noisy machine hits both alike:
 *   bias_gelu      mpt_op_bias_add + mpt_op_gelu            vs mpt_op_bias_gelu       [M, 4C]
 *   bias_gelu_bwd  mpt_op_gelu_backward_beta (beta 0)
 *                  + mpt_op_bias_backward                   vs mpt_op_bias_gelu_backward
 *   add_layernorm  mpt_op_copy + mpt_op_axpy + mpt_op_layernorm vs mpt_op_add_layernorm [M, C]
 * The unfused forward works in place on a copy of the GEMM output that is refreshed outside the
 * timed region (as the Linear's output is new memory each step). Prints per-call times
 * (median of the repetitions, ms), the ratio unfused / fused, and whether the outputs agree
 * bit for bit (the "same" column; the fused ops promise it).
 *
 * Then each fused op, and mpt_op_adamw_step over M x 4C parameters, against the memory
 * bandwidth: the bytes it must move at the least (every input read once, every output written
 * once: bias_gelu 8, bias_gelu_bwd 12, add_layernorm 16 bytes an element, AdamW 28 a parameter)
 * over its time, the arrays it streams, and that rate as a fraction of mpt_op_copy's (8 bytes
 * an element, 2 arrays, over M x 4C elements, timed in the same loop). One core's rate grows
 * with the number of arrays it streams at once, so the fraction compares like with like only
 * for bias_gelu (2 arrays, as the copy): well below 1 there, the op is bound by its arithmetic,
 * not by memory.
 *
 *   mpt_fused_bench [--model gpt-mini|gpt2] [--rows M] [--threads N] [--reps R]
 *                   [--clock thread|wall]
 * Defaults: gpt2 (C 768), M 2048, 1 thread, 15 repetitions, the thread's CPU clock (on a
 * machine shared with other jobs: time this thread ran, not time it waited). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"

enum { MAX_REPS = 1000, NCASE = 3 };

static int use_wall;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(use_wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void fill(float *x, int64_t n, unsigned s) {
  for (int64_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)(s >> 8) * (6.0f / 16777216.0f) - 3.0f;
  }
}

static float *floats(int64_t n) {
  float *p = calloc((size_t)n, sizeof *p);
  if (!p) {
    fprintf(stderr, "mpt_fused_bench: out of memory (%lld floats)\n", (long long)n);
    exit(1);
  }
  return p;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call)                                                                          \
  do {                                                                                       \
    if ((call) != MPT_OK) {                                                                  \
      fprintf(stderr, "mpt_fused_bench: %s: %s\n", #call, mpt_last_error());                \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static void usage(void) {
  fprintf(stderr, "usage: mpt_fused_bench [--model gpt-mini|gpt2] [--rows M] [--threads N] "
                  "[--reps R] [--clock thread|wall]\n");
}

int main(int argc, char **argv) {
  const char *model = "gpt2";
  int64_t rows = 2048;
  int threads = 1, reps = 15;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    if (strcmp(argv[i], "--model") == 0) model = argv[++i];
    else if (strcmp(argv[i], "--rows") == 0) rows = atoll(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--clock") == 0) use_wall = strcmp(argv[++i], "wall") == 0;
    else {
      usage();
      return 2;
    }
  }
  const int64_t c = strcmp(model, "gpt-mini") == 0 ? 384 : strcmp(model, "gpt2") == 0 ? 768 : 0;
  if (!c || rows < 1 || threads < 1 || reps < 1 || reps > MAX_REPS) {
    usage();
    return 2;
  }
  CHECK(mpt_cpu_set_threads(threads));
  const int64_t oc = 4 * c, nh = rows * oc, nc = rows * c;
  float *x = floats(nh), *pre = floats(nh), *y0 = floats(nh), *y1 = floats(nh), *dy = floats(nh);
  float *dx0 = floats(nh), *dx1 = floats(nh), *b = floats(oc), *db0 = floats(oc);
  float *db1 = floats(oc), *a = floats(nc), *r = floats(nc), *w = floats(c), *lb = floats(c);
  float *s0 = floats(nc), *s1 = floats(nc), *h0 = floats(nc), *h1 = floats(nc);
  float *m = floats(rows), *rs = floats(rows);
  fill(x, nh, 1), fill(dy, nh, 2), fill(b, oc, 3), fill(a, nc, 4), fill(r, nc, 5);
  fill(w, c, 6), fill(lb, c, 7);
  float *pm = floats(nh), *pv = floats(nh), *cp = floats(nh), *pp = floats(nh);
  static double t[NCASE][2][MAX_REPS], tcopy[MAX_REPS], tadam[MAX_REPS];
  for (int k = 0; k < reps; k++) {
    double t0;
    /* bias + GELU forward */
    memcpy(pre, x, (size_t)nh * sizeof *x);
    t0 = now_ms();
    CHECK(mpt_op_bias_add(NULL, pre, b, rows, oc, 1));
    CHECK(mpt_op_gelu(NULL, y0, pre, nh));
    t[0][0][k] = now_ms() - t0;
    t0 = now_ms();
    CHECK(mpt_op_bias_gelu(NULL, y1, x, b, rows, oc));
    t[0][1][k] = now_ms() - t0;
    /* its backward (pre = x + b from above) */
    memset(db0, 0, (size_t)oc * sizeof *db0);
    memset(db1, 0, (size_t)oc * sizeof *db1);
    t0 = now_ms();
    CHECK(mpt_op_gelu_backward_beta(NULL, dx0, dy, pre, nh, 0.0f));
    CHECK(mpt_op_bias_backward(NULL, db0, dx0, rows, oc, 1));
    t[1][0][k] = now_ms() - t0;
    t0 = now_ms();
    CHECK(mpt_op_bias_gelu_backward(NULL, dx1, dy, x, b, rows, oc, db1));
    t[1][1][k] = now_ms() - t0;
    /* residual add + LayerNorm */
    t0 = now_ms();
    CHECK(mpt_op_copy(NULL, s0, a, nc));
    CHECK(mpt_op_axpy(NULL, nc, 1.0f, r, s0));
    CHECK(mpt_op_layernorm(NULL, s0, rows, c, w, lb, 1e-5f, h0, m, rs));
    t[2][0][k] = now_ms() - t0;
    t0 = now_ms();
    CHECK(mpt_op_add_layernorm(NULL, a, r, rows, c, w, lb, 1e-5f, s1, h1, m, rs));
    t[2][1][k] = now_ms() - t0;
    /* the bandwidth references */
    t0 = now_ms();
    CHECK(mpt_op_copy(NULL, cp, x, nh));
    tcopy[k] = now_ms() - t0;
    t0 = now_ms();
    CHECK(mpt_op_adamw_step(NULL, pp, dy, pm, pv, nh, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, k + 1));
    tadam[k] = now_ms() - t0;
  }
  const int same[NCASE] = {
      memcmp(y0, y1, (size_t)nh * sizeof *y0) == 0,
      memcmp(dx0, dx1, (size_t)nh * sizeof *dx0) == 0 &&
          memcmp(db0, db1, (size_t)oc * sizeof *db0) == 0,
      memcmp(s0, s1, (size_t)nc * sizeof *s0) == 0 &&
          memcmp(h0, h1, (size_t)nc * sizeof *h0) == 0};
  static const char *const names[NCASE] = {"bias_gelu", "bias_gelu_bwd", "add_layernorm"};
  const int64_t cols[NCASE] = {oc, oc, c};
  printf("# mpt_fused_bench: model %s (C %lld), M %lld rows, threads %d, reps %d (median), "
         "clock %s\n", model, (long long)c, (long long)rows, threads, reps,
         use_wall ? "wall" : "thread");
  printf("# %-14s %6s %6s %12s %12s %8s %5s\n", "op", "rows", "cols", "unfused(ms)",
         "fused(ms)", "ratio", "same");
  int all_same = 1;
  for (int i = 0; i < NCASE; i++) {
    const double u = median(t[i][0], reps), f = median(t[i][1], reps);
    printf("  %-14s %6lld %6lld %12.3f %12.3f %8.3f %5s\n", names[i], (long long)rows,
           (long long)cols[i], u, f, u / f, same[i] ? "yes" : "NO");
    all_same = all_same && same[i];
  }
  /* the rows: copy, the fused ops, AdamW; bytes a call at the least, time, arrays streamed */
  static const char *const bw_names[NCASE + 2] = {"copy", "bias_gelu", "bias_gelu_bwd",
                                                  "add_layernorm", "adamw"};
  const int64_t bw_elems[NCASE + 2] = {nh, nh, nh, nc, nh};
  const double bw_bytes[NCASE + 2] = {8.0 * (double)nh, 8.0 * (double)nh, 12.0 * (double)nh,
                                      16.0 * (double)nc, 28.0 * (double)nh};
  const int bw_arrays[NCASE + 2] = {2, 2, 3, 4, 7};
  const double bw_ms[NCASE + 2] = {median(tcopy, reps), median(t[0][1], reps),
                                   median(t[1][1], reps), median(t[2][1], reps),
                                   median(tadam, reps)};
  printf("# memory bandwidth (fused ops): bytes moved at the least, GB/s, fraction of copy's\n");
  printf("# %-14s %10s %7s %12s %8s %8s\n", "op", "elements", "arrays", "MiB/call", "GB/s",
         "of copy");
  const double copy_gbs = bw_bytes[0] / bw_ms[0] * 1e-6;
  for (int i = 0; i < NCASE + 2; i++) {
    const double gbs = bw_bytes[i] / bw_ms[i] * 1e-6;
    printf("  %-14s %10lld %7d %12.1f %8.1f %8.2f\n", bw_names[i], (long long)bw_elems[i],
           bw_arrays[i], bw_bytes[i] / 1048576.0, gbs, gbs / copy_gbs);
  }
  free(pm), free(pv), free(cp), free(pp);
  free(x), free(pre), free(y0), free(y1), free(dy), free(dx0), free(dx1), free(b), free(db0);
  free(db1), free(a), free(r), free(w), free(lb), free(s0), free(s1), free(h0), free(h1);
  free(m), free(rs);
  return all_same ? 0 : 1;
}
