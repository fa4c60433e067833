/* dp internals shared by src/dp/devices.c and src/dp/dp.c. */
#ifndef MPT_DP_IMPL_H
#define MPT_DP_IMPL_H

#include "mpitrain/dp.h"

/* MPT_OK if `d` exists (CPU index below MPT_DP_MAX_DEVICES; CUDA built, present, ordinal in
 * range); else MPT_EINVAL naming the device and `text` (the list it came from). */
mpt_status mpt__dp_check_device(mpt_device d, const char *text);
/* Every device exists, all of one type, none twice. MPT_EINVAL naming `text` otherwise. */
mpt_status mpt__dp_check_list(const mpt_device *devices, int n, const char *text);

#endif
