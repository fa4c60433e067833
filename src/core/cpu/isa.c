/* The CPU instruction-set switch (include/mpitrain/ops.h, "CPU instruction sets"; isa.h has
 * the dispatch). MPT_CPU_ISA is read once per process, under pthread_once, by whichever
 * thread first needs the answer; the result lives in mpt__cpu_isa_level (the kernels read it
 * at each call) and, if the setting was bad, in a message returned by every mpt_cpu_isa_init.
 *
 * A bad setting never makes a kernel run instructions the CPU lacks: the level stays at the
 * best the CPU has, and the error reaches the program through the first CPU allocation,
 * stream, thread setting or GEMM (each calls mpt_cpu_isa_init), so the run stops with the
 * message. oneDNN is capped here, before any of its calls made by the library (every oneDNN
 * entry point of src/core/cpu calls mpt__cpu_isa_resolve first). */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/cpu/isa.h"
#include "mpitrain/core.h"

#ifdef MPT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

atomic_int mpt__cpu_isa_level = -1;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static mpt_cpu_isa best = MPT_CPU_ISA_BASELINE;
static mpt_status init_status = MPT_OK;
static char init_message[256];

static mpt_cpu_isa detect(void) {
#ifdef MPT__ISA_CLONES
  __builtin_cpu_init();
  /* libgcc's answer includes the OS's support (XCR0) for the wider register state. */
  if (__builtin_cpu_supports("avx512f")) return MPT_CPU_ISA_AVX512;
  if (__builtin_cpu_supports("avx2")) return MPT_CPU_ISA_AVX2;
#endif
  return MPT_CPU_ISA_BASELINE;
}

const char *mpt_cpu_isa_name(mpt_cpu_isa isa) {
  switch (isa) {
    case MPT_CPU_ISA_AVX512: return "avx512";
    case MPT_CPU_ISA_AVX2: return "avx2";
    case MPT_CPU_ISA_BASELINE: return "baseline";
  }
  return "unknown";
}

/* "avx512, avx2, baseline": the paths this CPU offers, best first. */
static void offered(char *buf, size_t nbytes) {
  buf[0] = '\0';
  for (int l = (int)best; l >= 0; l--)
    snprintf(buf + strlen(buf), nbytes - strlen(buf), "%s%s", l == (int)best ? "" : ", ",
             mpt_cpu_isa_name((mpt_cpu_isa)l));
}

__attribute__((format(printf, 2, 3))) static void fail(mpt_status st, const char *fmt, ...) {
  init_status = st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(init_message, sizeof init_message, fmt, ap);
  va_end(ap);
}

#ifdef MPT_HAVE_ONEDNN
/* oneDNN's cap for a forced path; avx512 leaves it uncapped (BF16 and AMX stay usable). */
static void cap_onednn(mpt_cpu_isa isa) {
  if (isa == MPT_CPU_ISA_AVX512) return;
  const dnnl_cpu_isa_t cap = isa == MPT_CPU_ISA_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41;
  if (dnnl_set_max_cpu_isa(cap) != dnnl_success)
    fail(MPT_EDEVICE, "MPT_CPU_ISA=%s: oneDNN refused the cap (was it used before the "
         "library's first CPU call?)", mpt_cpu_isa_name(isa));
}
#endif

static void resolve_once(void) {
  best = detect();
  mpt_cpu_isa level = best;
  const char *want = getenv("MPT_CPU_ISA");
  char list[64];
  offered(list, sizeof list);
  if (want && *want) {
    int found = -1;
    for (int l = MPT_CPU_ISA_BASELINE; l <= MPT_CPU_ISA_AVX512; l++)
      if (strcasecmp(want, mpt_cpu_isa_name((mpt_cpu_isa)l)) == 0) found = l;
    if (found < 0) {
      fail(MPT_EINVAL, "MPT_CPU_ISA=%s: unknown instruction set (avx512, avx2 or baseline; "
           "this CPU offers %s)", want, list);
    } else if (found > (int)best) {
      fail(MPT_ENOTSUP, "MPT_CPU_ISA=%s: this CPU lacks it (it offers %s); unset MPT_CPU_ISA "
           "to use the best it has", mpt_cpu_isa_name((mpt_cpu_isa)found), list);
    } else {
      level = (mpt_cpu_isa)found;
#ifdef MPT_HAVE_ONEDNN
      cap_onednn(level);
#endif
    }
  }
  atomic_store(&mpt__cpu_isa_level, (int)level);
}

mpt_cpu_isa mpt__cpu_isa_resolve(void) {
  pthread_once(&once, resolve_once);
  return (mpt_cpu_isa)atomic_load_explicit(&mpt__cpu_isa_level, memory_order_relaxed);
}

mpt_status mpt_cpu_isa_init(void) {
  pthread_once(&once, resolve_once);
  if (init_status != MPT_OK) return MPT_FAIL(init_status, "%s", init_message);
  return MPT_OK;
}

mpt_cpu_isa mpt_cpu_isa_active(void) { return mpt__cpu_isa_resolve(); }

mpt_cpu_isa mpt_cpu_isa_best(void) {
  pthread_once(&once, resolve_once);
  return best;
}

mpt_status mpt__cpu_isa_select(mpt_cpu_isa isa) {
  pthread_once(&once, resolve_once);
  if ((int)isa < MPT_CPU_ISA_BASELINE || (int)isa > MPT_CPU_ISA_AVX512)
    return MPT_FAIL(MPT_EINVAL, "cpu isa %d is not an mpt_cpu_isa", (int)isa);
  if (isa > best)
    return MPT_FAIL(MPT_ENOTSUP, "cpu isa %s: this CPU lacks it (best: %s)",
                    mpt_cpu_isa_name(isa), mpt_cpu_isa_name(best));
  atomic_store(&mpt__cpu_isa_level, (int)isa);
  return MPT_OK;
}
