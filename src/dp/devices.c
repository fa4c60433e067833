/* DataParallel device lists and the scatter rule (include/mpitrain/dp.h): parsing "cpu:4",
 * "cpu:0,cpu:1", "cpu:0,1,2", "cuda:0,1", with the checks every list must pass (no device
 * twice, one device type, every device present), and mpt_dp_split.
 *
 * Pure functions of their arguments (and of mpt_device_count for CUDA); any thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "mpitrain/core.h"
#include "dp/dp_impl.h"

int mpt_dp_split(int64_t batch, int ndevices, int64_t *counts) {
  if (batch < 1 || ndevices < 1 || !counts) return 0;
  int m = batch < (int64_t)ndevices ? (int)batch : ndevices;
  int64_t base = batch / m, extra = batch % m;
  for (int k = 0; k < m; k++) counts[k] = base + (k < extra ? 1 : 0);
  return m;
}

/* Parses a non-negative decimal index [begin, end) into *value. 0 on success. */
static int parse_index(const char *begin, const char *end, long *value) {
  if (begin == end || end - begin > 9) return -1;
  long v = 0;
  for (const char *p = begin; p < end; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
  }
  *value = v;
  return 0;
}

mpt_status mpt__dp_check_device(mpt_device d, const char *text) {
  char name[32];
  mpt_device_str(d, name, sizeof name);
  if (d.type == MPT_DEVICE_CPU) {
    if (d.index < 0 || d.index >= MPT_DP_MAX_DEVICES)
      return MPT_FAIL(MPT_EINVAL, "device list '%s': %s does not exist (CPU devices are cpu:0 .. "
                      "cpu:%d)", text, name, MPT_DP_MAX_DEVICES - 1);
    return MPT_OK;
  }
  if (d.type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "device list '%s': unknown device type %d", text, (int)d.type);
  int count = mpt_device_count(MPT_DEVICE_CUDA);
  if (count == 0)
    return MPT_FAIL(MPT_EINVAL, "device list '%s': %s does not exist: %s", text, name,
                    mpt__backend_get(MPT_DEVICE_CUDA) ? "no CUDA device is visible"
                                                      : "this build has no CUDA backend");
  if (d.index < 0 || d.index >= count)
    return MPT_FAIL(MPT_EINVAL, "device list '%s': %s does not exist (%d CUDA device%s visible: "
                    "cuda:0 .. cuda:%d)", text, name, count, count == 1 ? "" : "s", count - 1);
  return MPT_OK;
}

mpt_status mpt__dp_check_list(const mpt_device *devices, int n, const char *text) {
  for (int i = 0; i < n; i++) {
    MPT_RETURN_IF(mpt__dp_check_device(devices[i], text));
    if (devices[i].type != devices[0].type) {
      char a[32], b[32];
      return MPT_FAIL(MPT_EINVAL, "device list '%s': %s and %s are of different types; one "
                      "DataParallel drives devices of one type", text,
                      mpt_device_str(devices[0], a, sizeof a),
                      mpt_device_str(devices[i], b, sizeof b));
    }
    for (int j = 0; j < i; j++)
      if (devices[j].type == devices[i].type && devices[j].index == devices[i].index) {
        char a[32];
        return MPT_FAIL(MPT_EINVAL, "device list '%s': %s is named twice (items %d and %d)",
                        text, mpt_device_str(devices[i], a, sizeof a), j + 1, i + 1);
      }
  }
  return MPT_OK;
}

mpt_status mpt_dp_parse_devices(const char *text, mpt_device *devices, int max, int *n) {
  if (n) *n = 0;
  if (!text || !devices || !n) return MPT_FAIL(MPT_EINVAL, "dp_parse_devices: NULL argument");
  if (max < 1) return MPT_FAIL(MPT_EINVAL, "dp_parse_devices: max = %d must be >= 1", max);
  if (text[0] == '\0') return MPT_FAIL(MPT_EINVAL, "empty device list (e.g. cpu:2 or cuda:0,1)");
  int count = 0, single = strchr(text, ',') == NULL;
  int have_type = 0;
  mpt_device_type type = MPT_DEVICE_CPU;
  const char *p = text;
  for (;;) {
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    size_t len = (size_t)(end - p);
    if (len == 0) return MPT_FAIL(MPT_EINVAL, "device list '%s': empty item", text);
    const char *num = p;
    int has_index = 1;
    if (len >= 3 && strncmp(p, "cpu", 3) == 0 && (len == 3 || p[3] == ':')) {
      type = MPT_DEVICE_CPU;
      have_type = 1;
      num = p + 4;
      has_index = len > 3;
    } else if (len >= 4 && strncmp(p, "cuda", 4) == 0 && (len == 4 || p[4] == ':')) {
      type = MPT_DEVICE_CUDA;
      have_type = 1;
      num = p + 5;
      has_index = len > 4;
    } else if (!have_type || (*p < '0' || *p > '9')) {
      return MPT_FAIL(MPT_EINVAL, "device list '%s': unknown device '%.*s' (expected cpu:N, "
                      "cuda:N, or a bare index after one of them)", text, (int)len, p);
    }
    long index = 0;
    if (has_index && parse_index(num, end, &index) != 0)
      return MPT_FAIL(MPT_EINVAL, "device list '%s': bad index in '%.*s'", text, (int)len, p);

    if (single && type == MPT_DEVICE_CPU && has_index && index >= 1) {
      /* "cpu:K" alone: K devices. */
      if (index > MPT_DP_MAX_DEVICES || index > max)
        return MPT_FAIL(MPT_EINVAL, "device list '%s': %ld CPU devices, at most %d", text, index,
                        max < MPT_DP_MAX_DEVICES ? max : MPT_DP_MAX_DEVICES);
      for (int k = 0; k < (int)index; k++) devices[k] = (mpt_device){MPT_DEVICE_CPU, k};
      count = (int)index;
    } else if (single && type == MPT_DEVICE_CUDA && !has_index) {
      /* "cuda" alone: every visible device. */
      int visible = mpt_device_count(MPT_DEVICE_CUDA);
      if (visible == 0) {
        MPT_RETURN_IF(mpt__dp_check_device((mpt_device){MPT_DEVICE_CUDA, 0}, text));
      }
      if (visible > max)
        return MPT_FAIL(MPT_EINVAL, "device list '%s': %d CUDA devices, at most %d", text,
                        visible, max);
      for (int k = 0; k < visible; k++) devices[k] = (mpt_device){MPT_DEVICE_CUDA, k};
      count = visible;
    } else {
      if (count == max)
        return MPT_FAIL(MPT_EINVAL, "device list '%s': more than %d devices", text, max);
      devices[count++] = (mpt_device){type, (int)index};
    }
    if (*end == '\0') break;
    p = end + 1;
  }
  MPT_RETURN_IF(mpt__dp_check_list(devices, count, text));
  *n = count;
  return MPT_OK;
}
