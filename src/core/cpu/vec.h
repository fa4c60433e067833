/* A loop shape for the CPU kernels' hot loops. GCC 12 at -O2 vectorises with its "very cheap"
 * cost model: only loops whose trip count is a known multiple of the vector width and that need
 * no runtime alias check. MPT_VEC_FOR(i, n, body) runs body for i = 0 .. n-1 as blocks of
 * exactly 8 iterations (an inner loop of constant trip count, which that model vectorises when
 * the pointers the body touches are restrict-qualified or one and the same) and a scalar loop
 * over the at most 7 left. Iterations run in order. */
#ifndef MPT_CORE_CPU_VEC_H
#define MPT_CORE_CPU_VEC_H

#include <stdint.h>

#define MPT_VEC_FOR(i, n, ...)                                       \
  do {                                                               \
    const int64_t mpt_vec_n_ = (n);                                  \
    int64_t mpt_vec_b_ = 0;                                          \
    for (; mpt_vec_b_ + 8 <= mpt_vec_n_; mpt_vec_b_ += 8)            \
      for (int mpt_vec_j_ = 0; mpt_vec_j_ < 8; mpt_vec_j_++) {       \
        const int64_t i = mpt_vec_b_ + mpt_vec_j_;                   \
        __VA_ARGS__;                                                 \
      }                                                              \
    for (int64_t i = mpt_vec_b_; i < mpt_vec_n_; i++) {              \
      __VA_ARGS__;                                                   \
    }                                                                \
  } while (0)

/* GCC turns short zero-fill and copy loops into memset/memcpy calls ("loop distribution"),
 * which costs more than the loop for the 2-60 floats of a convolution's padding. Put this on a
 * function whose loops are known to be short. */
#if defined(__GNUC__) && !defined(__clang__)
#define MPT_SHORT_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define MPT_SHORT_LOOPS
#endif

#endif
