/* Branch-free float kernels for the CPU transformer ops, written for GCC's vectorizer: an
 * exponential (the exp of GELU, the softmax and the cross-entropy over the vocabulary) and
 * lane-wise sums and maxima whose order of operations does not depend on the vector width.
 *
 * mpt__vexpf(x): Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2 (n by the 1.5 * 2^23
 * rounding trick, ln2 split into a 9-bit head, so n * head is exact, and a tail), exp(r) by its
 * Taylor polynomial of degree 7 in Horner form (truncation below r^8 / 8! * e^r < 7.5e-9
 * relative, 0.07 ulp), and 2^n put into the exponent bits, as (2 p) * 2^(n - 1) so that both
 * ends of the range scale exactly. Bound (tests/test_gpt_core.c measures it against exp in
 * double): within 2 ulp of exp(x) for -86.9 <= x <= 88.72; 0 below -87.3 (libm gives a value
 * under 1.7e-38 there), +inf above 88.73, NaN for NaN. Between -87.3 and -86.9 the result is 0
 * or within 2 ulp. Only +, -, * and bit moves: no FMA contraction (-std=c11 turns it off), so
 * every vector width (the instruction-set clones of the callers, isa.h) gives the same bits. */
#ifndef MPT_CORE_CPU_VMATH_H
#define MPT_CORE_CPU_VMATH_H

#include <stdint.h>
#include <string.h>

/* The helpers below are inlined into every caller, always: an out-of-line copy would be built
 * for the default target (SSE2) and the AVX-512 clone of its caller (isa.h) would call it
 * (measured: mpt__softmax_row alone, out of line, took 10 % of the fused attention's samples). */
#if defined(__GNUC__)
#define MPT_VINLINE static inline __attribute__((always_inline))
#else
#define MPT_VINLINE static inline
#endif

/* Lanes of the partial sums and maxima below: a multiple of every vector width used. */
#define MPT_VLANES 16

/* cond ? a : b as bit masks: GCC turns a float `?:` followed by arithmetic into a branch,
 * which only AVX-512 (masked operations) then vectorizes. */
MPT_VINLINE float mpt__vselect(int cond, float a, float b) {
  const uint32_t m = -(uint32_t)(cond != 0);
  uint32_t ab, bb;
  memcpy(&ab, &a, sizeof ab);
  memcpy(&bb, &b, sizeof bb);
  const uint32_t rb = (ab & m) | (bb & ~m);
  float r;
  memcpy(&r, &rb, sizeof r);
  return r;
}

MPT_VINLINE float mpt__vexpf(float x) {
  const float lo = -87.3f, hi = 88.8f;
  float xc = mpt__vselect(x < lo, lo, x); /* NaN passes through */
  xc = mpt__vselect(xc > hi, hi, xc);
  const float magic = 12582912.0f;                  /* 1.5 * 2^23 */
  const float t = xc * 1.44269504088896341f + magic;
  const float nf = t - magic; /* round(xc / ln2), in [-126, 128] */
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  const uint32_t n = tb - 0x4B400000u; /* the same integer (mod 2^32) */
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  /* 2^(n - 1): exponent field n + 126, in [0, 254]; 0 (n = -126) gives 0.0 */
  const uint32_t sb = (n + 126u) << 23;
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  return (2.0f * p) * scale;
}

/* The sum of x[0, n) in double: lane j adds the x[i] with i = j mod MPT_VLANES in increasing
 * i, then the lanes are added in order (the same result at every vector width). */
MPT_VINLINE double mpt__vsum_d(const float *x, int64_t n) {
  double acc[MPT_VLANES] = {0};
  int64_t i = 0;
  for (; i + MPT_VLANES <= n; i += MPT_VLANES)
    for (int j = 0; j < MPT_VLANES; j++) acc[j] += (double)x[i + j];
  for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i];
  double s = 0.0;
  for (int j = 0; j < MPT_VLANES; j++) s += acc[j];
  return s;
}

/* The maximum of x[0, n), n >= 1, ignoring NaNs after x[0] (as `x[i] > m ? x[i] : m`). */
MPT_VINLINE float mpt__vmax(const float *x, int64_t n) {
  float m[MPT_VLANES];
  for (int j = 0; j < MPT_VLANES; j++) m[j] = x[0];
  int64_t i = 0;
  for (; i + MPT_VLANES <= n; i += MPT_VLANES)
    for (int j = 0; j < MPT_VLANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  for (int j = 0; i < n; i++, j++) m[j] = x[i] > m[j] ? x[i] : m[j];
  float mx = m[0];
  for (int j = 1; j < MPT_VLANES; j++) mx = m[j] > mx ? m[j] : mx;
  return mx;
}

/* One row of the causal softmax in place: row[0, i] becomes exp(row - max) / sum (the sum in
 * double, as mpt__vsum_d), row(i, end) becomes 0; returns the max, *inv gets 1 / sum. Shared by
 * the reference (gpt_cpu.c) and the fused attention (attn_cpu.c), so both give the same bits. */
MPT_VINLINE float mpt__softmax_row(float *restrict row, int64_t i, int64_t end, float *inv) {
  const float mx = mpt__vmax(row, i + 1);
  for (int64_t j = 0; j <= i; j++) row[j] = mpt__vexpf(row[j] - mx);
  const float v = (float)(1.0 / mpt__vsum_d(row, i + 1));
  for (int64_t j = 0; j <= i; j++) row[j] *= v;
  for (int64_t j = i + 1; j < end; j++) row[j] = 0.0f;
  *inv = v;
  return mx;
}

/* One row of the causal softmax's backward: d[j] = a[j] * (d[j] - sum_{k <= i} a[k] d[k]) for
 * j <= i (the sum in double, lanes as mpt__vsum_d), then d[j] = 0 for i < j < end. Shared by
 * the reference (gpt_cpu.c) and the fused attention (attn_cpu.c), so both give the same bits. */
MPT_VINLINE void mpt__softmax_backward_row(const float *restrict a, float *restrict d,
                                             int64_t i, int64_t end) {
  double acc[MPT_VLANES] = {0};
  int64_t j = 0;
  for (; j + MPT_VLANES <= i + 1; j += MPT_VLANES)
    for (int l = 0; l < MPT_VLANES; l++) acc[l] += (double)a[j + l] * d[j + l];
  for (int l = 0; j <= i; j++, l++) acc[l] += (double)a[j] * d[j];
  double dot = 0.0;
  for (int l = 0; l < MPT_VLANES; l++) dot += acc[l];
  const float fd = (float)dot;
  for (j = 0; j <= i; j++) d[j] = a[j] * (d[j] - fd);
  for (j = i + 1; j < end; j++) d[j] = 0.0f;
}

#endif
