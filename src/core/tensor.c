/* Tensors: dense, row-major, contiguous; owned or views. */
#include <stdio.h>
#include <string.h>

#include "mpitrain/core.h"

size_t mpt_dtype_size(mpt_dtype dtype) {
  switch (dtype) {
    case MPT_F32:
    case MPT_I32:
      return 4;
    case MPT_U8:
      return 1;
    case MPT_BF16:
      return 2;
  }
  return 0;
}

const char *mpt_dtype_name(mpt_dtype dtype) {
  switch (dtype) {
    case MPT_F32:
      return "float32";
    case MPT_I32:
      return "int32";
    case MPT_U8:
      return "uint8";
    case MPT_BF16:
      return "bfloat16";
  }
  return "unknown";
}

static mpt_status tensor_shape(mpt_tensor *t, mpt_dtype dtype, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > MPT_MAX_DIMS)
    return MPT_FAIL(MPT_EINVAL, "tensor rank %d outside [0, %d]", ndim, MPT_MAX_DIMS);
  if (mpt_dtype_size(dtype) == 0) return MPT_FAIL(MPT_EINVAL, "unknown dtype %d", (int)dtype);
  t->dtype = dtype;
  t->ndim = ndim;
  t->count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return MPT_FAIL(MPT_EINVAL, "negative extent %lld", (long long)shape[i]);
    t->shape[i] = shape[i];
    if (__builtin_mul_overflow(t->count, shape[i], &t->count))
      return MPT_FAIL(MPT_EINVAL, "tensor of %d dimensions: the element count overflows 64 bits",
                      ndim);
  }
  int64_t nbytes;
  if (__builtin_mul_overflow(t->count, (int64_t)mpt_dtype_size(dtype), &nbytes))
    return MPT_FAIL(MPT_EINVAL, "tensor of %lld %s elements: the size overflows 64 bits",
                    (long long)t->count, mpt_dtype_name(dtype));
  for (int i = ndim; i < MPT_MAX_DIMS; i++) t->shape[i] = 1;
  return MPT_OK;
}

mpt_status mpt_tensor_init(mpt_tensor *t, mpt_device device, mpt_dtype dtype, int ndim,
                           const int64_t *shape) {
  if (!t) return MPT_FAIL(MPT_EINVAL, "NULL tensor");
  memset(t, 0, sizeof *t);
  MPT_RETURN_IF(tensor_shape(t, dtype, ndim, shape));
  t->device = device;
  MPT_RETURN_IF(mpt_device_alloc(device, mpt_tensor_nbytes(t), &t->data));
  t->owns_data = 1;
  return MPT_OK;
}

mpt_tensor mpt_tensor_view(void *data, mpt_device device, mpt_dtype dtype, int ndim,
                           const int64_t *shape) {
  mpt_tensor t;
  memset(&t, 0, sizeof t);
  if (tensor_shape(&t, dtype, ndim, shape) != MPT_OK) memset(&t, 0, sizeof t);
  t.data = data;
  t.device = device;
  return t;
}

void mpt_tensor_free(mpt_tensor *t) {
  if (!t) return;
  if (t->owns_data) mpt_device_free(t->device, t->data);
  memset(t, 0, sizeof *t);
}

size_t mpt_tensor_nbytes(const mpt_tensor *t) {
  return (size_t)t->count * mpt_dtype_size(t->dtype);
}

int mpt_tensor_same_shape(const mpt_tensor *a, const mpt_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

const char *mpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t nbytes) {
  size_t used = 0;
  used += (size_t)snprintf(buf + used, nbytes - used, "[");
  for (int i = 0; i < ndim && used < nbytes; i++)
    used += (size_t)snprintf(buf + used, nbytes - used, "%s%lld", i ? ", " : "",
                             (long long)shape[i]);
  if (used < nbytes) snprintf(buf + used, nbytes - used, "]");
  return buf;
}
