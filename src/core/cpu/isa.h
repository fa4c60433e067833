/* The instruction-set paths of the CPU kernels (include/mpitrain/ops.h, "CPU instruction
 * sets"): which one runs, and the macros that compile a kernel once per path and dispatch.
 *
 * Why not GCC's target_clones: its clones are picked by an ifunc resolver when the library is
 * loaded, from cpuid alone, so nothing read later (MPT_CPU_ISA) can steer them. Here each
 * kernel's body is an always-inline function, compiled into three static functions (target
 * "avx512f", "avx2", and the default) and a dispatcher that switches on the active path: one
 * load of a global and a predictable branch per call, where the ifunc cost an indirect call
 * (bench/README.md "Instruction-set dispatch" has the measurement).
 *
 * Usage, in a .c file (the body follows the macro, as a function body would):
 *   MPT_ISA_KERNEL(double, sum_exp_kernel, (const float *restrict l, int64_t v, float mx),
 *                  (l, v, mx)) {
 *     ...
 *   }
 *   MPT_ISA_KERNEL_VOID(gelu_kernel, (float *y, const float *x, int64_t count), (y, x, count)) {
 *     ...
 *   }
 * The helpers a body calls must be always-inline too (vmath.h's MPT_VINLINE), else the clone
 * calls an out-of-line copy built for the baseline. */
#ifndef MPT_CORE_CPU_ISA_H
#define MPT_CORE_CPU_ISA_H

#include <stdatomic.h>

#include "mpitrain/ops.h"

/* The active path (an mpt_cpu_isa), -1 until MPT_CPU_ISA has been read. Written by
 * mpt__cpu_isa_resolve and mpt__cpu_isa_select only. */
extern atomic_int mpt__cpu_isa_level;

/* Reads MPT_CPU_ISA once (pthread_once; caps oneDNN) and returns the active path. */
mpt_cpu_isa mpt__cpu_isa_resolve(void);

/* The active path, for the kernels' dispatchers: never above what the CPU has. */
static inline mpt_cpu_isa mpt__cpu_isa(void) {
  const int l = atomic_load_explicit(&mpt__cpu_isa_level, memory_order_relaxed);
  return l >= 0 ? (mpt_cpu_isa)l : mpt__cpu_isa_resolve();
}

/* Switches the library's own kernels to `isa` in this process (oneDNN keeps its cap: it is set
 * once). For tests and benchmarks that compare the paths in one process; call it while no
 * CPU op runs (a kernel already running finishes on the path it started with). Errors:
 * MPT_ENOTSUP (the CPU lacks it), MPT_EINVAL (not an mpt_cpu_isa). */
mpt_status mpt__cpu_isa_select(mpt_cpu_isa isa);

#if defined(__GNUC__) && defined(__x86_64__)
#define MPT__ISA_CLONES 1
#define MPT__ISA_INLINE static inline __attribute__((always_inline))
/* Out of line, as the other two are: inlined, its stack frame would be set up on every path. */
#define MPT__ISA_BASE __attribute__((noinline))

#define MPT_ISA_KERNEL(ret, name, params, args)                                \
  MPT__ISA_INLINE ret name##_body params;                                      \
  __attribute__((target("avx512f"))) static ret name##_avx512 params {         \
    return name##_body args;                                                   \
  }                                                                            \
  __attribute__((target("avx2"))) static ret name##_avx2 params {              \
    return name##_body args;                                                   \
  }                                                                            \
  MPT__ISA_BASE static ret name##_base params { return name##_body args; }     \
  static ret name params {                                                     \
    switch (mpt__cpu_isa()) {                                                  \
      case MPT_CPU_ISA_AVX512: return name##_avx512 args;                      \
      case MPT_CPU_ISA_AVX2: return name##_avx2 args;                          \
      default: return name##_base args;                                        \
    }                                                                          \
  }                                                                            \
  MPT__ISA_INLINE ret name##_body params

#define MPT_ISA_KERNEL_VOID(name, params, args)                                \
  MPT__ISA_INLINE void name##_body params;                                     \
  __attribute__((target("avx512f"))) static void name##_avx512 params {        \
    name##_body args;                                                          \
  }                                                                            \
  __attribute__((target("avx2"))) static void name##_avx2 params {             \
    name##_body args;                                                          \
  }                                                                            \
  MPT__ISA_BASE static void name##_base params { name##_body args; }           \
  static void name params {                                                    \
    switch (mpt__cpu_isa()) {                                                  \
      case MPT_CPU_ISA_AVX512: name##_avx512 args; break;                      \
      case MPT_CPU_ISA_AVX2: name##_avx2 args; break;                          \
      default: name##_base args; break;                                        \
    }                                                                          \
  }                                                                            \
  MPT__ISA_INLINE void name##_body params
#else
/* One path: the kernel is the plain function. */
#define MPT_ISA_KERNEL(ret, name, params, args) static ret name params
#define MPT_ISA_KERNEL_VOID(name, params, args) static void name params
#endif

#endif
