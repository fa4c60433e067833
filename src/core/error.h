/* Internal error helpers. The check and propagate macros (MPT_FAIL, MPT_RETURN_IF, MPT_CHECK)
 * are public (include/mpitrain/core.h) since users' ops and programs need them too; this header
 * keeps the internal name of the recording function for the backends that pass their own
 * file:line (the CUDA, NCCL and MPI check macros). */
#ifndef MPT_CORE_ERROR_H
#define MPT_CORE_ERROR_H

#include "mpitrain/core.h"

#define mpt__error mpt_error_set_at

#endif
