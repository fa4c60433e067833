/* The model: a registry of named parameters and buffers, their flat storage, initialisation,
 * zero_grad and replication (include/mpitrain/nn.h).
 *
 * Invariants:
 * - Before mpt_model_finalize, entries may be added; after it, the registry is frozen and the
 *   three flat buffers (parameters, gradients of the same layout, buffers) exist on the model's
 *   device. Offsets are assigned in registration order, so entry i occupies
 *   [offset_i, offset_i + count_i) with offset_{i+1} = offset_i + count_i (no padding).
 * - Names are owned copies; names are unique across parameters AND buffers (one namespace, as
 *   in a checkpoint). A mpt_param_info pointer stays valid until the next add (so for the
 *   model's life once it is finalised).
 * - Initialisation draws on the host from one mpt_rng in registration order and copies the
 *   whole flat buffer to the device in one mpt_op_memcpy, so every device gets the same bytes.
 * - A replica shares the forward function and its context but never frees that context.
 * - Views returned for a bad index or before finalize are zeroed tensors (data NULL).
 * Host work runs on the calling thread; device work goes on a temporary inline stream of the
 * model's device that is synchronised before the call returns. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "nn/tape.h"

/* How long the model's own one-off device work (finalize, init, replicate) may take. */
#define MODEL_SYNC_TIMEOUT_MS 600000.0

typedef struct model_entry {
  mpt_param_info info; /* info.name is owned */
  mpt_init_kind init;
  int64_t fan_in;
} model_entry;

typedef struct entry_list {
  model_entry *items;
  int count, capacity;
  int64_t total; /* sum of the counts: the flat buffer's element count */
} entry_list;

struct mpt_model {
  mpt_device device;
  entry_list params, buffers;
  int finalized;
  int training;
  float *param_data;  /* [params.total] on device */
  float *grad_data;   /* [params.total] on device */
  float *buffer_data; /* [buffers.total] on device */
  mpt_forward_fn forward;
  void *ctx;
  void (*free_ctx)(void *ctx); /* NULL on replicas: the context belongs to the source */
  mpt_grads_state grads_state;  /* the training step's progress (nn.h) */
  uint64_t generation;          /* mpt_model_generation */
  mpt_model_hooks hooks;        /* a wrapper's (DDP); has_hooks says whether installed */
  int has_hooks;
  int *unit_first;              /* mpt_model_set_units, or derived from the names; NULL: none */
  int nunits;
  /* Deferred initialisation (mpt__model_defer_init): writes the initial values of parameters
   * [first, end) from the forward context; unit_done[u] once unit u's are written */
  mpt__model_range_init range_init;
  unsigned char *unit_done;     /* [nunits] while the initialisation is pending; NULL: not */
  int units_left;
};

static void entry_list_free(entry_list *list) {
  for (int i = 0; i < list->count; i++) free((char *)list->items[i].info.name);
  free(list->items);
  memset(list, 0, sizeof *list);
}

mpt_status mpt_model_init(mpt_model **model, mpt_device device) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_init: NULL output pointer");
  *model = calloc(1, sizeof **model);
  if (!*model) return MPT_FAIL(MPT_ENOMEM, "model_init: out of host memory");
  (*model)->device = device;
  (*model)->training = 1;
  return MPT_OK;
}

void mpt_model_free(mpt_model *model) {
  if (!model) return;
  mpt_device_free(model->device, model->param_data);
  mpt_device_free(model->device, model->grad_data);
  mpt_device_free(model->device, model->buffer_data);
  if (model->free_ctx) model->free_ctx(model->ctx);
  entry_list_free(&model->params);
  entry_list_free(&model->buffers);
  free(model->unit_first);
  free(model->unit_done);
  free(model);
}

mpt_status mpt_model_set_units(mpt_model *model, int n, const int *first_param) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_set_units: NULL model");
  if (model->unit_done)
    return MPT_FAIL(MPT_ESTATE, "model_set_units: the initialisation by unit is pending");
  const int np = model->params.count;
  int ok = n >= 1 && first_param && first_param[0] == 0;
  for (int u = 1; ok && u < n; u++) ok = first_param[u] > first_param[u - 1] && first_param[u] < np;
  if (!ok || np == 0)
    return MPT_FAIL(MPT_EINVAL, "model_set_units: %d units must start at parameter 0 and "
                    "increase below the %d parameters", n, np);
  int *copy = malloc(sizeof *copy * (size_t)n);
  if (!copy) return MPT_FAIL(MPT_ENOMEM, "model_set_units: %d units", n);
  memcpy(copy, first_param, sizeof *copy * (size_t)n);
  free(model->unit_first);
  model->unit_first = copy;
  model->nunits = n;
  return MPT_OK;
}

/* The length of a parameter name's unit prefix: up to its first '.', else the whole name. */
static size_t unit_prefix(const char *name) {
  const char *dot = strchr(name, '.');
  return dot ? (size_t)(dot - name) : strlen(name);
}

int mpt_model_units(mpt_model *model, const int **first_param) {
  if (first_param) *first_param = NULL;
  if (!model || model->params.count == 0) return 0;
  if (!model->unit_first) { /* derived: consecutive parameters of one name prefix */
    const int np = model->params.count;
    int *f = malloc(sizeof *f * (size_t)np), n = 0;
    if (!f) return 0;
    for (int i = 0; i < np; i++) {
      const char *a = model->params.items[i].info.name;
      const char *b = i ? model->params.items[i - 1].info.name : NULL;
      if (!b || unit_prefix(a) != unit_prefix(b) || strncmp(a, b, unit_prefix(a)) != 0)
        f[n++] = i;
    }
    model->unit_first = f;
    model->nunits = n;
  }
  if (first_param) *first_param = model->unit_first;
  return model->nunits;
}

static int name_taken(const mpt_model *model, const char *name) {
  const entry_list *lists[2] = {&model->params, &model->buffers};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < lists[l]->count; i++)
      if (strcmp(lists[l]->items[i].info.name, name) == 0) return 1;
  return 0;
}

/* Validates and appends one entry to `list`; `what` is "parameter" or "buffer". */
static mpt_status entry_add(mpt_model *model, entry_list *list, const char *what,
                            const char *name, int ndim, const int64_t *shape,
                            mpt_init_kind init, int64_t fan_in, int *index) {
  if (!model || !name) return MPT_FAIL(MPT_EINVAL, "model: add %s with a NULL model or name", what);
  if (model->finalized)
    return MPT_FAIL(MPT_ESTATE, "model: cannot add %s '%s' after mpt_model_finalize", what, name);
  if (name[0] == '\0') return MPT_FAIL(MPT_EINVAL, "model: %s with an empty name", what);
  if (ndim < 0 || ndim > MPT_MAX_DIMS || (ndim > 0 && !shape))
    return MPT_FAIL(MPT_EINVAL, "model: %s '%s' has rank %d (want 0..%d with a shape)", what,
                    name, ndim, MPT_MAX_DIMS);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1 || __builtin_mul_overflow(count, shape[d], &count)) {
      char buf[128];
      return MPT_FAIL(MPT_EINVAL, "model: %s '%s' has a bad shape %s (extents must be >= 1)",
                      what, name, mpt_shape_str(ndim, shape, buf, sizeof buf));
    }
  }
  if (init != MPT_INIT_ZEROS && init != MPT_INIT_ONES && init != MPT_INIT_FAN_IN)
    return MPT_FAIL(MPT_EINVAL, "model: %s '%s' has an unknown init kind %d", what, name,
                    (int)init);
  if (init == MPT_INIT_FAN_IN && fan_in < 1)
    return MPT_FAIL(MPT_EINVAL, "model: %s '%s' uses MPT_INIT_FAN_IN with fan_in = %lld < 1",
                    what, name, (long long)fan_in);
  if (name_taken(model, name))
    return MPT_FAIL(MPT_EINVAL, "model: duplicate name '%s'", name);
  if (list->count == list->capacity) {
    int cap = list->capacity ? 2 * list->capacity : 16;
    model_entry *items = realloc(list->items, (size_t)cap * sizeof *items);
    if (!items) return MPT_FAIL(MPT_ENOMEM, "model: out of host memory adding '%s'", name);
    list->items = items;
    list->capacity = cap;
  }
  char *copy = strdup(name);
  if (!copy) return MPT_FAIL(MPT_ENOMEM, "model: out of host memory adding '%s'", name);
  model_entry *e = &list->items[list->count];
  memset(e, 0, sizeof *e);
  e->info.name = copy;
  e->info.dtype = MPT_F32;
  e->info.ndim = ndim;
  for (int d = 0; d < MPT_MAX_DIMS; d++) e->info.shape[d] = d < ndim ? shape[d] : 1;
  e->info.count = count;
  e->info.offset = -1; /* assigned by finalize */
  e->init = init;
  e->fan_in = fan_in;
  if (index) *index = list->count;
  list->count++;
  return MPT_OK;
}

mpt_status mpt_model_add_param(mpt_model *model, const char *name, int ndim,
                               const int64_t *shape, mpt_init_kind init, int64_t fan_in,
                               int *index) {
  if (model) { /* the units are those of the parameters registered so far */
    free(model->unit_first);
    model->unit_first = NULL;
    model->nunits = 0;
  }
  return entry_add(model, model ? &model->params : NULL, "parameter", name, ndim, shape, init,
                   fan_in, index);
}

mpt_status mpt_model_add_buffer(mpt_model *model, const char *name, int ndim,
                                const int64_t *shape, mpt_init_kind init, int *index) {
  if (init == MPT_INIT_FAN_IN)
    return MPT_FAIL(MPT_EINVAL, "model: buffer '%s' cannot use MPT_INIT_FAN_IN (zeros or ones)",
                    name ? name : "(null)");
  return entry_add(model, model ? &model->buffers : NULL, "buffer", name, ndim, shape, init, 0,
                   index);
}

void mpt_model_set_forward(mpt_model *model, mpt_forward_fn forward, void *ctx,
                           void (*free_ctx)(void *ctx)) {
  if (!model) return;
  if (model->free_ctx && model->ctx != ctx) model->free_ctx(model->ctx);
  model->forward = forward;
  model->ctx = ctx;
  model->free_ctx = free_ctx;
  model->generation++;
}

/* A stream for the model's one-off device work: NULL on the CPU (ops run now), else a
 * temporary inline stream of the device. */
static mpt_status work_stream(mpt_device device, mpt_stream **stream) {
  *stream = NULL;
  if (device.type == MPT_DEVICE_CPU) return MPT_OK;
  return mpt_stream_init(stream, device, MPT_STREAM_INLINE);
}

static mpt_status work_stream_finish(mpt_stream *stream, mpt_status st) {
  if (!stream) return st;
  mpt_status sync = mpt_stream_synchronize(stream, MODEL_SYNC_TIMEOUT_MS);
  mpt_stream_free(stream);
  return st != MPT_OK ? st : sync;
}

static void assign_offsets(entry_list *list) {
  int64_t offset = 0;
  for (int i = 0; i < list->count; i++) {
    list->items[i].info.offset = offset;
    offset += list->items[i].info.count;
  }
  list->total = offset;
}

/* Zeroes host memory [p, p + nbytes): the whole pages inside it are given back to the system
 * (private anonymous memory, the C heap's: they read as zero and take no memory until written),
 * the partial pages at its ends, which it may share with other data, are written. So a large
 * buffer that is never written stays out of the resident set. */
static void zero_host(void *p, size_t nbytes) {
  static long page;
  if (!p || nbytes == 0) return;
  if (page <= 0) page = sysconf(_SC_PAGESIZE);
  const uintptr_t a = (uintptr_t)p, e = a + nbytes, m = (uintptr_t)(page > 0 ? page : 1) - 1;
  const uintptr_t f = (a + m) & ~m, t = e & ~m;
  if (page <= 0 || t <= f || madvise((void *)f, t - f, MADV_DONTNEED) != 0) {
    memset(p, 0, nbytes);
    return;
  }
  memset(p, 0, f - a);
  memset((void *)t, 0, e - t);
}

mpt_status mpt_model_finalize(mpt_model *model) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_finalize: NULL model");
  if (model->finalized) return MPT_FAIL(MPT_ESTATE, "model_finalize: already finalised");
  mpt_status st = MPT_OK;
  mpt_stream *stream = NULL;
  assign_offsets(&model->params);
  assign_offsets(&model->buffers);
  const size_t pbytes = (size_t)model->params.total * sizeof(float);
  const size_t bbytes = (size_t)model->buffers.total * sizeof(float);
  MPT_CHECK(mpt_device_alloc(model->device, pbytes, (void **)&model->param_data), fail);
  MPT_CHECK(mpt_device_alloc(model->device, pbytes, (void **)&model->grad_data), fail);
  MPT_CHECK(mpt_device_alloc(model->device, bbytes, (void **)&model->buffer_data), fail);
  if (model->device.type == MPT_DEVICE_CPU) { /* zeros without making the pages resident */
    zero_host(model->param_data, pbytes);
    zero_host(model->grad_data, pbytes);
    zero_host(model->buffer_data, bbytes);
  } else {
    MPT_CHECK(work_stream(model->device, &stream), fail);
    st = mpt_op_fill(stream, model->param_data, model->params.total, 0.0f);
    if (st == MPT_OK) st = mpt_op_fill(stream, model->grad_data, model->params.total, 0.0f);
    if (st == MPT_OK) st = mpt_op_fill(stream, model->buffer_data, model->buffers.total, 0.0f);
    MPT_CHECK(work_stream_finish(stream, st), fail);
  }
  model->finalized = 1;
  return MPT_OK;
fail:
  mpt_device_free(model->device, model->param_data);
  mpt_device_free(model->device, model->grad_data);
  mpt_device_free(model->device, model->buffer_data);
  model->param_data = model->grad_data = model->buffer_data = NULL;
  return st;
}

/* Fills host[offset .. offset+count) of every entry as its init kind says, drawing FAN_IN
 * values from rng in registration order. */
static void init_host(const entry_list *list, float *host, mpt_rng *rng) {
  for (int i = 0; i < list->count; i++) {
    const model_entry *e = &list->items[i];
    float *x = host + e->info.offset;
    switch (e->init) {
      case MPT_INIT_ZEROS:
        for (int64_t j = 0; j < e->info.count; j++) x[j] = 0.0f;
        break;
      case MPT_INIT_ONES:
        for (int64_t j = 0; j < e->info.count; j++) x[j] = 1.0f;
        break;
      case MPT_INIT_FAN_IN: {
        const float bound = (float)(1.0 / sqrt((double)e->fan_in));
        mpt_rng_fill_uniform(rng, x, e->info.count, -bound, bound);
        break;
      }
    }
  }
}

mpt_status mpt_model_init_params(mpt_model *model, uint64_t seed) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_init_params: NULL model");
  if (!model->finalized)
    return MPT_FAIL(MPT_ESTATE, "model_init_params: call mpt_model_finalize first");
  model->generation++;
  mpt__model_init_clear(model); /* every value written now */
  mpt_status st = MPT_OK;
  mpt_stream *stream = NULL;
  const int64_t n = model->params.total > model->buffers.total ? model->params.total
                                                               : model->buffers.total;
  float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!host)
    return MPT_FAIL(MPT_ENOMEM, "model_init_params: no host memory for %lld floats",
                    (long long)n);
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  MPT_CHECK(work_stream(model->device, &stream), done);
  const mpt_device cpu = mpt_device_cpu();
  init_host(&model->params, host, &rng);
  st = mpt_op_memcpy(stream, model->device, model->param_data, cpu, host,
                     (size_t)model->params.total * sizeof(float));
  /* The host buffer is reused: the parameter copy must have finished first. */
  if (st == MPT_OK && stream) st = mpt_stream_synchronize(stream, MODEL_SYNC_TIMEOUT_MS);
  if (st == MPT_OK) {
    init_host(&model->buffers, host, &rng);
    st = mpt_op_memcpy(stream, model->device, model->buffer_data, cpu, host,
                       (size_t)model->buffers.total * sizeof(float));
  }
  st = work_stream_finish(stream, st);
done:
  free(host);
  return st;
}

mpt_device mpt_model_device(const mpt_model *model) {
  return model ? model->device : mpt_device_cpu();
}
int mpt_model_num_params(const mpt_model *model) { return model ? model->params.count : 0; }
int mpt_model_num_buffers(const mpt_model *model) { return model ? model->buffers.count : 0; }
int64_t mpt_model_param_count(const mpt_model *model) {
  return model && model->finalized ? model->params.total : 0;
}
int64_t mpt_model_buffer_count(const mpt_model *model) {
  return model && model->finalized ? model->buffers.total : 0;
}

const mpt_param_info *mpt_model_param_info(const mpt_model *model, int index) {
  if (!model || index < 0 || index >= model->params.count) return NULL;
  return &model->params.items[index].info;
}

const mpt_param_info *mpt_model_buffer_info(const mpt_model *model, int index) {
  if (!model || index < 0 || index >= model->buffers.count) return NULL;
  return &model->buffers.items[index].info;
}

float *mpt_model_params(mpt_model *model) { return model ? model->param_data : NULL; }
float *mpt_model_grads(mpt_model *model) { return model ? model->grad_data : NULL; }
float *mpt_model_buffers(mpt_model *model) { return model ? model->buffer_data : NULL; }

static mpt_tensor entry_view(const mpt_model *model, const entry_list *list, float *base,
                             int index) {
  mpt_tensor t;
  memset(&t, 0, sizeof t);
  if (!model || !model->finalized || index < 0 || index >= list->count) return t;
  const mpt_param_info *info = &list->items[index].info;
  return mpt_tensor_view(base + info->offset, model->device, MPT_F32, info->ndim, info->shape);
}

mpt_tensor mpt_model_param(mpt_model *model, int index) {
  return entry_view(model, model ? &model->params : NULL, model ? model->param_data : NULL,
                    index);
}
mpt_tensor mpt_model_grad(mpt_model *model, int index) {
  return entry_view(model, model ? &model->params : NULL, model ? model->grad_data : NULL,
                    index);
}
mpt_tensor mpt_model_buffer(mpt_model *model, int index) {
  return entry_view(model, model ? &model->buffers : NULL, model ? model->buffer_data : NULL,
                    index);
}

mpt_status mpt_model_zero_grad(mpt_model *model, mpt_stream *stream) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_zero_grad: NULL model");
  if (!model->finalized)
    return MPT_FAIL(MPT_ESTATE, "model_zero_grad: call mpt_model_finalize first");
  mpt_device_type have = stream ? mpt_stream_device(stream).type : MPT_DEVICE_CPU;
  if (have != model->device.type)
    return MPT_FAIL(MPT_EINVAL, "model_zero_grad: a %s stream for a model on %s",
                    have == MPT_DEVICE_CPU ? "CPU (or NULL)" : "CUDA",
                    model->device.type == MPT_DEVICE_CPU ? "the CPU" : "CUDA");
  if (model->has_hooks && model->hooks.before_zero_grad)
    MPT_RETURN_IF(model->hooks.before_zero_grad(model->hooks.user));
  if (model->has_hooks && model->hooks.zero_grads)
    MPT_RETURN_IF(model->hooks.zero_grads(model->hooks.user, model->grad_data,
                                          model->params.total));
  else
    MPT_RETURN_IF(mpt_op_fill(stream, model->grad_data, model->params.total, 0.0f));
  model->grads_state = MPT_GRADS_ZERO;
  return MPT_OK;
}

mpt_grads_state mpt_model_grads_state(const mpt_model *model) {
  return model ? model->grads_state : MPT_GRADS_ZERO;
}

mpt_status mpt_model_consume_grads(mpt_model *model) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_consume_grads: NULL model");
  switch (model->grads_state) {
    case MPT_GRADS_READY:
      if (model->has_hooks && model->hooks.before_consume)
        MPT_RETURN_IF(model->hooks.before_consume(model->hooks.user));
      model->grads_state = MPT_GRADS_APPLIED;
      return MPT_OK;
    case MPT_GRADS_ZERO:
      return MPT_FAIL(MPT_ESTATE, "optimizer step: no backward since the gradients were zeroed "
                      "(call mpt_tape_backward on the loss first)");
    case MPT_GRADS_PENDING:
      return MPT_FAIL(MPT_ESTATE, "optimizer step: a training forward whose backward has not "
                      "finished (mpt_tape_backward was not called on its loss, or it failed)");
    case MPT_GRADS_APPLIED:
      break;
  }
  return MPT_FAIL(MPT_ESTATE, "optimizer step: these gradients were already used by a step "
                  "(zero_grad, forward and backward come first)");
}

void mpt__model_backward_done(mpt_model *model, mpt_status status) {
  if (model && status == MPT_OK) model->grads_state = MPT_GRADS_READY;
}

uint64_t mpt_model_generation(const mpt_model *model) { return model ? model->generation : 0; }

mpt_status mpt_model_set_hooks(mpt_model *model, const mpt_model_hooks *hooks) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_set_hooks: NULL model");
  if (!hooks) {
    model->has_hooks = 0;
    memset(&model->hooks, 0, sizeof model->hooks);
    return MPT_OK;
  }
  if (model->has_hooks && model->hooks.user != hooks->user)
    return MPT_FAIL(MPT_ESTATE, "model_set_hooks: the model is already wrapped (one DDP "
                    "wrapper per model; free the first one)");
  model->hooks = *hooks;
  model->has_hooks = 1;
  return MPT_OK;
}

const mpt_model_hooks *mpt_model_get_hooks(const mpt_model *model) {
  return model && model->has_hooks ? &model->hooks : NULL;
}

void mpt_model_set_training(mpt_model *model, int training) {
  if (model) model->training = training != 0;
}

int mpt_model_training(const mpt_model *model) { return model ? model->training : 0; }

mpt_status mpt_model_forward(mpt_model *model, mpt_tape *tape, mpt_var *input,
                             mpt_var **output) {
  if (!model || !tape || !input || !output)
    return MPT_FAIL(MPT_EINVAL, "model_forward: NULL model, tape, input or output");
  if (!model->finalized)
    return MPT_FAIL(MPT_ESTATE, "model_forward: call mpt_model_finalize first");
  if (!model->forward)
    return MPT_FAIL(MPT_ESTATE, "model_forward: no forward function (mpt_model_set_forward)");
  if (mpt_tape_model(tape) != model)
    return MPT_FAIL(MPT_EINVAL, "model_forward: the tape belongs to another model");
  if (model->unit_done)
    return MPT_FAIL(MPT_ESTATE, "model_forward: the parameters' initialisation is pending (%d "
                    "unit(s) left: mpt_model_init_unit, or wrap the model with mpt_ddp_init)",
                    model->units_left);
  *output = NULL;
  if (model->training && mpt_tape_grad_enabled(tape)) { /* a training forward */
    if (model->grads_state == MPT_GRADS_APPLIED)
      return MPT_FAIL(MPT_ESTATE, "model_forward: the gradients of the last optimizer step were "
                      "not zeroed (call mpt_model_zero_grad before the forward)");
    if (model->has_hooks && model->hooks.before_forward && mpt_tape_model_hooks(tape))
      MPT_RETURN_IF(model->hooks.before_forward(model->hooks.user, tape));
    model->grads_state = MPT_GRADS_PENDING;
  }
  MPT_RETURN_IF(mpt__tape_profile_start_forward(tape));
  return model->forward(model, tape, model->ctx, input, output);
}

/* Copies every entry of `from` into `to` (names duplicated). */
static mpt_status entry_list_copy(entry_list *to, const entry_list *from) {
  if (from->count == 0) return MPT_OK;
  to->items = calloc((size_t)from->count, sizeof *to->items);
  if (!to->items) return MPT_FAIL(MPT_ENOMEM, "model_replicate: out of host memory");
  to->capacity = from->count;
  for (int i = 0; i < from->count; i++) {
    to->items[i] = from->items[i];
    to->items[i].info.name = strdup(from->items[i].info.name);
    if (!to->items[i].info.name)
      return MPT_FAIL(MPT_ENOMEM, "model_replicate: out of host memory");
    to->count = i + 1;
  }
  return MPT_OK;
}

mpt_status mpt_model_replicate(const mpt_model *src, mpt_device device, mpt_model **replica) {
  if (!src || !replica) return MPT_FAIL(MPT_EINVAL, "model_replicate: NULL source or output");
  *replica = NULL;
  if (!src->finalized)
    return MPT_FAIL(MPT_ESTATE, "model_replicate: the source model is not finalised");
  mpt_status st = MPT_OK;
  mpt_model *m = NULL;
  mpt_stream *stream = NULL;
  MPT_CHECK(mpt_model_init(&m, device), fail);
  MPT_CHECK(entry_list_copy(&m->params, &src->params), fail);
  MPT_CHECK(entry_list_copy(&m->buffers, &src->buffers), fail);
  MPT_CHECK(mpt_model_finalize(m), fail);
  m->training = src->training;
  /* The copy runs on a stream of whichever side is not the CPU (the CPU backend cannot touch
   * device memory); CPU to CPU needs none. */
  MPT_CHECK(work_stream(device.type != MPT_DEVICE_CPU ? device : src->device, &stream), fail);
  st = mpt_op_memcpy(stream, device, m->param_data, src->device, src->param_data,
                     (size_t)src->params.total * sizeof(float));
  if (st == MPT_OK)
    st = mpt_op_memcpy(stream, device, m->buffer_data, src->device, src->buffer_data,
                       (size_t)src->buffers.total * sizeof(float));
  MPT_CHECK(work_stream_finish(stream, st), fail);
  m->forward = src->forward;
  m->ctx = src->ctx;
  m->free_ctx = NULL; /* shared, read-only: the source frees it */
  *replica = m;
  return MPT_OK;
fail:
  mpt_model_free(m);
  return st;
}

/* ---- initialisation by unit ---- */

mpt_status mpt__model_defer_init(mpt_model *model, mpt__model_range_init fn) {
  if (!model || !fn || !model->finalized)
    return MPT_FAIL(MPT_EINVAL, "model: deferred initialisation of a model not finalised");
  const int n = mpt_model_units(model, NULL);
  if (n < 1) return MPT_FAIL(MPT_EINVAL, "model: deferred initialisation without parameters");
  free(model->unit_done);
  if (!(model->unit_done = calloc((size_t)n, 1)))
    return MPT_FAIL(MPT_ENOMEM, "model: %d units", n);
  model->range_init = fn;
  model->units_left = n;
  return MPT_OK;
}

void mpt__model_init_clear(mpt_model *model) {
  if (!model) return;
  free(model->unit_done);
  model->unit_done = NULL;
  model->units_left = 0;
}

int mpt_model_init_pending(const mpt_model *model) {
  return model && model->unit_done ? model->units_left : 0;
}

mpt_status mpt_model_init_unit(mpt_model *model, int unit) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "model_init_unit: NULL model");
  if (!model->unit_done)
    return MPT_FAIL(MPT_ESTATE, "model_init_unit: the model's initialisation is not pending "
                    "(its constructor initialised it)");
  if (unit < 0 || unit >= model->nunits)
    return MPT_FAIL(MPT_EINVAL, "model_init_unit: unit %d of %d", unit, model->nunits);
  const int first = model->unit_first[unit];
  const int end = unit + 1 < model->nunits ? model->unit_first[unit + 1] : model->params.count;
  for (int p = first; p < end; p++) { /* the registered kinds (zeros, ones), then the model's */
    const model_entry *e = &model->params.items[p];
    if (e->init == MPT_INIT_FAN_IN)
      return MPT_FAIL(MPT_ENOTSUP, "model_init_unit: parameter '%s' draws its values in "
                      "mpt_model_init_params' order", e->info.name);
    const float v = e->init == MPT_INIT_ONES ? 1.0f : 0.0f;
    float *x = model->param_data + e->info.offset;
    for (int64_t j = 0; j < e->info.count; j++) x[j] = v;
  }
  MPT_RETURN_IF(model->range_init(model->ctx, model, first, end));
  if (!model->unit_done[unit]) {
    model->unit_done[unit] = 1;
    if (--model->units_left == 0) mpt__model_init_clear(model);
  }
  return MPT_OK;
}
