/* Per-op wall time of a tape's passes (include/mpitrain/nn.h mpt_tape_set_profiling): the
 * table PyTorch's profiler prints by op name, for finding where a training step's time goes.
 *
 * Attribution. Forward: an op computes its output, then records its node; the time from the
 * previous mark (mpt_tape_reset, the start of mpt_model_forward, or the previous node's record)
 * to this record is the op's forward. Backward: each node's backward function is timed alone, and the
 * grad-ready hooks it releases (DDP's bucket launches) are a row of their own. On a stream that
 * runs asynchronously (CUDA, a CPU worker stream) every mark synchronizes the stream first, so
 * the time is the op's work and not its launch; that serializes the ops while profiling.
 * Names are copied (at most MPT_OP_NAME_MAX - 1 bytes), rows kept in first-seen order. */
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"
#include "nn/tape.h"

#define PROFILE_SYNC_TIMEOUT_MS 600000.0

struct mpt__tape_profile {
  mpt_op_time rows[MPT_TAPE_PROFILE_MAX_OPS];
  int nrows;
  double mark_ms;  /* end of the last attributed interval (mpt_time_ms) */
};

mpt_status mpt__tape_profile_init(mpt__tape_profile **p) {
  *p = calloc(1, sizeof **p);
  if (!*p) return MPT_FAIL(MPT_ENOMEM, "tape profiling: out of host memory");
  (*p)->mark_ms = mpt_time_ms();
  return MPT_OK;
}

void mpt__tape_profile_free(mpt__tape_profile *p) { free(p); }

void mpt__tape_profile_clear(mpt__tape_profile *p) {
  memset(p->rows, 0, sizeof p->rows);
  p->nrows = 0;
  p->mark_ms = mpt_time_ms();
}

/* The time now, after the stream's queued work (errors: the stream's). */
static mpt_status synced_now(mpt_stream *s, double *t) {
  if (s) MPT_RETURN_IF(mpt_stream_synchronize(s, PROFILE_SYNC_TIMEOUT_MS));
  *t = mpt_time_ms();
  return MPT_OK;
}

static mpt_op_time *row_of(mpt__tape_profile *p, const char *name) {
  for (int i = 0; i < p->nrows; i++)
    if (strncmp(p->rows[i].name, name, MPT_OP_NAME_MAX - 1) == 0) return &p->rows[i];
  if (p->nrows == MPT_TAPE_PROFILE_MAX_OPS) return NULL;
  mpt_op_time *r = &p->rows[p->nrows++];
  strncpy(r->name, name, MPT_OP_NAME_MAX - 1);
  r->name[MPT_OP_NAME_MAX - 1] = '\0';
  return r;
}

mpt_status mpt__tape_profile_mark(mpt__tape_profile *p, mpt_stream *s) {
  return synced_now(s, &p->mark_ms);
}

mpt_status mpt__tape_profile_forward(mpt__tape_profile *p, mpt_stream *s, const char *name) {
  double t;
  MPT_RETURN_IF(synced_now(s, &t));
  mpt_op_time *r = row_of(p, name);
  if (r) { /* NULL past MPT_TAPE_PROFILE_MAX_OPS names: not counted (nn.h) */
    r->nodes++;
    r->forward_ms += t - p->mark_ms;
  }
  p->mark_ms = t;
  return MPT_OK;
}

mpt_status mpt__tape_profile_backward(mpt__tape_profile *p, mpt_stream *s, const char *name,
                                      double start_ms, double *end_ms) {
  MPT_RETURN_IF(synced_now(s, end_ms));
  mpt_op_time *r = row_of(p, name);
  if (r) {
    r->backward_nodes++;
    r->backward_ms += *end_ms - start_ms;
  }
  return MPT_OK;
}

int mpt__tape_profile_rows(const mpt__tape_profile *p, mpt_op_time *rows, int max_rows) {
  if (rows)
    for (int i = 0; i < p->nrows && i < max_rows; i++) rows[i] = p->rows[i];
  return p->nrows;
}
