/* Data sources: a dataset given as callbacks (count, sample shape and dtype, "read sample i"),
 * the interface the loader reads through; an in-memory mpt_dataset is one implementation.
 *
 * Invariants: a source's description was validated at init and never changes; input_nbytes is
 * the product of its extents times the dtype size and fits in 2^31. mpt_data_source_read is
 * reentrant (it keeps no state), so one source may feed several loaders; whether the user's
 * callback is reentrant is the user's business (data.h says so). Runs on the caller's thread
 * (the loader's prefetch thread, usually). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/data.h"

#define SOURCE_MAX_INPUT_NBYTES (1LL << 31)

struct mpt_data_source {
  mpt_data_source_desc desc;
  int64_t input_nbytes;
};

mpt_data_source_desc mpt_data_source_desc_default(void) {
  mpt_data_source_desc d;
  memset(&d, 0, sizeof d);
  d.input_dtype = MPT_F32;
  d.label_count = 1;
  return d;
}

/* Checks the description; writes the input size. */
static mpt_status source_check(const mpt_data_source_desc *d, int64_t *nbytes) {
  if (!d->read) return MPT_FAIL(MPT_EINVAL, "data source: the read callback is NULL");
  if (d->count < 0)
    return MPT_FAIL(MPT_EINVAL, "data source: count %lld < 0", (long long)d->count);
  if (d->input_dtype != MPT_F32 && d->input_dtype != MPT_I32 && d->input_dtype != MPT_U8)
    return MPT_FAIL(MPT_EINVAL, "data source: input_dtype %d is not MPT_F32, MPT_I32 or MPT_U8",
                    (int)d->input_dtype);
  if (d->input_ndim < 1 || d->input_ndim > MPT_DATA_MAX_DIMS)
    return MPT_FAIL(MPT_EINVAL, "data source: input_ndim %d outside [1, %d]", d->input_ndim,
                    MPT_DATA_MAX_DIMS);
  int64_t n = (int64_t)mpt_dtype_size(d->input_dtype);
  for (int i = 0; i < d->input_ndim; i++) {
    if (d->input_shape[i] < 1)
      return MPT_FAIL(MPT_EINVAL, "data source: input_shape[%d] is %lld (must be >= 1)", i,
                      (long long)d->input_shape[i]);
    if (d->input_shape[i] > SOURCE_MAX_INPUT_NBYTES / n)
      return MPT_FAIL(MPT_EINVAL, "data source: one sample's input is over %lld bytes",
                      SOURCE_MAX_INPUT_NBYTES);
    n *= d->input_shape[i];
  }
  if (d->label_count < 1 || d->label_count > SOURCE_MAX_INPUT_NBYTES / 4)
    return MPT_FAIL(MPT_EINVAL, "data source: label_count %lld (must be >= 1)",
                    (long long)d->label_count);
  if (d->num_classes < 0)
    return MPT_FAIL(MPT_EINVAL, "data source: num_classes %d < 0", d->num_classes);
  *nbytes = n;
  return MPT_OK;
}

mpt_status mpt_data_source_init(mpt_data_source **source, const mpt_data_source_desc *desc) {
  mpt_status st;
  if (!source || !desc)
    return MPT_FAIL(MPT_EINVAL, "mpt_data_source_init: source or desc is NULL");
  *source = NULL;
  int64_t nbytes = 0;
  mpt_data_source *s = NULL;
  MPT_CHECK(source_check(desc, &nbytes), fail);
  s = calloc(1, sizeof *s);
  if (!s) {
    st = MPT_FAIL(MPT_ENOMEM, "data source: out of memory");
    goto fail;
  }
  s->desc = *desc;
  s->input_nbytes = nbytes;
  *source = s;
  return MPT_OK;
fail:
  if (desc->free_user) desc->free_user(desc->user);
  return st;
}

void mpt_data_source_free(mpt_data_source *source) {
  if (!source) return;
  if (source->desc.free_user) source->desc.free_user(source->desc.user);
  free(source);
}

const mpt_data_source_desc *mpt_data_source_get_desc(const mpt_data_source *source) {
  return source ? &source->desc : NULL;
}

int64_t mpt_data_source_input_nbytes(const mpt_data_source *source) {
  return source ? source->input_nbytes : 0;
}

mpt_status mpt_data_source_read(const mpt_data_source *source, int64_t index, void *input,
                                int32_t *label) {
  if (!source || !input || !label)
    return MPT_FAIL(MPT_EINVAL, "mpt_data_source_read: NULL source or buffer");
  const mpt_data_source_desc *d = &source->desc;
  if (index < 0 || index >= d->count)
    return MPT_FAIL(MPT_EINVAL, "data source: sample %lld outside [0, %lld)", (long long)index,
                    (long long)d->count);
  /* Clear the detail first so that a callback that fails without recording one is not
   * reported with a stale message of an earlier error on this thread. */
  mpt_error_clear();
  mpt_status st = d->read(d->user, index, input, label);
  if (st != MPT_OK) {
    char detail[384];
    const char *e = mpt_last_error();
    snprintf(detail, sizeof detail, "%s", e[0] ? e : "(the callback gave no detail)");
    if ((int)st > 0) {
      return MPT_FAIL(MPT_EIO, "data source: reading sample %lld failed: the callback returned "
                      "%d, not a status: %s", (long long)index, (int)st, detail);
    }
    return MPT_FAIL(st, "data source: reading sample %lld failed (%s): %s", (long long)index,
                    mpt_status_name(st), detail);
  }
  if (d->num_classes > 0) {
    for (int64_t j = 0; j < d->label_count; j++) {
      if (label[j] < 0 || label[j] >= d->num_classes)
        return MPT_FAIL(MPT_EFORMAT,
                        "data source: sample %lld: label %lld is %d, expected 0 to %d",
                        (long long)index, (long long)j, (int)label[j], d->num_classes - 1);
    }
  }
  return MPT_OK;
}

/* ---- An in-memory dataset as a source ---- */

static mpt_status dataset_read(void *user, int64_t index, void *input, int32_t *label) {
  const mpt_dataset *ds = user;
  const int64_t n = mpt_dataset_sample_count(ds);
  memcpy(input, (const float *)ds->images.data + index * n, (size_t)n * sizeof(float));
  *label = ((const int32_t *)ds->labels.data)[index];
  return MPT_OK;
}

mpt_status mpt_data_source_init_dataset(mpt_data_source **source, const mpt_dataset *ds) {
  if (!source || !ds)
    return MPT_FAIL(MPT_EINVAL, "mpt_data_source_init_dataset: source or dataset is NULL");
  *source = NULL;
  if (ds->count > 0 && (!ds->images.data || !ds->labels.data))
    return MPT_FAIL(MPT_EINVAL, "mpt_data_source_init_dataset: the dataset has no data");
  mpt_data_source_desc d = mpt_data_source_desc_default();
  d.count = ds->count;
  d.input_dtype = MPT_F32;
  d.input_ndim = 3;
  d.input_shape[0] = ds->count > 0 ? ds->channels : (ds->channels > 0 ? ds->channels : 1);
  d.input_shape[1] = ds->count > 0 ? ds->height : (ds->height > 0 ? ds->height : 1);
  d.input_shape[2] = ds->count > 0 ? ds->width : (ds->width > 0 ? ds->width : 1);
  d.label_count = 1;
  d.num_classes = 0; /* checked when the dataset was loaded; callers may overwrite labels */
  d.read = dataset_read;
  d.user = (void *)ds;
  return mpt_data_source_init(source, &d);
}
