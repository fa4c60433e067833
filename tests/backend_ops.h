/* The harness of tests/test_backend_ops.c, the one table of op cases that every backend and
 * every CPU instruction-set path runs against the CPU reference (the idea of ggml's
 * test-backend-ops). A case is a function that makes its inputs through the context (the same
 * draws on every path, uploaded to the path's device), calls ops on the context's stream and
 * names its outputs; the harness runs it on the reference and on the path under test, downloads
 * the outputs and compares them: bit for bit between the CPU's paths (the paths promise the same
 * bits, include/mpitrain/ops.h) and where the table says BO_EXACT, else within the case's
 * bound |path - ref| <= atol + rtol |ref| (NaN must meet NaN). */
#ifndef MPT_TESTS_BACKEND_OPS_H
#define MPT_TESTS_BACKEND_OPS_H

#include <stdint.h>

#include "mpitrain/core.h"

typedef struct bo_ctx bo_ctx;

/* Device buffers, freed after the case. Uniform in [lo, hi); multiples of 1/4 in [-2, 2]
 * (ties, exact sums); given values; ids in [0, limit); n copies of v. */
float *bo_uniform(bo_ctx *c, int64_t n, float lo, float hi);
float *bo_dyadic(bo_ctx *c, int64_t n);
float *bo_values(bo_ctx *c, const float *host, int64_t n);
int32_t *bo_ids(bo_ctx *c, int64_t n, int64_t limit);
int32_t *bo_ids_values(bo_ctx *c, const int32_t *host, int64_t n);
float *bo_filled(bo_ctx *c, int64_t n, float v);
void *bo_bytes(bo_ctx *c, int64_t nbytes); /* contents undefined */
/* Host scratch drawn from the same stream of numbers (freed after the case). */
float *bo_host_uniform(bo_ctx *c, int64_t n, float lo, float hi);
float *bo_host_dyadic(bo_ctx *c, int64_t n);
void *bo_host_bytes(bo_ctx *c, int64_t nbytes); /* contents undefined */

/* The outputs to compare: device float / int32 / uint16 arrays, a host value. */
void bo_out(bo_ctx *c, const char *name, const float *dev, int64_t n);
void bo_out_i32(bo_ctx *c, const char *name, const int32_t *dev, int64_t n);
void bo_out_u16(bo_ctx *c, const char *name, const uint16_t *dev, int64_t n);
void bo_out_host(bo_ctx *c, const char *name, double value);

/* The stream ops go on (NULL on the CPU) and its device. */
mpt_stream *bo_stream(bo_ctx *c);
mpt_device bo_device(bo_ctx *c);

/* A case: runs the op with parameters p; MPT_ENOTSUP means "not on this backend". */
typedef mpt_status (*bo_run_fn)(bo_ctx *c, const int64_t *p);

enum {
  BO_EXACT = 1, /* every backend gives the same bits (the same float operations in order) */
  BO_HOST = 2,  /* a host function (CPU paths only) */
};

typedef struct bo_case {
  const char *op;     /* "gemm" */
  bo_run_fn run;
  const char *params; /* names of p's entries, space-separated: "ta tb m n k pad" */
  int64_t p[8];
  double rtol, atol;  /* the bound between backends (not between CPU paths: bit for bit) */
  int flags;          /* BO_* */
} bo_case;

extern const bo_case bo_cases[];
extern const int bo_ncases;

#endif
