/* The backend registry (the only place that knows which device backends were built), device
 * helpers, and the public stream/event wrappers that dispatch through the table. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "mpitrain/core.h"

const mpt__device_backend *mpt__backend_get(mpt_device_type type) {
  switch (type) {
    case MPT_DEVICE_CPU:
      return &mpt__cpu_backend;
    case MPT_DEVICE_CUDA:
#ifdef MPT_HAVE_CUDA
      return &mpt__cuda_backend;
#else
      return NULL;
#endif
  }
  return NULL;
}

const mpt__device_backend *mpt__backend_of_stream(const mpt_stream *stream) {
  if (!stream) return &mpt__cpu_backend;
  return mpt__backend_get(((const mpt__stream_header *)stream)->device.type);
}

static const mpt__device_backend *backend_of_event(const mpt_event *event) {
  return mpt__backend_get(((const mpt__event_header *)event)->device.type);
}

mpt_device mpt_device_cpu(void) { return (mpt_device){MPT_DEVICE_CPU, 0}; }

int mpt_device_count(mpt_device_type type) {
  const mpt__device_backend *b = mpt__backend_get(type);
  return b ? b->count() : 0;
}

int mpt_device_available(mpt_device_type type) { return mpt_device_count(type) > 0; }

mpt_status mpt_device_parse(const char *text, mpt_device *device) {
  if (!text || !device) return MPT_FAIL(MPT_EINVAL, "no device given");
  mpt_device d = {MPT_DEVICE_CPU, 0};
  const char *rest;
  if (strncmp(text, "cpu", 3) == 0) {
    rest = text + 3;
  } else if (strncmp(text, "cuda", 4) == 0) {
    d.type = MPT_DEVICE_CUDA;
    rest = text + 4;
  } else {
    return MPT_FAIL(MPT_EINVAL, "unknown device '%s' (expected cpu, cpu:N, cuda or cuda:N)",
                    text);
  }
  if (*rest == ':') {
    char *end;
    long v = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || *end != '\0' || v < 0 || v > 1 << 20)
      return MPT_FAIL(MPT_EINVAL, "bad device index in '%s'", text);
    d.index = (int)v;
  } else if (*rest != '\0') {
    return MPT_FAIL(MPT_EINVAL, "unknown device '%s' (expected cpu, cpu:N, cuda or cuda:N)",
                    text);
  }
  *device = d;
  return MPT_OK;
}

const char *mpt_device_str(mpt_device device, char *buf, size_t nbytes) {
  snprintf(buf, nbytes, "%s:%d", device.type == MPT_DEVICE_CUDA ? "cuda" : "cpu", device.index);
  return buf;
}

mpt_status mpt_device_alloc(mpt_device device, size_t nbytes, void **ptr) {
  if (!ptr) return MPT_FAIL(MPT_EINVAL, "NULL output pointer");
  *ptr = NULL;
  if (nbytes == 0) return MPT_OK;
  const mpt__device_backend *b = mpt__backend_get(device.type);
  if (!b) return MPT_FAIL(MPT_ENOTSUP, "device type %d was not built", (int)device.type);
  return b->alloc(device.index, nbytes, ptr);
}

void mpt_device_free(mpt_device device, void *ptr) {
  if (!ptr) return;
  const mpt__device_backend *b = mpt__backend_get(device.type);
  if (b) b->free(device.index, ptr);
}

mpt_status mpt_device_set_current(mpt_device device) {
  const mpt__device_backend *b = mpt__backend_get(device.type);
  if (!b) return MPT_FAIL(MPT_ENOTSUP, "device type %d was not built", (int)device.type);
  return b->set_current ? b->set_current(device.index) : MPT_OK;
}

/* ---- streams and events ---- */

mpt_status mpt_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind) {
  if (!stream) return MPT_FAIL(MPT_EINVAL, "NULL stream pointer");
  *stream = NULL;
  const mpt__device_backend *b = mpt__backend_get(device.type);
  if (!b) return MPT_FAIL(MPT_ENOTSUP, "device type %d was not built", (int)device.type);
  return b->stream_init(stream, device, kind);
}

void mpt_stream_free(mpt_stream *stream) {
  if (stream) mpt__backend_of_stream(stream)->stream_free(stream);
}

void mpt_stream_abandon(mpt_stream *stream) {
  if (!stream) return;
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  if (b && b->stream_abandon) b->stream_abandon(stream);
  /* else: leaked, as documented */
}

mpt_device mpt_stream_device(const mpt_stream *stream) {
  return stream ? ((const mpt__stream_header *)stream)->device : mpt_device_cpu();
}

mpt_status mpt_stream_launch_host(mpt_stream *stream, mpt_host_fn fn, void *arg) {
  if (!fn) return MPT_FAIL(MPT_EINVAL, "NULL host function");
  if (!stream) return fn(arg);
  return mpt__backend_of_stream(stream)->stream_launch_host(stream, fn, arg);
}

mpt_status mpt__stream_launch_host_kept(mpt_stream *stream, mpt_host_fn fn, void *arg,
                                        mpt__keeper_fn keeper, void *keeper_arg) {
  if (!fn || !keeper) return MPT_FAIL(MPT_EINVAL, "NULL host function or keeper");
  if (!stream) return fn(arg);
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  if (!b->stream_launch_host_kept) return b->stream_launch_host(stream, fn, arg);
  return b->stream_launch_host_kept(stream, fn, arg, keeper, keeper_arg);
}

mpt_status mpt_stream_synchronize(mpt_stream *stream, double timeout_ms) {
  if (!stream) return MPT_OK;
  return mpt__backend_of_stream(stream)->stream_synchronize(stream, timeout_ms);
}

mpt_status mpt_stream_error(const mpt_stream *stream) {
  if (!stream) return MPT_OK;
  return mpt__backend_of_stream(stream)->stream_error(stream);
}

mpt_status mpt_stream_wait_event(mpt_stream *stream, mpt_event *event, double timeout_ms) {
  if (!stream || !event) return MPT_FAIL(MPT_EINVAL, "NULL stream or event");
  return mpt__backend_of_stream(stream)->stream_wait_event(stream, event, timeout_ms);
}

mpt_status mpt_event_init(mpt_event **event, mpt_device device) {
  if (!event) return MPT_FAIL(MPT_EINVAL, "NULL event pointer");
  *event = NULL;
  const mpt__device_backend *b = mpt__backend_get(device.type);
  if (!b) return MPT_FAIL(MPT_ENOTSUP, "device type %d was not built", (int)device.type);
  return b->event_init(event, device);
}

void mpt_event_free(mpt_event *event) {
  if (event) backend_of_event(event)->event_free(event);
}

mpt_status mpt_event_record(mpt_event *event, mpt_stream *stream) {
  if (!event || !stream) return MPT_FAIL(MPT_EINVAL, "NULL stream or event");
  return backend_of_event(event)->event_record(event, stream);
}

mpt_status mpt_event_synchronize(mpt_event *event, double timeout_ms) {
  if (!event) return MPT_FAIL(MPT_EINVAL, "NULL event");
  return backend_of_event(event)->event_synchronize(event, timeout_ms);
}

mpt_status mpt__event_capture(mpt_event *event, uint64_t *token) {
  *token = 0;
  const mpt__device_backend *b = backend_of_event(event);
  return b->event_capture ? b->event_capture(event, token) : MPT_OK;
}

mpt_status mpt__event_wait_captured(mpt_event *event, uint64_t token, double timeout_ms) {
  const mpt__device_backend *b = backend_of_event(event);
  if (!b->event_wait_captured) return mpt_event_synchronize(event, timeout_ms);
  return b->event_wait_captured(event, token, timeout_ms);
}

int mpt_event_query(mpt_event *event) {
  return event ? backend_of_event(event)->event_query(event) : 1;
}

mpt_status mpt_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms) {
  if (!start || !end || !ms) return MPT_FAIL(MPT_EINVAL, "NULL event or output");
  return backend_of_event(start)->event_elapsed_ms(start, end, ms);
}
