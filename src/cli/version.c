/* `mpitrain --version`: the version, then what this build was made with (CUDA, NCCL, oneDNN,
 * the test fault injection) and the versions of the libraries it runs with, asked from the
 * libraries themselves at run time (a header's version can differ from the shared library
 * loaded). Prints only; initialises nothing (no MPI_Init, no CUDA context). */
#include "cli/version.h"

#include <cblas.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "config.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#ifdef MPT_HAVE_ONEDNN
#include <dnnl.h>
#endif
#ifdef MPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef MPT_HAVE_NCCL
#include <nccl.h>
#endif

#ifdef MPT_HAVE_CUDA
static const char *cuda_feature = "yes";
#else
static const char *cuda_feature = "no";
#endif
#ifdef MPT_HAVE_NCCL
static const char *nccl_feature = "yes";
#else
static const char *nccl_feature = "no";
#endif
#ifdef MPT_HAVE_ONEDNN
static const char *onednn_feature = "yes";
#else
static const char *onednn_feature = "no";
#endif
#ifdef MPT_FAULT_INJECTION
static const char *fault_feature = "yes (the MPT_TEST_* variables of the test suite act)";
#else
static const char *fault_feature = "no";
#endif

#ifdef MPT_HAVE_ONEDNN
static const char *onednn_isa(dnnl_cpu_isa_t isa) {
  switch ((int)isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
#endif

/* The instruction-set paths (ops.h "CPU instruction sets"): which one runs, which the CPU
 * offers, and what caps the libraries. Reading MPT_CPU_ISA here caps oneDNN, as a run would. */
static void print_cpu_isa(FILE *f) {
  const mpt_status st = mpt_cpu_isa_init();
  const mpt_cpu_isa best = mpt_cpu_isa_best(), active = mpt_cpu_isa_active();
  char offers[64] = "";
  for (int l = (int)best; l >= 0; l--)
    snprintf(offers + strlen(offers), sizeof offers - strlen(offers), "%s%s",
             l == (int)best ? "" : ", ", mpt_cpu_isa_name((mpt_cpu_isa)l));
  const char *env = getenv("MPT_CPU_ISA");
  if (st != MPT_OK)
    fprintf(f, "CPU ISA: %s; error: %s\n", mpt_cpu_isa_name(active), mpt_last_error());
  else if (env && *env)
    fprintf(f, "CPU ISA: %s (MPT_CPU_ISA; this CPU offers %s)\n", mpt_cpu_isa_name(active),
            offers);
  else
    fprintf(f, "CPU ISA: %s (the best this CPU offers: %s; MPT_CPU_ISA picks another)\n",
            mpt_cpu_isa_name(active), offers);
  fprintf(f, "OpenBLAS core: %s (OPENBLAS_CORETYPE picks it when the library loads)\n",
          mpt_cpu_blas_name());
}

void mpt_cli_print_version(FILE *f) {
  fprintf(f, "mpitrain %s\n", PACKAGE_VERSION);
  fprintf(f, "features: cuda %s, nccl %s, onednn %s, fault injection %s\n", cuda_feature,
          nccl_feature, onednn_feature, fault_feature);
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  if (MPI_Get_library_version(mpi, &len) != MPI_SUCCESS) snprintf(mpi, sizeof mpi, "unknown");
  char *nl = strpbrk(mpi, "\r\n,"); /* Open MPI: "Open MPI v4.1.4, package: ..." */
  if (nl) *nl = '\0';
  fprintf(f, "MPI: %s (MPI %d.%d)\n", mpi, MPI_VERSION, MPI_SUBVERSION);
  fprintf(f, "OpenBLAS: %s\n", openblas_get_config());
  fprintf(f, "zlib: %s\n", zlibVersion());
#ifdef MPT_HAVE_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  fprintf(f, "oneDNN: %d.%d.%d\n", v->major, v->minor, v->patch);
#endif
  print_cpu_isa(f);
#ifdef MPT_HAVE_ONEDNN
  fprintf(f, "oneDNN ISA: %s\n", onednn_isa(dnnl_get_effective_cpu_isa()));
#endif
  /* --precision bf16 on this CPU: "yes", or why not (no oneDNN, no AVX-512 BF16, a cap) */
  const int bf16 = mpt_op_bf16_check(NULL) == MPT_OK;
  fprintf(f, "bf16 compute (CPU): %s%s\n", bf16 ? "yes (AVX-512 BF16, through oneDNN)" : "no: ",
          bf16 ? "" : mpt_last_error());
#ifdef MPT_HAVE_CUDA
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv); /* 0 without a driver */
  fprintf(f, "CUDA runtime: %d.%d; driver: %s", rt / 1000, (rt % 1000) / 10,
          drv ? "" : "none\n");
  if (drv) fprintf(f, "%d.%d\n", drv / 1000, (drv % 1000) / 10);
#endif
#ifdef MPT_HAVE_NCCL
  int nv = 0;
  ncclGetVersion(&nv);
  fprintf(f, "NCCL: %d.%d.%d\n", nv / 10000, (nv % 10000) / 100, nv % 100);
#endif
}

/* The launchers' rank variables (Open MPI, PMIx, MPICH's PMI, srun), read before MPI_Init. */
int mpt_cli_launcher_rank(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  const char *step = getenv("SLURM_STEP_ID"), *procid = getenv("SLURM_PROCID");
  if (step && procid && *procid) return atoi(procid);
  return -1;
}
