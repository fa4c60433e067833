/* bfloat16 <-> float32 conversions on the host (core.h). Round to nearest even on the bit
 * pattern: add 0x7FFF plus the lowest kept bit, then drop the low 16 bits; the carry of a
 * finite value into the exponent is the correct rounding up (to the next binade or to
 * infinity). NaNs are handled first so that the carry can never turn one into an infinity.
 * Pure functions, any thread. */
#include <string.h>

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

void mpt_bf16_round_array(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = mpt_bf16_from_f32(src[i]);
}

void mpt_bf16_widen_array(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = mpt_bf16_to_f32(src[i]);
}
