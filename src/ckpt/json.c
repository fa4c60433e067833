/* The strict JSON parser of json.h: recursive descent over a NUL-terminated buffer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"

#define JSON_MAX_DEPTH 64

typedef struct parser {
  const char *text, *p, *end, *what;
  char why[160];
} parser;

static int fail(parser *ps, const char *why) {
  if (!ps->why[0]) snprintf(ps->why, sizeof ps->why, "%s", why);
  return -1;
}

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static void value_free(mpt__json *v) {
  if (!v) return;
  free(v->s);
  for (int i = 0; i < v->n; i++) {
    value_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
}

void mpt__json_free(mpt__json *v) {
  value_free(v);
  free(v);
}

static int hex4(parser *ps, unsigned *u) {
  *u = 0;
  for (int k = 0; k < 4; k++) {
    char c = ps->p < ps->end ? *ps->p++ : 0;
    int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (h < 0) return fail(ps, "a \\u escape needs 4 hex digits");
    *u = *u * 16 + (unsigned)h;
  }
  return 0;
}

/* Parses a string at ps->p (the opening quote) into a malloc'd UTF-8 buffer. */
static int parse_string(parser *ps, char **out) {
  ps->p++; /* the quote */
  /* the decoded text is never longer than the escaped one */
  const char *q = ps->p;
  while (q < ps->end && *q != '"') q += *q == '\\' && q + 1 < ps->end ? 2 : 1;
  if (q >= ps->end) return fail(ps, "unterminated string");
  char *s = malloc((size_t)(q - ps->p) + 1), *w = s;
  if (!s) return fail(ps, "out of memory");
  while (*ps->p != '"') {
    unsigned char c = (unsigned char)*ps->p++;
    if (c < 0x20) { free(s); return fail(ps, "control character in a string"); }
    if (c != '\\') { *w++ = (char)c; continue; }
    char e = *ps->p++;
    unsigned u;
    switch (e) {
      case '"': *w++ = '"'; break;
      case '\\': *w++ = '\\'; break;
      case '/': *w++ = '/'; break;
      case 'b': *w++ = '\b'; break;
      case 'f': *w++ = '\f'; break;
      case 'n': *w++ = '\n'; break;
      case 'r': *w++ = '\r'; break;
      case 't': *w++ = '\t'; break;
      case 'u':
        if (hex4(ps, &u)) { free(s); return -1; }
        if (u >= 0xDC00 && u <= 0xDFFF) { free(s); return fail(ps, "lone low surrogate"); }
        if (u >= 0xD800 && u <= 0xDBFF) {
          unsigned lo;
          if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
            free(s);
            return fail(ps, "high surrogate without its low half");
          }
          ps->p += 2;
          if (hex4(ps, &lo)) { free(s); return -1; }
          if (lo < 0xDC00 || lo > 0xDFFF) { free(s); return fail(ps, "bad surrogate pair"); }
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (u == 0) { free(s); return fail(ps, "\\u0000 in a string"); }
        if (u < 0x80) *w++ = (char)u;
        else if (u < 0x800) { *w++ = (char)(0xC0 | u >> 6); *w++ = (char)(0x80 | (u & 63)); }
        else if (u < 0x10000) {
          *w++ = (char)(0xE0 | u >> 12); *w++ = (char)(0x80 | (u >> 6 & 63));
          *w++ = (char)(0x80 | (u & 63));
        } else {
          *w++ = (char)(0xF0 | u >> 18); *w++ = (char)(0x80 | (u >> 12 & 63));
          *w++ = (char)(0x80 | (u >> 6 & 63)); *w++ = (char)(0x80 | (u & 63));
        }
        break;
      default: free(s); return fail(ps, "invalid escape in a string");
    }
  }
  ps->p++; /* the closing quote */
  *w = 0;
  *out = s;
  return 0;
}

static int parse_number(parser *ps, mpt__json *v) {
  const char *s = ps->p;
  int integral = 1;
  if (*ps->p == '-') ps->p++;
  if (*ps->p == '0') ps->p++;
  else if (*ps->p >= '1' && *ps->p <= '9') while (*ps->p >= '0' && *ps->p <= '9') ps->p++;
  else return fail(ps, "invalid number");
  if (*ps->p == '.') {
    integral = 0;
    ps->p++;
    if (!(*ps->p >= '0' && *ps->p <= '9')) return fail(ps, "digits expected after '.'");
    while (*ps->p >= '0' && *ps->p <= '9') ps->p++;
  }
  if (*ps->p == 'e' || *ps->p == 'E') {
    integral = 0;
    ps->p++;
    if (*ps->p == '+' || *ps->p == '-') ps->p++;
    if (!(*ps->p >= '0' && *ps->p <= '9')) return fail(ps, "digits expected in an exponent");
    while (*ps->p >= '0' && *ps->p <= '9') ps->p++;
  }
  v->type = MPT__JSON_NUMBER;
  v->d = strtod(s, NULL);
  if (integral) {
    errno = 0;
    long long i = strtoll(s, NULL, 10);
    if (errno != ERANGE) { v->is_int = 1; v->i = i; }
  }
  return 0;
}

static int parse_value(parser *ps, mpt__json *v, int depth);

static int parse_container(parser *ps, mpt__json *v, int depth, int object) {
  v->type = object ? MPT__JSON_OBJECT : MPT__JSON_ARRAY;
  ps->p++;
  skip_ws(ps);
  const char close = object ? '}' : ']';
  if (*ps->p == close) { ps->p++; return 0; }
  int cap = 0;
  for (;;) {
    if (v->n == cap) {
      cap = cap ? 2 * cap : 8;
      mpt__json *it = realloc(v->items, (size_t)cap * sizeof *it);
      if (!it) return fail(ps, "out of memory");
      v->items = it;
      if (object) {
        char **k = realloc(v->keys, (size_t)cap * sizeof *k);
        if (!k) return fail(ps, "out of memory");
        v->keys = k;
      }
    }
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    if (object) {
      v->keys[v->n] = NULL;
      skip_ws(ps);
      if (*ps->p != '"') return fail(ps, "a key (a string) expected");
      char *key;
      if (parse_string(ps, &key)) return -1;
      for (int i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) {
          snprintf(ps->why, sizeof ps->why, "duplicate key '%.100s'", key);
          free(key);
          return -1;
        }
      v->keys[v->n] = key;
      skip_ws(ps);
      if (*ps->p != ':') { v->n++; return fail(ps, "':' expected after a key"); }
      ps->p++;
    }
    v->n++;
    if (parse_value(ps, &v->items[v->n - 1], depth + 1)) return -1;
    skip_ws(ps);
    if (*ps->p == ',') { ps->p++; skip_ws(ps); if (*ps->p == close) return fail(ps, "trailing comma"); continue; }
    if (*ps->p == close) { ps->p++; return 0; }
    return fail(ps, object ? "',' or '}' expected" : "',' or ']' expected");
  }
}

static int parse_value(parser *ps, mpt__json *v, int depth) {
  if (depth > JSON_MAX_DEPTH) return fail(ps, "nested too deeply");
  skip_ws(ps);
  if (ps->p >= ps->end) return fail(ps, "unexpected end");
  switch (*ps->p) {
    case '{': return parse_container(ps, v, depth, 1);
    case '[': return parse_container(ps, v, depth, 0);
    case '"': v->type = MPT__JSON_STRING; return parse_string(ps, &v->s);
    case 't': case 'f': case 'n': {
      static const char *const words[] = {"true", "false", "null"};
      for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, words[k], n) == 0) {
          ps->p += n;
          v->type = k == 2 ? MPT__JSON_NULL : MPT__JSON_BOOL;
          v->i = k == 0;
          return 0;
        }
      }
      return fail(ps, "unknown literal");
    }
    default: return parse_number(ps, v);
  }
}

mpt_status mpt__json_parse(const char *text, int64_t len, const char *what, mpt__json **out) {
  *out = NULL;
  mpt__json *v = calloc(1, sizeof *v);
  if (!v) return MPT_FAIL(MPT_ENOMEM, "%s: parsing JSON", what);
  parser ps = {.text = text, .p = text, .end = text + len, .what = what};
  ps.why[0] = 0;
  int bad = parse_value(&ps, v, 0);
  if (!bad) {
    skip_ws(&ps);
    if (ps.p != ps.end) bad = fail(&ps, "bytes after the value");
  }
  if (bad) {
    mpt__json_free(v);
    return MPT_FAIL(strcmp(ps.why, "out of memory") == 0 ? MPT_ENOMEM : MPT_EFORMAT,
                    "%s: invalid JSON at byte %lld: %s", what, (long long)(ps.p - text), ps.why);
  }
  *out = v;
  return MPT_OK;
}

const mpt__json *mpt__json_get(const mpt__json *v, const char *key) {
  if (!v || v->type != MPT__JSON_OBJECT) return NULL;
  for (int i = 0; i < v->n; i++)
    if (strcmp(v->keys[i], key) == 0) return &v->items[i];
  return NULL;
}
