/* A loop shape for the CPU kernels' hot loops. GCC 12 at -O2 vectorises with its "very cheap"
 * cost model: only loops whose trip count is a known multiple of the vector width and that need
 * no runtime alias check. MPT_VEC_FOR(i, n, body) runs body for i = 0 .. n-1 as a loop over a
 * multiple of 8 iterations (vectorised when the pointers it touches are restrict-qualified or
 * the same pointer) and a scalar loop over the at most 7 left. Order of iterations is kept. */
#ifndef MPT_CORE_CPU_VEC_H
#define MPT_CORE_CPU_VEC_H

#include <stdint.h>

#define MPT_VEC_FOR(i, n, ...)                                          \
  do {                                                                  \
    const int64_t mpt_vec_n_ = (n), mpt_vec_n8_ = mpt_vec_n_ & ~(int64_t)7; \
    for (int64_t i = 0; i < mpt_vec_n8_; i++) {                         \
      __VA_ARGS__;                                                      \
    }                                                                   \
    for (int64_t i = mpt_vec_n8_; i < mpt_vec_n_; i++) {                \
      __VA_ARGS__;                                                      \
    }                                                                   \
  } while (0)

#endif
