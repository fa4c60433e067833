/* ZeRO in the DDP engine (ddp.h "ZeRO"): the shard of each bucket this rank owns (its
 * reduce-scatter is reducer.c's reduce-scatter reducer), the sharded optimizer (its step, then
 * the all-gather of the parameters), global-norm clipping and the non-finite check over the
 * shards, and the gather / scatter of the optimizer state for checkpoints.
 *
 * Layout: bucket b (a slice {offset, count} of the flat buffers) is split with mpt_comm_shard
 * over the W ranks; rank r owns [offset + s_r, offset + s_r + n_r) of it. So a rank's shard is
 * one contiguous slice per bucket (the whole flat buffer's contiguous 1/W when there is one
 * bucket), and a slice may cut a parameter, or a parameter group of the optimizer, anywhere.
 * After backward only the owned slices of the gradient buffer hold averaged gradients (the rest
 * is what the in-place reduce-scatter left there: undefined).
 *
 * Threads: the training thread calls everything here. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ddp/ddp_impl.h"
#include "ddp/reducer.h"
#include "mpitrain/ops.h"

double mpt__ddp_ring_bytes(int allreduce, double nbytes, int world) {
  if (world <= 1) return 0.0;
  return (allreduce ? 2.0 : 1.0) * (double)(world - 1) / (double)world * nbytes;
}

static int by_offset(const void *a, const void *b) {
  const mpt_optim_range *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

mpt_status mpt__ddp_zero_init(mpt_ddp *d) {
  const int world = mpt_comm_world_size(d->comm), rank = mpt_comm_rank(d->comm);
  const size_t nb = (size_t)(d->nbuckets ? d->nbuckets : 1);
  d->bucket_shard = calloc(2 * nb, sizeof *d->bucket_shard);
  d->shard = calloc(nb, sizeof *d->shard);
  if (!d->bucket_shard || !d->shard)
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the ZeRO-1 shard table");
  for (int b = 0; b < d->nbuckets; b++) {
    int64_t off, n;
    mpt_comm_shard(d->buckets[b].count, world, rank, &off, &n);
    d->bucket_shard[2 * b] = off;
    d->bucket_shard[2 * b + 1] = n;
    if (n > 0) d->shard[d->nshard++] = (mpt_optim_range){d->buckets[b].offset + off, n, 0};
    d->shard_count += n;
  }
  qsort(d->shard, (size_t)d->nshard, sizeof *d->shard, by_offset);
  return MPT_OK;
}

/* The whole pages inside [start, start + nbytes) given back to the system (they read as zero
 * afterwards: the buffers are private anonymous memory, malloc's); returns 1 when it did. *from
 * and *to get the range given back (from == to: none). */
static int release_pages(void *start, size_t nbytes, uintptr_t *from, uintptr_t *to) {
  static long page;
  if (page <= 0) page = sysconf(_SC_PAGESIZE);
  const uintptr_t a = (uintptr_t)start, e = a + nbytes, m = (uintptr_t)(page > 0 ? page : 1) - 1;
  *from = *to = a;
  if (page <= 0 || nbytes < (size_t)page) return 0;
  const uintptr_t f = (a + m) & ~m, t = e & ~m;
  if (t <= f || madvise((void *)f, t - f, MADV_DONTNEED) != 0) return 0;
  *from = f;
  *to = t;
  return 1;
}

mpt_status mpt__ddp_zero_grads(void *user, float *grads, int64_t count) {
  (void)user;
  const size_t nbytes = sizeof(float) * (size_t)count;
  uintptr_t from, to;
  if (!release_pages(grads, nbytes, &from, &to)) {
    memset(grads, 0, nbytes);
    return MPT_OK;
  }
  const uintptr_t a = (uintptr_t)grads, e = a + nbytes; /* the pages shared with others */
  memset(grads, 0, from - a);
  memset((void *)to, 0, e - to);
  return MPT_OK;
}

mpt_status mpt__ddp_zero_release(void *arg) {
  bucket_arg *a = arg;
  const mpt_ddp *d = a->ddp;
  const mpt_ddp_bucket_info *bk = &d->buckets[a->bucket];
  const int64_t off = d->bucket_shard[2 * a->bucket], n = d->bucket_shard[2 * a->bucket + 1];
  float *g = d->grads + bk->offset;
  uintptr_t from, to;
  release_pages(g, sizeof(float) * (size_t)off, &from, &to);
  release_pages(g + off + n, sizeof(float) * (size_t)(bk->count - off - n), &from, &to);
  if (d->wire) release_pages(d->wire + bk->offset, sizeof(uint16_t) * (size_t)bk->count, &from,
                             &to);
  return MPT_OK;
}

/* ---- ZeRO-3 ---- */

enum { Z3_GIVEN_BACK = 0, Z3_WHOLE = 1, Z3_IN_FLIGHT = 2 };

mpt_status mpt__ddp_z3_init(mpt_ddp *d) {
  if (mpt_comm_world_size(d->comm) <= 1) return MPT_OK; /* one rank: its shard is the model */
  const int *first = NULL;
  const int n = mpt_model_units(d->model, &first);
  const size_t nb = (size_t)(d->nbuckets ? d->nbuckets : 1);
  d->gathered = malloc(nb);
  d->gather_events = calloc(nb, sizeof *d->gather_events);
  d->param_unit = malloc(sizeof(int) * (size_t)(d->nparams ? d->nparams : 1));
  d->unit_first = malloc(sizeof(int) * (size_t)(n + 1));
  if (!d->gathered || !d->gather_events || !d->param_unit || !d->unit_first)
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the ZeRO-3 tables");
  memset(d->gathered, Z3_WHOLE, nb); /* whole after the broadcast */
  for (int b = 0; b < d->nbuckets; b++)
    MPT_RETURN_IF(mpt_event_init(&d->gather_events[b], mpt_stream_device(d->comm_stream)));
  for (int u = 0; u < n; u++) d->unit_first[u] = first[u];
  d->unit_first[n] = d->nparams;
  for (int u = 0; u < n; u++)
    for (int p = d->unit_first[u]; p < d->unit_first[u + 1]; p++) d->param_unit[p] = u;
  d->nunits = n;
  d->cur_unit = d->prev_unit = d->bwd_unit = -1;
  d->z3 = 1;
  return MPT_OK;
}

void mpt__ddp_z3_free(mpt_ddp *d) {
  for (int b = 0; d->gather_events && b < d->nbuckets; b++) mpt_event_free(d->gather_events[b]);
  free(d->gather_events);
  d->gather_events = NULL;
}

/* Bucket b holds a parameter of unit u. Buckets hold parameters last_param..first_param. */
static int bucket_in_unit(const mpt_ddp *d, int b, int u) {
  if (u < 0 || u >= d->nunits) return 0;
  return d->buckets[b].last_param < d->unit_first[u + 1] &&
         d->buckets[b].first_param >= d->unit_first[u];
}

/* Starts bucket b's all-gather on the comm stream (its event recorded after it). */
static mpt_status z3_launch(mpt_ddp *d, int b) {
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  char purpose[MPT_COMM_PURPOSE_MAX];
  snprintf(purpose, sizeof purpose, "zero3 gather %d", b % 1000000); /* flight recorder's tag */
  mpt_comm_set_purpose(d->comm, purpose);
  MPT_RETURN_IF(mpt_comm_allgather_shards(d->comm, d->comm_stream, d->params + bk->offset,
                                          bk->count, MPT_F32));
  d->sent_bytes += mpt__ddp_ring_bytes(0, 4.0 * (double)bk->count, mpt_comm_world_size(d->comm));
  d->gathers++;
  d->gathered[b] = Z3_IN_FLIGHT;
  return mpt_event_record(d->gather_events[b], d->comm_stream);
}

/* Bucket b whole: launched if given back, waited for if in flight (deadline). */
static mpt_status z3_gather(mpt_ddp *d, int b) {
  if (d->gathered[b] == Z3_GIVEN_BACK) MPT_RETURN_IF(z3_launch(d, b));
  if (d->gathered[b] == Z3_IN_FLIGHT) {
    MPT_RETURN_IF(mpt_comm_wait_event(d->comm, d->gather_events[b]));
    d->gathered[b] = Z3_WHOLE;
  }
  return MPT_OK;
}

/* The buckets of unit u that are given back start their all-gathers (prefetch). */
static mpt_status z3_prefetch(mpt_ddp *d, int u) {
  for (int b = 0; d->cfg.prefetch && u >= 0 && u < d->nunits && b < d->nbuckets; b++)
    if (d->gathered[b] == Z3_GIVEN_BACK && bucket_in_unit(d, b, u)) MPT_RETURN_IF(z3_launch(d, b));
  return MPT_OK;
}

mpt_status mpt__ddp_z3_release(mpt_ddp *d, int b) {
  if (d->gathered[b] == Z3_IN_FLIGHT) MPT_RETURN_IF(z3_gather(d, b)); /* MPI still writes it */
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  const int64_t off = d->bucket_shard[2 * b], n = d->bucket_shard[2 * b + 1];
  float *p = d->params + bk->offset;
  uintptr_t from, to;
  release_pages(p, sizeof(float) * (size_t)off, &from, &to);
  release_pages(p + off + n, sizeof(float) * (size_t)(bk->count - off - n), &from, &to);
  d->gathered[b] = Z3_GIVEN_BACK;
  return MPT_OK;
}

mpt_status mpt__ddp_z3_init_by_unit(mpt_ddp *d) {
  /* Buckets are units here (one bucket per unit; a unit whose dtype changes spans two): walk
   * them in unit order, i.e. from the last bucket down. A unit is initialised once, when its
   * first bucket comes. */
  float *params = mpt_model_params(d->model);
  int done_unit = -1;
  for (int b = d->nbuckets - 1; b >= 0; b--) {
    const mpt_ddp_bucket_info *bk = &d->buckets[b];
    for (int p = bk->last_param; p <= bk->first_param; p++)
      if (d->param_unit[p] > done_unit) {
        done_unit = d->param_unit[p];
        MPT_RETURN_IF(mpt_model_init_unit(d->model, done_unit));
      }
    char purpose[MPT_COMM_PURPOSE_MAX];
    snprintf(purpose, sizeof purpose, "zero3 init %d", b % 1000000); /* flight recorder's tag */
    mpt_comm_set_purpose(d->comm, purpose);
    MPT_RETURN_IF(mpt_comm_broadcast_sync(d->comm, params + bk->offset, bk->count, MPT_F32, 0));
    d->gathered[b] = Z3_WHOLE;
    MPT_RETURN_IF(mpt__ddp_z3_release(d, b));
  }
  return MPT_OK;
}

mpt_status mpt__ddp_z3_param_needed(void *user, mpt_tape *tape, int param, int phase) {
  mpt_ddp *d = user;
  (void)tape;
  if (!d->z3 || param < 0 || param >= d->nparams) return MPT_OK;
  const int u = d->param_unit[param];
  int moved = 0;
  if (phase == 0 && u != d->cur_unit) { /* a forward moves on: free what it left behind */
    d->prev_unit = d->cur_unit;
    d->cur_unit = u;
    moved = 1;
    for (int b = 0; b < d->nbuckets; b++)
      if (d->gathered[b] == Z3_WHOLE && !bucket_in_unit(d, b, u) &&
          !bucket_in_unit(d, b, d->prev_unit))
        MPT_RETURN_IF(mpt__ddp_z3_release(d, b));
  }
  MPT_RETURN_IF(z3_gather(d, d->param_bucket[param]));
  /* prefetch: the next unit in the pass's order, once per unit reached. Backward walks the
   * units down; a checkpoint recomputing its block inside backward (phase 0 while backward
   * runs) too. */
  const int backward = phase == 1 || (phase == 0 && d->in_backward);
  if (backward && u != d->bwd_unit) {
    d->bwd_unit = u;
    MPT_RETURN_IF(z3_prefetch(d, u - 1));
  } else if (!backward && moved) {
    MPT_RETURN_IF(z3_prefetch(d, u + 1));
  }
  return MPT_OK;
}

mpt_status mpt_ddp_gather_params(mpt_ddp *d) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_gather_params: NULL DDP engine");
  for (int b = 0; d->z3 && b < d->nbuckets; b++)
    if (d->gathered[b] == Z3_GIVEN_BACK) MPT_RETURN_IF(z3_launch(d, b));
  for (int b = 0; d->z3 && b < d->nbuckets; b++) MPT_RETURN_IF(z3_gather(d, b));
  return MPT_OK;
}

int64_t mpt_ddp_param_gathers(const mpt_ddp *d) { return d ? d->gathers : 0; }

mpt_status mpt_ddp_release_params(mpt_ddp *d) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_release_params: NULL DDP engine");
  for (int b = 0; d->z3 && b < d->nbuckets; b++) MPT_RETURN_IF(mpt__ddp_z3_release(d, b));
  if (d->z3) d->cur_unit = d->prev_unit = d->bwd_unit = -1;
  return MPT_OK;
}

/* ---- public (ddp.h "ZeRO-1") ---- */

int mpt_ddp_zero_stage(const mpt_ddp *d) { return d ? d->cfg.zero : 0; }

int mpt_ddp_shard(const mpt_ddp *d, const mpt_optim_range **ranges) {
  if (ranges) *ranges = d && d->cfg.zero ? d->shard : NULL;
  return d && d->cfg.zero ? d->nshard : 0;
}

int64_t mpt_ddp_shard_count(const mpt_ddp *d) {
  if (!d) return 0;
  return d->cfg.zero ? d->shard_count : mpt_model_param_count(d->model);
}

double mpt_ddp_sent_bytes(const mpt_ddp *d) { return d ? d->sent_bytes : 0.0; }

double mpt_ddp_step_bytes(const mpt_ddp *d) {
  if (!d) return 0.0;
  const int world = mpt_comm_world_size(d->comm);
  double sum = 0;
  for (int b = 0; b < d->nbuckets; b++) { /* the reduction, and ZeRO's all-gather after the step */
    sum += d->reducer->bytes(d, b);
    if (d->cfg.zero) sum += mpt__ddp_ring_bytes(0, 4.0 * (double)d->buckets[b].count, world);
  }
  return sum;
}

mpt_status mpt_ddp_optimizer_init(mpt_ddp *d, mpt_optimizer **opt,
                                  const mpt_optimizer_config *cfg, mpt_device device) {
  if (!d || !opt) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_optimizer_init: NULL argument");
  const int64_t count = mpt_model_param_count(d->model);
  if (!d->cfg.zero) return mpt_optimizer_init(opt, cfg, device, count);
  const mpt_optim_range none = {0, 0, 0}; /* a rank that owns nothing: sharded, no state */
  return mpt_optimizer_init_ranges(opt, cfg, device, count, d->nshard ? d->shard : &none,
                                   d->nshard ? d->nshard : 1);
}

/* The optimizer holds exactly this rank's shard (made by mpt_ddp_optimizer_init). */
static mpt_status check_sharded(const mpt_ddp *d, const mpt_optimizer *opt, const char *what) {
  int n = mpt_optimizer_num_ranges(opt), ok = n == (d->nshard ? d->nshard : 1);
  for (int i = 0; ok && i < d->nshard; i++) {
    const mpt_optim_range *r = mpt_optimizer_range(opt, i);
    ok = r->offset == d->shard[i].offset && r->count == d->shard[i].count;
  }
  if (!ok)
    return MPT_FAIL(MPT_EINVAL, "%s: the optimizer does not hold this rank's ZeRO-1 shard "
                    "(make it with mpt_ddp_optimizer_init)", what);
  return MPT_OK;
}

/* Every bucket's parameters all-gathered from their owners; waits (deadline). */
static mpt_status gather_buckets(mpt_ddp *d, float *base) {
  mpt_status st = MPT_OK;
  const int world = mpt_comm_world_size(d->comm);
  int launched = 0;
  for (int b = 0; b < d->nbuckets && st == MPT_OK; b++) {
    const mpt_ddp_bucket_info *bk = &d->buckets[b];
    char purpose[MPT_COMM_PURPOSE_MAX];
    snprintf(purpose, sizeof purpose, "zero gather %d", b % 1000000); /* flight recorder's tag */
    mpt_comm_set_purpose(d->comm, purpose);
    st = mpt_comm_allgather_shards(d->comm, d->comm_stream, base + bk->offset, bk->count,
                                   MPT_F32);
    if (st == MPT_OK) d->sent_bytes += mpt__ddp_ring_bytes(0, 4.0 * (double)bk->count, world);
    launched += st == MPT_OK;
  }
  if (launched == 0) return st;
  mpt_status wst = mpt_event_record(d->done_event, d->comm_stream);
  if (wst == MPT_OK) wst = mpt_comm_wait_event(d->comm, d->done_event);
  return st != MPT_OK ? st : wst;
}

mpt_status mpt_ddp_optimizer_step(mpt_ddp *d, mpt_optimizer *opt, mpt_stream *stream,
                                  float lr) {
  if (!d || !opt) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_optimizer_step: NULL argument");
  if (!d->cfg.zero) return mpt_optimizer_step_model(opt, d->model, stream, lr);
  MPT_RETURN_IF(check_sharded(d, opt, "mpt_ddp_optimizer_step"));
  MPT_RETURN_IF(mpt_optimizer_step_model(opt, d->model, stream, lr));
  if (stream) MPT_RETURN_IF(mpt_stream_synchronize(stream, d->cfg.timeout_ms));
  if (d->z3) return mpt_ddp_release_params(d); /* only the shards are current: each forward
                                                * gathers the units it uses */
  if (d->cfg.zero == 3) return MPT_OK; /* one rank */
  return gather_buckets(d, d->params);
}

mpt_status mpt_ddp_clip_grad_norm(mpt_ddp *d, mpt_stream *stream, float max_norm,
                                  float *total_norm) {
  mpt_status st = MPT_OK;
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_clip_grad_norm: NULL DDP engine");
  if (!d->cfg.zero && d->rsag) return mpt__ddp_rsag_clip(d, stream, max_norm, total_norm);
  if (!d->cfg.zero) return mpt_clip_grad_norm(d->model, stream, max_norm, total_norm);
  if (!(max_norm > 0.0f))
    return MPT_FAIL(MPT_EINVAL, "clip_grad_norm: max_norm = %g must be > 0", (double)max_norm);
  const int world = mpt_comm_world_size(d->comm);
  double mine = mpt__ddp_shard_sq(d, mpt_comm_rank(d->comm)), sq = 0;
  double *all = malloc(sizeof(double) * (size_t)world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "clip_grad_norm: %d ranks", world);
  /* The doubles as bytes: every rank adds the same W values in rank order, so all agree. */
  MPT_CHECK(mpt_comm_allgather_sync(d->comm, &mine, all, (int64_t)sizeof mine, MPT_U8), done);
  for (int r = 0; r < world; r++) sq += all[r];
  const double norm = sqrt(sq);
  if (total_norm) *total_norm = (float)norm;
  if (!isfinite(norm)) goto done; /* the caller decides (skip the step) */
  const double coef = (double)max_norm / (norm + MPT__DDP_CLIP_EPS);
  for (int i = 0; coef < 1.0 && i < d->nshard; i++)
    MPT_CHECK(mpt_op_scale(stream, d->grads + d->shard[i].offset, d->shard[i].count,
                           (float)coef), done);
done:
  free(all);
  return st;
}

mpt_status mpt_ddp_grads_nonfinite(mpt_ddp *d, mpt_stream *stream, int *nonfinite) {
  if (!d || !nonfinite) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_grads_nonfinite: NULL argument");
  *nonfinite = 0;
  if (!d->cfg.zero)
    return mpt_op_check_finite(stream, d->grads, mpt_model_param_count(d->model), nonfinite);
  int32_t flag = 0, any = 0;
  for (int i = 0; i < d->nshard && !flag; i++) {
    int bad = 0;
    MPT_RETURN_IF(mpt_op_check_finite(stream, d->grads + d->shard[i].offset, d->shard[i].count,
                                      &bad));
    flag = bad != 0;
  }
  MPT_RETURN_IF(mpt_comm_allreduce_sync(d->comm, &flag, &any, 1, MPT_I32, MPT_REDUCE_MAX));
  *nonfinite = any != 0;
  return MPT_OK;
}

/* The two optimizers step the same parameters with the same kind of state. */
static mpt_status same_kind(const mpt_ddp *d, mpt_optimizer *a, mpt_optimizer *b,
                            mpt_optimizer_state *sa, mpt_optimizer_state *sb, const char *what) {
  MPT_RETURN_IF(mpt_optimizer_get_state(a, sa));
  MPT_RETURN_IF(mpt_optimizer_get_state(b, sb));
  if (sa->nbuffers != sb->nbuffers || sb->count != mpt_model_param_count(d->model) ||
      mpt_optimizer_num_ranges(b) != 0 || sa->device.type != MPT_DEVICE_CPU ||
      sb->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_EINVAL, "%s: the whole optimizer must be a host one of the model's %" PRId64
                    " parameters with the shard's kind of state (%d buffers, %d given)", what,
                    mpt_model_param_count(d->model), sa->nbuffers, sb->nbuffers);
  return MPT_OK;
}

/* The index of the owned slice that starts at `offset` (the shard of a bucket), -1 if none. */
static int slice_at(const mpt_ddp *d, int64_t offset) {
  for (int i = 0; i < d->nshard; i++)
    if (d->shard[i].offset == offset) return i;
  return -1;
}

mpt_status mpt_ddp_optimizer_gather(mpt_ddp *d, mpt_optimizer *shard, mpt_optimizer *whole) {
  mpt_optimizer_state ss, ws;
  mpt_status st = MPT_OK;
  if (!d || !shard) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_optimizer_gather: NULL");
  MPT_RETURN_IF(mpt_optimizer_get_state(shard, &ss));
  if (whole) MPT_RETURN_IF(same_kind(d, shard, whole, &ss, &ws, "mpt_ddp_optimizer_gather"));
  if (!d->cfg.zero) {
    for (int s = 0; whole && ws.count && s < ss.nbuffers; s++)
      memcpy(ws.buffers[s], ss.buffers[s], sizeof(float) * (size_t)ws.count);
    return whole ? mpt_optimizer_set_step_count(whole, ss.step_count) : MPT_OK;
  }
  MPT_RETURN_IF(check_sharded(d, shard, "mpt_ddp_optimizer_gather"));
  /* bucket by bucket through a staging buffer of the largest bucket: each rank puts its shard
   * in place, the all-gather completes the bucket, `whole` (if any) takes a copy */
  int64_t most = 1;
  for (int b = 0; b < d->nbuckets; b++)
    if (d->buckets[b].count > most) most = d->buckets[b].count;
  float *stage = malloc(sizeof(float) * (size_t)most);
  if (!stage) return MPT_FAIL(MPT_ENOMEM, "optimizer gather: a bucket of %" PRId64, most);
  for (int s = 0; s < ss.nbuffers && st == MPT_OK; s++)
    for (int b = 0; b < d->nbuckets && st == MPT_OK; b++) {
      const mpt_ddp_bucket_info *bk = &d->buckets[b];
      const int64_t off = d->bucket_shard[2 * b], n = d->bucket_shard[2 * b + 1];
      const int i = n > 0 ? slice_at(d, bk->offset + off) : -1;
      if (i >= 0)
        memcpy(stage + off, ss.buffers[s] + mpt_optimizer_range(shard, i)->state_offset,
               sizeof(float) * (size_t)n);
      st = mpt_comm_allgather_shards_sync(d->comm, stage, bk->count, MPT_F32);
      if (st == MPT_OK && whole)
        memcpy(ws.buffers[s] + bk->offset, stage, sizeof(float) * (size_t)bk->count);
    }
  free(stage);
  if (st == MPT_OK && whole) st = mpt_optimizer_set_step_count(whole, ss.step_count);
  return st;
}

mpt_status mpt_ddp_optimizer_scatter(mpt_ddp *d, mpt_optimizer *whole, mpt_optimizer *shard) {
  mpt_optimizer_state ss, ws;
  if (!d || !shard || !whole) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_optimizer_scatter: NULL");
  MPT_RETURN_IF(same_kind(d, shard, whole, &ss, &ws, "mpt_ddp_optimizer_scatter"));
  if (d->cfg.zero) MPT_RETURN_IF(check_sharded(d, shard, "mpt_ddp_optimizer_scatter"));
  for (int s = 0; s < ss.nbuffers; s++) {
    if (!d->cfg.zero) {
      if (ws.count) memcpy(ss.buffers[s], ws.buffers[s], sizeof(float) * (size_t)ws.count);
      continue;
    }
    for (int i = 0; i < d->nshard; i++)
      memcpy(ss.buffers[s] + mpt_optimizer_range(shard, i)->state_offset,
             ws.buffers[s] + d->shard[i].offset, sizeof(float) * (size_t)d->shard[i].count);
  }
  return mpt_optimizer_set_step_count(shard, ws.step_count);
}
