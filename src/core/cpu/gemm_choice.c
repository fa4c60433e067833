/* Which library computes an fp32 CPU product (include/mpitrain/ops.h, "CPU GEMM library"):
 * the process-wide setting and the fixed rule of MPT_CPU_GEMM_AUTO. mpt__cpu_gemm (ops_cpu.c)
 * and the attention's block products (attn_cpu.c) ask through mpt__cpu_gemm_route.
 *
 * The rule, from mpt_gemm_bench at one thread (bench/README.md "mpt_gemm_bench"; measured in
 * bench/results/gemm_mlp.txt, gemm_mlp_avx2.txt, gemm_gpt_mini.txt): with oneDNN's AVX-512
 * kernels its sgemm beats OpenBLAS on the mlp's and gpt-mini's steps; with its AVX2 kernels it
 * loses on the mlp's small products (fc2's dX and dW most) and stays level or ahead on
 * gpt-mini's Linears and attention blocks. So under AVX2 the products below
 * AVX2_ONEDNN_MIN_MACS multiply-adds go to OpenBLAS: 2^27 lies between the mlp's largest product
 * (64 x 512 x 784, 2.6e7) and gpt-mini's smallest Linear (2048 x 384 x 384, 3.0e8). oneDNN's
 * instruction set is read once, after mpt_cpu_isa_init has capped it; it cannot change later in
 * the process.
 *
 * MPT_CPU_GEMM_TUNE answers from a per-shape table (mpt_cpu_gemm_table_set; timed by
 * gemm_tune.c, installed by the trainer, src/train/gemm_tune.c), and by the rule above for a
 * shape the table lacks. The table is written while no CPU op runs and only read while they
 * run (its count is published with release order). Recording (mpt_cpu_gemm_record) notes each
 * product's shape and transposes under a mutex: the attention's block products come from
 * OpenMP's threads. */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "mpitrain/ops.h"

#ifdef MPT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#define AVX2_ONEDNN_MIN_MACS 134217728.0 /* 2^27 */

static atomic_int setting = MPT_CPU_GEMM_AUTO;
static atomic_int onednn_avx512 = -1; /* -1: not read yet */

/* The per-shape table of MPT_CPU_GEMM_TUNE: entries [0, table_count). */
static mpt_cpu_gemm_tuned table[MPT_CPU_GEMM_TABLE_MAX];
static atomic_int table_count = 0;

/* The shapes noted while recording: entries [0, rec_count), rec_lost beyond the capacity. */
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int recording = 0;
static mpt_cpu_gemm_tuned rec[MPT_CPU_GEMM_TABLE_MAX];
static int rec_count = 0, rec_lost = 0;

mpt_status mpt_cpu_set_gemm(mpt_cpu_gemm gemm) {
  if (gemm != MPT_CPU_GEMM_AUTO && gemm != MPT_CPU_GEMM_OPENBLAS && gemm != MPT_CPU_GEMM_ONEDNN &&
      gemm != MPT_CPU_GEMM_TUNE)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_set_gemm: %d is not an mpt_cpu_gemm", (int)gemm);
#ifndef MPT_HAVE_ONEDNN
  if (gemm == MPT_CPU_GEMM_ONEDNN)
    return MPT_FAIL(MPT_ENOTSUP, "mpt_cpu_set_gemm: oneDNN's GEMM asked for, but this build has "
                    "no oneDNN (configure --with-onednn; Debian: libdnnl-dev)");
#endif
  atomic_store(&setting, (int)gemm);
  return MPT_OK;
}

mpt_cpu_gemm mpt_cpu_gemm_setting(void) { return (mpt_cpu_gemm)atomic_load(&setting); }

const char *mpt_cpu_gemm_name(mpt_cpu_gemm gemm) {
  switch (gemm) {
    case MPT_CPU_GEMM_AUTO: return "auto";
    case MPT_CPU_GEMM_OPENBLAS: return "openblas";
    case MPT_CPU_GEMM_ONEDNN: return "onednn";
    case MPT_CPU_GEMM_TUNE: return "tune";
  }
  return "unknown";
}

#ifdef MPT_HAVE_ONEDNN
/* Whether oneDNN runs AVX-512 kernels (after the cap of mpt_cpu_isa_init). */
static int onednn_has_avx512(void) {
  int v = atomic_load_explicit(&onednn_avx512, memory_order_relaxed);
  if (v < 0) {
    (void)mpt_cpu_isa_init(); /* a bad MPT_CPU_ISA reaches the caller through its own call */
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    v = (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core;
    atomic_store_explicit(&onednn_avx512, v, memory_order_relaxed);
  }
  return v;
}
#endif

mpt_cpu_gemm mpt__cpu_gemm_rule(int64_t m, int64_t n, int64_t k) {
#ifdef MPT_HAVE_ONEDNN
  if (m <= 1 || n <= 1 || k <= 0) return MPT_CPU_GEMM_OPENBLAS;
  if (onednn_has_avx512()) return MPT_CPU_GEMM_ONEDNN;
  return (double)m * (double)n * (double)k < AVX2_ONEDNN_MIN_MACS ? MPT_CPU_GEMM_OPENBLAS
                                                                  : MPT_CPU_GEMM_ONEDNN;
#else
  (void)m, (void)n, (void)k;
  return MPT_CPU_GEMM_OPENBLAS;
#endif
}

/* The table's answer for m x n x k, or -1 when it has no such entry. */
static int table_lookup(int64_t m, int64_t n, int64_t k) {
  const int count = atomic_load_explicit(&table_count, memory_order_acquire);
  for (int i = 0; i < count; i++)
    if (table[i].m == m && table[i].n == n && table[i].k == k) return (int)table[i].gemm;
  return -1;
}

mpt_cpu_gemm mpt_cpu_gemm_for(int64_t m, int64_t n, int64_t k) {
#ifdef MPT_HAVE_ONEDNN
  /* A matrix-vector product (the gradient clipping's dot, m = n = 1) is a memory-bound stream:
   * OpenBLAS's GEMV path is as good and does not wake the OpenMP team. */
  if (m <= 1 || n <= 1 || k <= 0) return MPT_CPU_GEMM_OPENBLAS;
  const mpt_cpu_gemm s = mpt_cpu_gemm_setting();
  if (s == MPT_CPU_GEMM_TUNE) {
    const int g = table_lookup(m, n, k);
    if (g >= 0) return (mpt_cpu_gemm)g;
  } else if (s != MPT_CPU_GEMM_AUTO) {
    return s;
  }
  return mpt__cpu_gemm_rule(m, n, k);
#else
  (void)m, (void)n, (void)k;
  return MPT_CPU_GEMM_OPENBLAS;
#endif
}

int mpt__cpu_gemm_route(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k) {
  if (atomic_load_explicit(&recording, memory_order_relaxed) && m > 1 && n > 1 && k > 0) {
    const unsigned bit = 1u << (2 * (trans_a != 0) + (trans_b != 0));
    pthread_mutex_lock(&rec_lock);
    int i = 0;
    while (i < rec_count && !(rec[i].m == m && rec[i].n == n && rec[i].k == k)) i++;
    if (i < rec_count) {
      rec[i].trans |= bit;
    } else if (rec_count < MPT_CPU_GEMM_TABLE_MAX) {
      memset(&rec[i], 0, sizeof rec[i]);
      rec[i].m = m, rec[i].n = n, rec[i].k = k, rec[i].trans = bit;
      rec_count++;
    } else {
      rec_lost++;
    }
    pthread_mutex_unlock(&rec_lock);
  }
  return mpt_cpu_gemm_for(m, n, k) == MPT_CPU_GEMM_ONEDNN;
}

void mpt_cpu_gemm_record(int on) {
  pthread_mutex_lock(&rec_lock);
  if (on) rec_count = rec_lost = 0;
  atomic_store(&recording, on != 0);
  pthread_mutex_unlock(&rec_lock);
}

int mpt_cpu_gemm_recorded(mpt_cpu_gemm_tuned *shapes, int cap) {
  pthread_mutex_lock(&rec_lock);
  const int count = rec_count;
  for (int i = 0; shapes && i < count && i < cap; i++) {
    shapes[i] = rec[i];
    shapes[i].gemm = mpt__cpu_gemm_rule(rec[i].m, rec[i].n, rec[i].k);
  }
  pthread_mutex_unlock(&rec_lock);
  return count;
}

mpt_status mpt_cpu_gemm_table_set(const mpt_cpu_gemm_tuned *entries, int count) {
  if (count < 0 || count > MPT_CPU_GEMM_TABLE_MAX || (count > 0 && !entries))
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_table_set: %d entries (0 to %d, not NULL)", count,
                    MPT_CPU_GEMM_TABLE_MAX);
  for (int i = 0; i < count; i++) {
    const mpt_cpu_gemm_tuned *e = &entries[i];
    if (e->m < 1 || e->n < 1 || e->k < 1 ||
        (e->gemm != MPT_CPU_GEMM_OPENBLAS && e->gemm != MPT_CPU_GEMM_ONEDNN))
      return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_table_set: entry %d (%lld x %lld x %lld, %s): "
                      "sizes >= 1 and openblas or onednn expected", i, (long long)e->m,
                      (long long)e->n, (long long)e->k, mpt_cpu_gemm_name(e->gemm));
#ifndef MPT_HAVE_ONEDNN
    if (e->gemm == MPT_CPU_GEMM_ONEDNN)
      return MPT_FAIL(MPT_ENOTSUP, "mpt_cpu_gemm_table_set: entry %d asks for oneDNN, but this "
                      "build has no oneDNN", i);
#endif
    for (int j = 0; j < i; j++)
      if (entries[j].m == e->m && entries[j].n == e->n && entries[j].k == e->k)
        return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_table_set: %lld x %lld x %lld twice (entries "
                        "%d and %d)", (long long)e->m, (long long)e->n, (long long)e->k, j, i);
  }
  atomic_store_explicit(&table_count, 0, memory_order_release);
  if (count > 0) memcpy(table, entries, (size_t)count * sizeof *entries);
  atomic_store_explicit(&table_count, count, memory_order_release);
  return MPT_OK;
}

int mpt_cpu_gemm_table(mpt_cpu_gemm_tuned *entries, int cap) {
  const int count = atomic_load_explicit(&table_count, memory_order_acquire);
  for (int i = 0; entries && i < count && i < cap; i++) entries[i] = table[i];
  return count;
}
