/* xoshiro256** seeded by splitmix64 (Blackman & Vigna 2021; public-domain reference algorithm,
 * written from the paper's description). */
#include <math.h>

#include "mpitrain/core.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void mpt_rng_seed(mpt_rng *rng, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mpt_rng_next(mpt_rng *rng) {
  uint64_t *s = rng->s;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float mpt_rng_uniform(mpt_rng *rng) {
  return (float)(mpt_rng_next(rng) >> 40) * (1.0f / 16777216.0f);
}

uint64_t mpt_rng_below(mpt_rng *rng, uint64_t n) {
  /* Rejection: draw until the value falls below the largest multiple of n. */
  uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
  uint64_t r;
  do r = mpt_rng_next(rng);
  while (r >= limit);
  return r % n;
}

void mpt_rng_fill_uniform(mpt_rng *rng, float *x, int64_t count, float lo, float hi) {
  /* lo + (hi - lo) u with u <= 1 - 2^-24 is below hi exactly, but the float sum can round up
   * to hi (lo 1, hi 2: 2 - 2^-24 is a tie that goes to 2): such a value becomes the largest
   * float below hi, so the range stays [lo, hi) as documented. */
  const float below_hi = nextafterf(hi, lo);
  for (int64_t i = 0; i < count; i++) {
    const float v = lo + (hi - lo) * mpt_rng_uniform(rng);
    x[i] = v >= hi && hi > lo ? below_hi : v;
  }
}
