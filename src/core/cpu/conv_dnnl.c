/* Whole-batch CPU convolutions through oneDNN 2.x (ops.h mpt_op_conv2d_*), compiled only when
 * configure found it (MPT_HAVE_ONEDNN; src/core/local.mk).
 *
 * oneDNN picks, for each primitive, the memory layouts its fastest kernel wants ("format any":
 * blocked layouts such as nChw16c for AVX-512); mpitrain's tensors are plain row-major (nchw,
 * oihw). Each pass therefore reorders its inputs into the primitive's layouts when they differ,
 * runs the primitive, and reorders its output back; an accumulating output (dx, dw) is reordered
 * with a "sum" post-op, dst = reorder(src) + dst, so that += costs no extra pass.
 *
 * Plans: everything a shape needs (primitive descriptors, primitives, reorders, the buffers for
 * the blocked copies, a user-mode scratchpad) is built once per calling thread, shape and thread
 * count, and reused. The plans of a thread live in a thread-specific list (at most
 * PLANS_PER_THREAD, the oldest evicted) freed when the thread exits (and for the main thread at
 * process exit, by the OS). The API used is oneDNN 2.x's C API (dnnl.h: *_desc_init,
 * primitive descriptors with a forward hint for the backward passes, reorders with attributes;
 * see the oneDNN developer guide, "Convolution" and "Reorder" primitives). A plan is only ever used by its thread, so
 * concurrent calls from DataParallel replicas share nothing but the engine, which oneDNN allows.
 * bf16 (ops_bf16.h, mpt_op_conv2d_*_bf16): the same plans with bf16 "any" layouts for the
 * inputs (x, w, dy) and float32 for the outputs (y, dx, dw, the bias); the reorders into the
 * blocked layouts are the float32 -> bf16 conversions (oneDNN rounds to nearest even); the
 * forward hint of a backward pass is the bf16 forward. The precision is part of the key.
 * Runs synchronously on the calling thread (an in-order CPU stream, waited for before return). */
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/dnnl_check.h"
#include "mpitrain/core.h"
#include "core/threads.h"

/* Returns MPT_EDEVICE naming the oneDNN call and its status from the enclosing function. */
#define DNNL_OK MPT_DNNL_OK

/* ---- one tensor argument of a primitive: the user's plain memory and, when the primitive
 * wants another layout, a buffer in that layout and the reorder between them ---- */
typedef struct arg {
  dnnl_memory_t user;     /* plain layout; its data handle is set at each call */
  dnnl_memory_t inner;    /* the primitive's layout (== user when they are the same) */
  dnnl_primitive_t move;  /* user -> inner for inputs, inner -> user for outputs; NULL: none */
  void *buf;              /* inner's buffer when it is not the user's */
} arg;

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_key_t plans_key;

typedef enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_WEIGHTS } pass_kind;

/* Plans kept per thread: a training run uses a handful (3 passes x 2 layers x the batch sizes
 * of training, its last partial batch and evaluation). */
enum { PLANS_PER_THREAD = 48 };

typedef struct plan {
  struct plan *next;
  int64_t key[13]; /* n, C, H, W, o, kh, kw, stride, pad, has_bias, pass, threads, bf16 */
  dnnl_stream_t stream;
  dnnl_primitive_t prim;
  arg args[3];          /* fwd: src, weights, dst; bwd data: diff_dst, weights, diff_src;
                         * bwd weights: src, diff_dst, diff_weights */
  dnnl_memory_t bias;   /* plain [o]: the bias (fwd) or a buffer for diff_bias (bwd weights) */
  float *bias_buf;
  dnnl_memory_t scratch;
  void *scratch_buf;
} plan;

static void arg_free(arg *a) {
  if (a->move) dnnl_primitive_destroy(a->move);
  if (a->inner && a->inner != a->user) dnnl_memory_destroy(a->inner);
  if (a->user) dnnl_memory_destroy(a->user);
  free(a->buf);
}

static void plan_free(plan *p) {
  if (p->prim) dnnl_primitive_destroy(p->prim);
  for (int i = 0; i < 3; i++) arg_free(&p->args[i]);
  if (p->bias) dnnl_memory_destroy(p->bias);
  free(p->bias_buf);
  if (p->scratch) dnnl_memory_destroy(p->scratch);
  free(p->scratch_buf);
  if (p->stream) dnnl_stream_destroy(p->stream);
  free(p);
}

static void plans_free(void *head) {
  for (plan *p = head, *next; p; p = next) {
    next = p->next;
    plan_free(p);
  }
}

static void engine_init(void) {
  (void)mpt__cpu_isa_resolve(); /* caps oneDNN before its first call (isa.c) */
  engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
  if (engine_status == dnnl_success && pthread_key_create(&plans_key, plans_free) != 0)
    engine_status = dnnl_out_of_memory;
}

/* A buffer of the size md describes (64-byte aligned, as oneDNN prefers). */
static mpt_status alloc_for(const dnnl_memory_desc_t *md, void **buf) {
  size_t bytes = dnnl_memory_desc_get_size(md);
  *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  if (!*buf) return MPT_FAIL(MPT_ENOMEM, "oneDNN conv: cannot allocate %zu bytes", bytes);
  return MPT_OK;
}

/* Sets up a: `user` describes the plain tensor, `want` the primitive's layout. input: the
 * reorder goes user -> inner; else inner -> user, adding to the user's data when accumulate. */
static mpt_status arg_init(arg *a, const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *want,
                           int input, int accumulate) {
  DNNL_OK(dnnl_memory_create(&a->user, user, engine, DNNL_MEMORY_NONE));
  if (dnnl_memory_desc_equal(user, want) && !accumulate) {
    a->inner = a->user;
    return MPT_OK;
  }
  MPT_RETURN_IF(alloc_for(want, &a->buf));
  DNNL_OK(dnnl_memory_create(&a->inner, want, engine, a->buf));
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  if (accumulate) {
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    DNNL_OK(dnnl_post_ops_create(&po));
    DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
    DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
  }
  dnnl_primitive_desc_t rpd = NULL;
  dnnl_status_t st = input ? dnnl_reorder_primitive_desc_create(&rpd, user, engine, want, engine,
                                                                attr)
                           : dnnl_reorder_primitive_desc_create(&rpd, want, engine, user, engine,
                                                                attr);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  DNNL_OK(st);
  st = dnnl_primitive_create(&a->move, rpd);
  dnnl_primitive_desc_destroy(rpd);
  DNNL_OK(st);
  return MPT_OK;
}

static mpt_status arg_move(plan *p, arg *a) {
  if (!a->move) return MPT_OK;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a->user}, {DNNL_ARG_TO, a->inner}};
  DNNL_OK(dnnl_primitive_execute(a->move, p->stream, 2, args));
  return MPT_OK;
}

static mpt_status arg_move_out(plan *p, arg *a) {
  if (!a->move) return MPT_OK;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a->inner}, {DNNL_ARG_TO, a->user}};
  DNNL_OK(dnnl_primitive_execute(a->move, p->stream, 2, args));
  return MPT_OK;
}

static mpt_status typed_md(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                           dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  dnnl_dims_t d;
  for (int i = 0; i < ndims; i++) d[i] = dims[i];
  DNNL_OK(dnnl_memory_desc_init_by_tag(md, ndims, d, dt, tag));
  return MPT_OK;
}

static mpt_status plain_md(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                           dnnl_format_tag_t tag) {
  return typed_md(md, ndims, dims, dnnl_f32, tag);
}

/* Builds p's primitive for its pass. The backward passes are created with the forward's
 * descriptor as the hint oneDNN requires. */
static mpt_status plan_build(plan *p, const mpt_conv_geom *g, int64_t n, int64_t o, int has_bias,
                             pass_kind pass, int bf16) {
  const int64_t xs[4] = {n, g->channels, g->height, g->width};
  const int64_t ws[4] = {o, g->channels, g->kernel_h, g->kernel_w};
  const int64_t ys[4] = {n, o, g->out_h, g->out_w};
  dnnl_memory_desc_t x_md, w_md, y_md, b_md, any_x, any_w, any_y;
  MPT_RETURN_IF(plain_md(&x_md, 4, xs, dnnl_nchw));
  MPT_RETURN_IF(plain_md(&w_md, 4, ws, dnnl_oihw));
  MPT_RETURN_IF(plain_md(&y_md, 4, ys, dnnl_nchw));
  MPT_RETURN_IF(plain_md(&b_md, 1, &o, dnnl_x));
  /* The primitive's layouts: inputs in the compute type, outputs (and the forward's y) f32. */
  const dnnl_data_type_t in_t = bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t any_dx, any_dy, any_dw;
  MPT_RETURN_IF(typed_md(&any_x, 4, xs, in_t, dnnl_format_tag_any));
  MPT_RETURN_IF(typed_md(&any_w, 4, ws, in_t, dnnl_format_tag_any));
  MPT_RETURN_IF(plain_md(&any_y, 4, ys, dnnl_format_tag_any));
  MPT_RETURN_IF(plain_md(&any_dx, 4, xs, dnnl_format_tag_any));
  MPT_RETURN_IF(typed_md(&any_dy, 4, ys, in_t, dnnl_format_tag_any));
  MPT_RETURN_IF(plain_md(&any_dw, 4, ws, dnnl_format_tag_any));
  const dnnl_dims_t strides = {g->stride, g->stride}, pad = {g->pad, g->pad};
  /* Padding on the right as PyTorch has it: whatever the last window leaves uncovered. */
  const dnnl_dims_t pad_r = {(g->out_h - 1) * g->stride + g->kernel_h - g->height - g->pad,
                             (g->out_w - 1) * g->stride + g->kernel_w - g->width - g->pad};

  dnnl_primitive_attr_t attr = NULL;
  DNNL_OK(dnnl_primitive_attr_create(&attr));
  dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  dnnl_convolution_desc_t fd, bd;
  dnnl_primitive_desc_t fpd = NULL, pd = NULL;
  if (st == dnnl_success)
    st = dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                            &any_x, &any_w, has_bias ? &b_md : NULL, &any_y,
                                            strides, pad, pad_r);
  if (st == dnnl_success) st = dnnl_primitive_desc_create(&fpd, &fd, attr, engine, NULL);
  if (st == dnnl_success) {
    if (pass == PASS_FWD) {
      pd = fpd;
      fpd = NULL;
    } else {
      st = pass == PASS_BWD_DATA
               ? dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &any_dx,
                                                          &any_w, &any_dy, strides, pad, pad_r)
               : dnnl_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct,
                                                             &any_x, &any_dw,
                                                             has_bias ? &b_md : NULL, &any_dy,
                                                             strides, pad, pad_r);
      if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &bd, attr, engine, fpd);
    }
  }
  dnnl_primitive_attr_destroy(attr);
  if (fpd) dnnl_primitive_desc_destroy(fpd);
  DNNL_OK(st);

  mpt_status rc = MPT_OK;
  const dnnl_memory_desc_t *q_x, *q_w, *q_y, *q_s;
  if (pass == PASS_FWD) {
    q_x = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    q_w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    q_y = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    rc = arg_init(&p->args[0], &x_md, q_x, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[1], &w_md, q_w, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[2], &y_md, q_y, 0, 0);
  } else if (pass == PASS_BWD_DATA) {
    q_y = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
    q_w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    q_x = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_src_md, 0);
    rc = arg_init(&p->args[0], &y_md, q_y, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[1], &w_md, q_w, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[2], &x_md, q_x, 0, 1);
  } else {
    q_x = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    q_y = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
    q_w = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
    rc = arg_init(&p->args[0], &x_md, q_x, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[1], &y_md, q_y, 1, 0);
    if (rc == MPT_OK) rc = arg_init(&p->args[2], &w_md, q_w, 0, 1);
  }
  if (rc == MPT_OK && has_bias) {
    if (pass == PASS_BWD_WEIGHTS) {
      p->bias_buf = malloc((size_t)o * sizeof(float));
      if (!p->bias_buf) rc = MPT_FAIL(MPT_ENOMEM, "oneDNN conv: cannot allocate diff_bias");
    }
    if (rc == MPT_OK && dnnl_memory_create(&p->bias, &b_md, engine,
                                           p->bias_buf ? (void *)p->bias_buf : DNNL_MEMORY_NONE) !=
                            dnnl_success)
      rc = MPT_FAIL(MPT_EDEVICE, "oneDNN conv: cannot create the bias memory");
  }
  if (rc == MPT_OK) {
    q_s = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (q_s && dnnl_memory_desc_get_size(q_s) > 0) {
      rc = alloc_for(q_s, &p->scratch_buf);
      if (rc == MPT_OK && dnnl_memory_create(&p->scratch, q_s, engine, p->scratch_buf) !=
                              dnnl_success)
        rc = MPT_FAIL(MPT_EDEVICE, "oneDNN conv: cannot create the scratchpad memory");
    }
  }
  if (rc == MPT_OK && dnnl_primitive_create(&p->prim, pd) != dnnl_success)
    rc = MPT_FAIL(MPT_EDEVICE, "oneDNN conv: cannot create the %s primitive",
                  pass == PASS_FWD ? "forward" : pass == PASS_BWD_DATA ? "backward data"
                                                                        : "backward weights");
  dnnl_primitive_desc_destroy(pd);
  return rc;
}

/* The calling thread's plan for this shape and pass, built on first use. oneDNN sizes a
 * primitive's work split for the OpenMP thread count at its creation and runs that many threads
 * whatever the count at execution, so the count is set first (as many threads as the GEMMs use,
 * openblas_get_num_threads) and is part of the key. Without this a rank of a 2-rank job on 2
 * cores ran its convolutions on 2 threads (the OpenMP default, the core count): 4 spinning
 * threads on 2 cores, a step 2.5x slower. */
static mpt_status plan_get(const mpt_conv_geom *g, int64_t n, int64_t o, int has_bias,
                           pass_kind pass, int bf16, plan **out) {
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* a bad MPT_CPU_ISA (isa.c) */
  pthread_once(&engine_once, engine_init);
  DNNL_OK(engine_status);
  int threads = openblas_get_num_threads();
  if (threads < 1) threads = 1;
  omp_set_num_threads(threads);
  const int64_t key[13] = {n, g->channels, g->height, g->width, o, g->kernel_h, g->kernel_w,
                           g->stride, g->pad, has_bias, pass, threads, bf16};
  plan *head = pthread_getspecific(plans_key);
  for (plan *p = head; p; p = p->next)
    if (memcmp(p->key, key, sizeof key) == 0) {
      *out = p;
      return MPT_OK;
    }
  plan *p = calloc(1, sizeof *p);
  if (!p) return MPT_FAIL(MPT_ENOMEM, "oneDNN conv: cannot allocate a plan");
  memcpy(p->key, key, sizeof key);
  mpt_status rc = MPT_OK;
  if (dnnl_stream_create(&p->stream, engine, dnnl_stream_default_flags) != dnnl_success)
    rc = MPT_FAIL(MPT_EDEVICE, "oneDNN conv: cannot create a stream");
  if (rc == MPT_OK) rc = plan_build(p, g, n, o, has_bias, pass, bf16);
  if (rc != MPT_OK) {
    plan_free(p);
    return rc;
  }
  /* Keep at most PLANS_PER_THREAD: a caller that cycles through many batch sizes must not grow
   * memory without bound. The list is newest first; the oldest goes. */
  int kept = 1;
  for (plan *q = head; q; q = q->next)
    if (++kept > PLANS_PER_THREAD) break;
  if (kept > PLANS_PER_THREAD) {
    plan *prev = head;
    while (prev->next && prev->next->next) prev = prev->next;
    if (prev->next) {
      plan_free(prev->next);
      prev->next = NULL;
    }
  }
  p->next = head;
  if (pthread_setspecific(plans_key, p) != 0) {
    plan_free(p);
    return MPT_FAIL(MPT_ENOMEM, "oneDNN conv: cannot keep the plan");
  }
  *out = p;
  return MPT_OK;
}

/* Runs p's primitive: the moves of its inputs, the primitive with `bias`, the move out (the
 * OpenMP thread count was set by plan_get). */
static mpt_status plan_run_unguarded(plan *p, const void *in0, const void *in1, void *out) {
  DNNL_OK(dnnl_memory_set_data_handle(p->args[0].user, (void *)in0));
  DNNL_OK(dnnl_memory_set_data_handle(p->args[1].user, (void *)in1));
  DNNL_OK(dnnl_memory_set_data_handle(p->args[2].user, out));
  MPT_RETURN_IF(arg_move(p, &p->args[0]));
  MPT_RETURN_IF(arg_move(p, &p->args[1]));
  const int kind = (int)p->key[10];
  const int a0 = kind == PASS_FWD ? DNNL_ARG_SRC
                 : kind == PASS_BWD_DATA ? DNNL_ARG_DIFF_DST : DNNL_ARG_SRC;
  const int a1 = kind == PASS_FWD ? DNNL_ARG_WEIGHTS
                 : kind == PASS_BWD_DATA ? DNNL_ARG_WEIGHTS : DNNL_ARG_DIFF_DST;
  const int a2 = kind == PASS_FWD ? DNNL_ARG_DST
                 : kind == PASS_BWD_DATA ? DNNL_ARG_DIFF_SRC : DNNL_ARG_DIFF_WEIGHTS;
  dnnl_exec_arg_t args[5] = {{a0, p->args[0].inner}, {a1, p->args[1].inner},
                             {a2, p->args[2].inner}};
  int nargs = 3;
  if (p->bias) args[nargs++] = (dnnl_exec_arg_t){kind == PASS_FWD ? DNNL_ARG_BIAS
                                                                  : DNNL_ARG_DIFF_BIAS, p->bias};
  if (p->scratch) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->scratch};
  DNNL_OK(dnnl_primitive_execute(p->prim, p->stream, nargs, args));
  MPT_RETURN_IF(arg_move_out(p, &p->args[2]));
  DNNL_OK(dnnl_stream_wait(p->stream));
  return MPT_OK;
}

/* plan_run_unguarded with the asynchronous signals blocked: a gemm-based convolution runs
 * oneDNN's fp32 GEMM kernels, which move the stack pointer into the heap (core/threads.h). */
static mpt_status plan_run(plan *p, const void *in0, const void *in1, void *out) {
  sigset_t old;
  mpt__signals_block(&old);
  const mpt_status st = plan_run_unguarded(p, in0, in1, out);
  mpt__signals_restore(&old);
  return st;
}

static mpt_status conv_forward(const mpt_conv_geom *g, int64_t n, int64_t o, const float *x,
                               const float *w, const float *b, float *y, int bf16) {
  plan *p = NULL;
  MPT_RETURN_IF(plan_get(g, n, o, b != NULL, PASS_FWD, bf16, &p));
  if (b) DNNL_OK(dnnl_memory_set_data_handle(p->bias, (void *)b));
  return plan_run(p, x, w, y);
}

static mpt_status conv_backward_data(const mpt_conv_geom *g, int64_t n, int64_t o,
                                     const float *w, const float *dy, float *dx, int bf16) {
  plan *p = NULL;
  MPT_RETURN_IF(plan_get(g, n, o, 0, PASS_BWD_DATA, bf16, &p));
  return plan_run(p, dy, w, dx);
}

static mpt_status conv_backward_weights(const mpt_conv_geom *g, int64_t n, int64_t o,
                                        const float *x, const float *dy, float *dw, float *db,
                                        int bf16) {
  plan *p = NULL;
  MPT_RETURN_IF(plan_get(g, n, o, db != NULL, PASS_BWD_WEIGHTS, bf16, &p));
  MPT_RETURN_IF(plan_run(p, x, dy, dw));
  if (db)
    for (int64_t i = 0; i < o; i++) db[i] += p->bias_buf[i];
  return MPT_OK;
}

/* The backend's slots: float32, and bf16 (cpu.h; ops_bf16.h). */
mpt_status mpt__cpu_conv2d_forward(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                                   const float *x, const float *w, const float *b, float *y) {
  (void)s;
  return conv_forward(g, n, o, x, w, b, y, 0);
}

mpt_status mpt__cpu_conv2d_backward_data(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                         int64_t o, const float *w, const float *dy,
                                         float *dx) {
  (void)s;
  return conv_backward_data(g, n, o, w, dy, dx, 0);
}

mpt_status mpt__cpu_conv2d_backward_weights(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                            int64_t o, const float *x, const float *dy,
                                            float *dw, float *db) {
  (void)s;
  return conv_backward_weights(g, n, o, x, dy, dw, db, 0);
}

mpt_status mpt__cpu_conv2d_forward_bf16(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                        int64_t o, const float *x, const float *w,
                                        const float *b, float *y) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  return conv_forward(g, n, o, x, w, b, y, 1);
}

mpt_status mpt__cpu_conv2d_backward_data_bf16(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                              int64_t o, const float *w, const float *dy,
                                              float *dx) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  return conv_backward_data(g, n, o, w, dy, dx, 1);
}

mpt_status mpt__cpu_conv2d_backward_weights_bf16(mpt_stream *s, const mpt_conv_geom *g,
                                                 int64_t n, int64_t o, const float *x,
                                                 const float *dy, float *dw, float *db) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  return conv_backward_weights(g, n, o, x, dy, dw, db, 1);
}
