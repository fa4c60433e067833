/* A small strict JSON parser (RFC 8259) for the headers of safetensors files and the
 * config.json beside them: a tree of values, built from a NUL-terminated buffer. Refused:
 * trailing commas, comments, control characters in strings, invalid escapes or UTF-16
 * surrogates, a key given twice in one object (named), nesting past 64 levels, bytes after the
 * value. Numbers keep both a double and, when integral and within int64, the exact integer.
 * Internal (mpt__); no state; the calling thread. */
#ifndef MPT_CKPT_JSON_H
#define MPT_CKPT_JSON_H

#include <stdint.h>

#include "mpitrain/core.h"

enum { MPT__JSON_NULL, MPT__JSON_BOOL, MPT__JSON_NUMBER, MPT__JSON_STRING, MPT__JSON_ARRAY,
       MPT__JSON_OBJECT };

typedef struct mpt__json {
  int type;           /* MPT__JSON_* */
  int is_int;         /* NUMBER: an integer literal (no fraction, no exponent) within int64 */
  int64_t i;          /* NUMBER with is_int; BOOL: 0 or 1 */
  double d;           /* NUMBER */
  char *s;            /* STRING: the decoded UTF-8 text, NUL-terminated (no NUL inside) */
  int n;              /* ARRAY, OBJECT: members */
  struct mpt__json *items; /* ARRAY, OBJECT: [n] values */
  char **keys;        /* OBJECT: [n] keys, in the order written */
} mpt__json;

/* Parses text[0..len) (text[len] must be 0) into a tree *out (free with mpt__json_free).
 * Errors: MPT_EFORMAT "<what>: invalid JSON at byte K: <why>"; MPT_ENOMEM. */
mpt_status mpt__json_parse(const char *text, int64_t len, const char *what, mpt__json **out);
/* The member `key` of an object, or NULL (also when v is not an object). */
const mpt__json *mpt__json_get(const mpt__json *v, const char *key);
void mpt__json_free(mpt__json *v);

#endif
