/* bfloat16 <-> float32 conversions on the host (core.h). Round to nearest even on the bit
 * pattern: add 0x7FFF plus the lowest kept bit, then drop the low 16 bits; the carry of a
 * finite value into the exponent is the correct rounding up (to the next binade or to
 * infinity). NaNs are handled first so that the carry can never turn one into an infinity.
 * Pure functions, any thread. */
#include <string.h>

#include "core/cpu/isa.h"
#include "mpitrain/core.h"

uint16_t mpt_bf16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float mpt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The array loops are written for the vectorizer: a branch-free rounding (the NaN case is a
 * select), blocks of a fixed 32 elements (GCC vectorizes those at -O2), and clones for AVX-512
 * and AVX2 (src/core/cpu/isa.h, the path MPT_CPU_ISA or the CPU picks), where the 16 <-> 32-bit
 * conversions vectorize; measured here 2x faster than the scalar loop for the sum. Same results
 * bit for bit as mpt_bf16_from_f32 (tests/test_comm_shard.c compares them). */

static inline float widen(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline uint16_t round_select(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/* The kernels are static (a clone set and its dispatcher, isa.h); the public functions call
 * them. */
MPT_ISA_KERNEL_VOID(round_kernel, (const float *src, uint16_t *dst, int64_t n), (src, dst, n)) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; j++) dst[i + j] = round_select(src[i + j]);
  for (; i < n; i++) dst[i] = round_select(src[i]);
}

MPT_ISA_KERNEL_VOID(add_kernel, (const uint16_t *a, uint16_t *b, int64_t n), (a, b, n)) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; j++)
      b[i + j] = round_select(widen(a[i + j]) + widen(b[i + j]));
  for (; i < n; i++) b[i] = round_select(widen(a[i]) + widen(b[i]));
}

void mpt_bf16_round_array(const float *src, uint16_t *dst, int64_t n) {
  round_kernel(src, dst, n);
}

void mpt_bf16_add_array(const uint16_t *a, uint16_t *b, int64_t n) { add_kernel(a, b, n); }

MPT_ISA_KERNEL_VOID(widen_kernel, (const uint16_t *src, float *dst, int64_t n), (src, dst, n)) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; j++) dst[i + j] = widen(src[i + j]);
  for (; i < n; i++) dst[i] = widen(src[i]);
}

/* Not a loop of mpt_bf16_to_f32 calls: an exported function is called through the PLT and
 * never inlined (1.7 ns an element here, 10x the kernel). */
void mpt_bf16_widen_array(const uint16_t *src, float *dst, int64_t n) {
  widen_kernel(src, dst, n);
}
