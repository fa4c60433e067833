/* safetensors files (include/mpitrain/safetensors.h): the validating reader and the atomic
 * fp32 writer.
 *
 * Invariants: the header is never trusted. Its length is checked against the file size and
 * MPT_ST_MAX_HEADER_NBYTES before it is read; every entry's dtype, shape and offsets are
 * checked (products in int64 with overflow checks) and the entries, sorted by offset, must not
 * overlap nor pass the end of the data, all before a tensor byte is read. Values are
 * little-endian (byte-swapped on a big-endian host). Runs on the calling thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "core/atomic_file.h"
#include "mpitrain/safetensors.h"

#define ST_CHUNK_NBYTES (1 << 20)

/* One file of the model: a lone file, or a shard of an index. */
typedef struct st_shard {
  char *path;
  int fd;
  int64_t data_offset;  /* 8 + N */
  int64_t data_nbytes;  /* file size - 8 - N */
} st_shard;

struct mpt_st_file {
  char *path;           /* the file, or the index */
  int nshards;
  st_shard *shards;     /* [nshards]; a lone file is shard 0 */
  int n;
  mpt_st_tensor *tensors;
  char **names;
  int nmeta;
  char **meta;          /* [2 nmeta]: key, value */
};

static const struct { const char *name; int nbytes; } dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
    {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1},
    {"F8_E5M2", 1}};

void mpt_st_close(mpt_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->nshards; i++) {
    if (f->shards[i].fd >= 0) close(f->shards[i].fd);
    free(f->shards[i].path);
  }
  free(f->shards);
  for (int i = 0; i < f->n; i++) free(f->names[i]);
  for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
  free(f->names);
  free(f->meta);
  free(f->tensors);
  free(f->path);
  free(f);
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int by_begin(const void *a, const void *b) {
  const mpt_st_tensor *x = *(const mpt_st_tensor *const *)a, *y = *(const mpt_st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Checks one header entry `v` called `name` and fills *t. */
static mpt_status parse_entry(const char *path, const char *name, const mpt__json *v,
                              int64_t data_nbytes, mpt_st_tensor *t) {
  if (v->type != MPT__JSON_OBJECT)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' is not an object", path, name);
  for (int i = 0; i < v->n; i++)
    if (strcmp(v->keys[i], "dtype") && strcmp(v->keys[i], "shape") &&
        strcmp(v->keys[i], "data_offsets"))
      return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' has an unknown field "
                      "'%s' (expected dtype, shape, data_offsets)", path, name, v->keys[i]);
  const mpt__json *dt = mpt__json_get(v, "dtype"), *sh = mpt__json_get(v, "shape"),
                  *off = mpt__json_get(v, "data_offsets");
  if (!dt || !sh || !off)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' has no %s", path, name,
                    !dt ? "dtype" : !sh ? "shape" : "data_offsets");
  if (dt->type != MPT__JSON_STRING)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': dtype is not a string",
                    path, name);
  t->dtype_nbytes = 0;
  for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
    if (strcmp(dt->s, dtypes[k].name) == 0) {
      snprintf(t->dtype, sizeof t->dtype, "%s", dtypes[k].name);
      t->dtype_nbytes = dtypes[k].nbytes;
    }
  if (!t->dtype_nbytes)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' has unknown dtype '%.40s'",
                    path, name, dt->s);
  if (sh->type != MPT__JSON_ARRAY || sh->n > MPT_ST_MAX_DIMS)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': shape is not an array of "
                    "at most %d integers", path, name, MPT_ST_MAX_DIMS);
  t->ndim = sh->n;
  t->count = 1;
  int overflow = 0;
  for (int d = 0; d < sh->n; d++) {
    const mpt__json *e = &sh->items[d];
    if (e->type != MPT__JSON_NUMBER || !e->is_int || e->i < 0)
      return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': shape[%d] is not an "
                      "integer >= 0", path, name, d);
    t->shape[d] = e->i;
    if (e->i && t->count > INT64_MAX / 8 / e->i) overflow = 1;
    else t->count *= e->i;
  }
  if (off->type != MPT__JSON_ARRAY || off->n != 2)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': data_offsets is not "
                    "[begin, end]", path, name);
  for (int k = 0; k < 2; k++)
    if (off->items[k].type != MPT__JSON_NUMBER || !off->items[k].is_int || off->items[k].i < 0)
      return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': data_offsets[%d] is "
                      "not an integer >= 0", path, name, k);
  t->begin = off->items[0].i;
  t->end = off->items[1].i;
  if (t->end < t->begin)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': data_offsets [%lld, %lld] "
                    "end before begin", path, name, (long long)t->begin, (long long)t->end);
  if (overflow || t->count * t->dtype_nbytes != t->end - t->begin)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': %s shape of %s%lld "
                    "elements needs %s%lld bytes, its data_offsets [%lld, %lld] hold %lld", path,
                    name, t->dtype, overflow ? "over " : "", (long long)t->count,
                    overflow ? "over " : "", (long long)(t->count * t->dtype_nbytes),
                    (long long)t->begin, (long long)t->end, (long long)(t->end - t->begin));
  if (t->end > data_nbytes)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s': data_offsets [%lld, %lld] "
                    "past the end of the data (%lld bytes): the file is truncated or corrupt",
                    path, name, (long long)t->begin, (long long)t->end, (long long)data_nbytes);
  return MPT_OK;
}

mpt_status mpt_st_open(const char *path, mpt_st_file **out) {
  if (!path || !out) return MPT_FAIL(MPT_EINVAL, "mpt_st_open: NULL argument");
  *out = NULL;
  mpt_status st = MPT_OK;
  char *text = NULL;
  mpt__json *root = NULL;
  const mpt_st_tensor **sorted = NULL;
  mpt_st_file *f = calloc(1, sizeof *f);
  if (!f) return MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': out of host memory", path);
  if (!(f->shards = calloc(1, sizeof *f->shards))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': out of host memory", path);
    goto fail;
  }
  f->nshards = 1;
  st_shard *sh = &f->shards[0];
  sh->fd = -1;
  if (!(f->path = dup_str(path)) || !(sh->path = dup_str(path))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': out of host memory", path);
    goto fail;
  }
  int64_t size;
  MPT_CHECK(mpt__file_open_regular(path, "safetensors file", &sh->fd, &size), fail);
  if (size < 8) {
    st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s' is %lld bytes, shorter than the 8-byte "
                  "header length", path, (long long)size);
    goto fail;
  }
  uint8_t h8[8];
  MPT_CHECK(mpt__file_pread(sh->fd, "safetensors file", path, h8, 8, 0), fail);
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--) hn = hn << 8 | h8[k];
  if (hn > (uint64_t)MPT_ST_MAX_HEADER_NBYTES || hn > (uint64_t)(size - 8) || hn < 2) {
    st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': header length %llu is %s (the file is "
                  "%lld bytes)%s", path, (unsigned long long)hn,
                  hn < 2 ? "too small for a JSON object"
                  : hn > (uint64_t)(size - 8) ? "past the end of the file" : "absurd",
                  (long long)size,
                  hn > (uint64_t)MPT_ST_MAX_HEADER_NBYTES ? ": not a safetensors file?" : "");
    goto fail;
  }
  sh->data_offset = 8 + (int64_t)hn;
  sh->data_nbytes = size - sh->data_offset;
  if (!(text = malloc(hn + 1))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': %llu bytes of header", path,
                  (unsigned long long)hn);
    goto fail;
  }
  MPT_CHECK(mpt__file_pread(sh->fd, "safetensors file", path, text, (int64_t)hn, 8), fail);
  text[hn] = 0;
  char what[4200];
  snprintf(what, sizeof what, "safetensors file '%s': header", path);
  MPT_CHECK(mpt__json_parse(text, (int64_t)hn, what, &root), fail);
  if (root->type != MPT__JSON_OBJECT) {
    st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': the header is not a JSON object", path);
    goto fail;
  }
  f->tensors = calloc((size_t)root->n + 1, sizeof *f->tensors);
  f->names = calloc((size_t)root->n + 1, sizeof *f->names);
  sorted = calloc((size_t)root->n + 1, sizeof *sorted);
  if (!f->tensors || !f->names || !sorted) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': %d header entries", path, root->n);
    goto fail;
  }
  for (int i = 0; i < root->n; i++) {
    const mpt__json *v = &root->items[i];
    if (strcmp(root->keys[i], "__metadata__") == 0) {
      if (v->type != MPT__JSON_OBJECT) {
        st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': __metadata__ is not an object", path);
        goto fail;
      }
      if (!(f->meta = calloc(2 * (size_t)v->n + 1, sizeof *f->meta))) {
        st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': metadata", path);
        goto fail;
      }
      for (int k = 0; k < v->n; k++) {
        if (v->items[k].type != MPT__JSON_STRING) {
          st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': __metadata__ '%s' is not a string",
                        path, v->keys[k]);
          goto fail;
        }
        f->meta[2 * k] = dup_str(v->keys[k]);
        f->meta[2 * k + 1] = dup_str(v->items[k].s);
        f->nmeta = k + 1;
        if (!f->meta[2 * k] || !f->meta[2 * k + 1]) {
          st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': metadata", path);
          goto fail;
        }
      }
      continue;
    }
    if (!root->keys[i][0]) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': a tensor with an empty name", path);
      goto fail;
    }
    mpt_st_tensor *t = &f->tensors[f->n];
    MPT_CHECK(parse_entry(path, root->keys[i], v, sh->data_nbytes, t), fail);
    if (!(f->names[f->n] = dup_str(root->keys[i]))) {
      st = MPT_FAIL(MPT_ENOMEM, "safetensors file '%s': names", path);
      goto fail;
    }
    t->name = f->names[f->n];
    sorted[f->n] = t;
    f->n++;
  }
  qsort(sorted, (size_t)f->n, sizeof *sorted, by_begin);
  for (int i = 1; i < f->n; i++)
    if (sorted[i]->begin < sorted[i - 1]->end && sorted[i]->end > sorted[i]->begin) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensors '%s' [%lld, %lld] and '%s' "
                    "[%lld, %lld] overlap", path, sorted[i - 1]->name,
                    (long long)sorted[i - 1]->begin, (long long)sorted[i - 1]->end,
                    sorted[i]->name, (long long)sorted[i]->begin, (long long)sorted[i]->end);
      goto fail;
    }
  free(sorted);
  free(text);
  mpt__json_free(root);
  *out = f;
  return MPT_OK;
fail:
  free(sorted);
  free(text);
  mpt__json_free(root);
  mpt_st_close(f);
  return st;
}

/* Index files are small: a name and a file name per tensor. */
#define ST_MAX_INDEX_NBYTES (64 << 20)

/* The index's folder joined with `name` into out[cap]; 0 when it does not fit. */
static int join_dir(const char *index_path, const char *name, char *out, size_t cap) {
  const char *slash = strrchr(index_path, '/');
  const int dir = slash ? (int)(slash - index_path + 1) : 0;
  return snprintf(out, cap, "%.*s%s", dir, index_path, name) < (int)cap;
}

/* Moves the n tensors, names, descriptor and (for the first) metadata of the open lone file
 * `from` into f as its shard `k`; `from` is left empty to close. */
static void adopt_shard(mpt_st_file *f, int k, mpt_st_file *from) {
  f->shards[k] = from->shards[0];
  from->shards[0].fd = -1;
  from->shards[0].path = NULL;
  for (int i = 0; i < from->n; i++) {
    f->tensors[f->n] = from->tensors[i];
    f->tensors[f->n].shard = k;
    f->names[f->n] = from->names[i];
    from->names[i] = NULL;
    f->n++;
  }
  if (k == 0) {
    f->meta = from->meta;
    f->nmeta = from->nmeta;
    from->meta = NULL;
    from->nmeta = 0;
  }
}

mpt_status mpt_st_open_index(const char *path, mpt_st_file **out) {
  if (!path || !out) return MPT_FAIL(MPT_EINVAL, "mpt_st_open_index: NULL argument");
  *out = NULL;
  mpt_status st = MPT_OK;
  char *text = NULL;
  mpt__json *root = NULL;
  mpt_st_file *f = NULL, **subs = NULL;
  const char **shard_names = NULL;
  int nsub = 0, fd = -1;
  int64_t size;
  MPT_RETURN_IF(mpt__file_open_regular(path, "safetensors index", &fd, &size));
  if (size > ST_MAX_INDEX_NBYTES) {
    st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s' is %lld bytes: not an index", path,
                  (long long)size);
    goto out;
  }
  if (!(text = malloc((size_t)size + 1))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors index '%s'", path);
    goto out;
  }
  MPT_CHECK(mpt__file_pread(fd, "safetensors index", path, text, size, 0), out);
  text[size] = 0;
  char what[4200];
  snprintf(what, sizeof what, "safetensors index '%s'", path);
  MPT_CHECK(mpt__json_parse(text, size, what, &root), out);
  const mpt__json *map = mpt__json_get(root, "weight_map");
  if (!map || map->type != MPT__JSON_OBJECT) {
    st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s' has no \"weight_map\" object (tensor "
                  "name -> shard file)", path);
    goto out;
  }
  /* the shard files, in the order of their first mention */
  if (!(shard_names = calloc((size_t)map->n + 1, sizeof *shard_names)) ||
      !(subs = calloc((size_t)map->n + 1, sizeof *subs))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors index '%s'", path);
    goto out;
  }
  for (int i = 0; i < map->n; i++) {
    const mpt__json *v = &map->items[i];
    if (v->type != MPT__JSON_STRING || !v->s[0] || strchr(v->s, '/') ||
        strcmp(v->s, ".") == 0 || strcmp(v->s, "..") == 0) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s': tensor '%s' is not mapped to a file "
                    "name (a string naming a file in the index's folder)", path, map->keys[i]);
      goto out;
    }
    int k = 0;
    while (k < nsub && strcmp(shard_names[k], v->s) != 0) k++;
    if (k == nsub) shard_names[nsub++] = v->s;
  }
  int64_t total = 0;
  for (int k = 0; k < nsub; k++) {
    char sp[4200];
    if (!join_dir(path, shard_names[k], sp, sizeof sp)) {
      st = MPT_FAIL(MPT_EINVAL, "safetensors index '%s': shard path too long", path);
      goto out;
    }
    st = mpt_st_open(sp, &subs[k]);
    if (st == MPT_ENOENT) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s' names shard '%s', which does not exist "
                    "(%s)", path, shard_names[k], sp);
      goto out;
    }
    MPT_CHECK(st, out);
    total += subs[k]->n;
  }
  /* every shard's tensor in the map under that shard, and in no other shard */
  for (int k = 0; k < nsub; k++)
    for (int i = 0; i < subs[k]->n; i++) {
      const char *name = subs[k]->tensors[i].name;
      for (int j = 0; j < k; j++)
        if (mpt_st_find(subs[j], name)) {
          st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s': tensor '%s' is in two shards, "
                        "'%s' and '%s'", path, name, shard_names[j], shard_names[k]);
          goto out;
        }
      const mpt__json *v = mpt__json_get(map, name);
      if (!v) {
        st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s': shard '%s' holds tensor '%s', which "
                      "the index's weight_map does not list", path, shard_names[k], name);
        goto out;
      }
      if (strcmp(v->s, shard_names[k]) != 0) {
        st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s': tensor '%s' is in shard '%s', the "
                      "weight_map puts it in '%s'", path, name, shard_names[k], v->s);
        goto out;
      }
    }
  for (int i = 0; i < map->n; i++) {
    int k = 0;
    while (strcmp(shard_names[k], map->items[i].s) != 0) k++;
    if (!mpt_st_find(subs[k], map->keys[i])) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors index '%s' puts tensor '%s' in shard '%s', which "
                    "does not hold it", path, map->keys[i], shard_names[k]);
      goto out;
    }
  }
  if (!(f = calloc(1, sizeof *f)) || !(f->path = dup_str(path)) ||
      !(f->shards = calloc((size_t)nsub + 1, sizeof *f->shards)) ||
      !(f->tensors = calloc((size_t)total + 1, sizeof *f->tensors)) ||
      !(f->names = calloc((size_t)total + 1, sizeof *f->names))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors index '%s'", path);
    goto out;
  }
  for (int k = 0; k < nsub; k++) {
    adopt_shard(f, k, subs[k]);
    f->nshards = k + 1;
  }
  for (int i = 0; i < f->n; i++) f->tensors[i].name = f->names[i];
  *out = f;
  f = NULL;
out:
  for (int k = 0; subs && k < nsub; k++) mpt_st_close(subs[k]);
  free(subs);
  free(shard_names);
  mpt_st_close(f);
  mpt__json_free(root);
  free(text);
  if (fd >= 0) close(fd);
  return st;
}

int mpt_st_num_shards(const mpt_st_file *f) { return f ? f->nshards : 0; }

const char *mpt_st_shard_path(const mpt_st_file *f, int shard) {
  return f && shard >= 0 && shard < f->nshards ? f->shards[shard].path : NULL;
}

int mpt_st_num_tensors(const mpt_st_file *f) { return f ? f->n : 0; }

const mpt_st_tensor *mpt_st_tensor_at(const mpt_st_file *f, int i) {
  return f && i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const mpt_st_tensor *mpt_st_find(const mpt_st_file *f, const char *name) {
  for (int i = 0; f && name && i < f->n; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

const char *mpt_st_metadata(const mpt_st_file *f, const char *key) {
  for (int i = 0; f && key && i < f->nmeta; i++)
    if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
  return NULL;
}

/* IEEE half -> float, exactly (every half is a float). */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = h >> 10 & 31, m = h & 1023, u;
  if (e == 31) u = sign | 0x7F800000u | m << 13;
  else if (e) u = sign | (e + 112) << 23 | m << 13;
  else if (!m) u = sign;
  else { /* subnormal: normalize */
    e = 113;
    while (!(m & 1024)) { m <<= 1; e--; }
    u = sign | e << 23 | (m & 1023) << 13;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

mpt_status mpt_st_read_f32(mpt_st_file *f, const mpt_st_tensor *t, float *dst,
                           int64_t capacity) {
  if (!f || !t || (!dst && t->count)) return MPT_FAIL(MPT_EINVAL, "mpt_st_read_f32: NULL argument");
  const int kind = strcmp(t->dtype, "F32") == 0 ? 0 : strcmp(t->dtype, "BF16") == 0 ? 1
                 : strcmp(t->dtype, "F16") == 0 ? 2 : -1;
  if (t->shard < 0 || t->shard >= f->nshards)
    return MPT_FAIL(MPT_EINVAL, "mpt_st_read_f32: tensor '%s' is not of this file", t->name);
  const st_shard *sh = &f->shards[t->shard];
  if (kind < 0)
    return MPT_FAIL(MPT_ENOTSUP, "safetensors file '%s': tensor '%s' is %s; F32, BF16 and F16 "
                    "are read", sh->path, t->name, t->dtype);
  if (t->count > capacity)
    return MPT_FAIL(MPT_ESHAPE, "safetensors file '%s': tensor '%s' has %lld elements, the "
                    "buffer %lld", sh->path, t->name, (long long)t->count, (long long)capacity);
  mpt_status st = MPT_OK;
  uint8_t *buf = malloc(ST_CHUNK_NBYTES);
  if (!buf) return MPT_FAIL(MPT_ENOMEM, "safetensors read: out of host memory");
  const int es = t->dtype_nbytes;
  const int64_t per = ST_CHUNK_NBYTES / es;
  for (int64_t i = 0; i < t->count; i += per) {
    const int64_t m = t->count - i < per ? t->count - i : per;
    MPT_CHECK(mpt__file_pread(sh->fd, "safetensors file", sh->path, buf, m * es,
                              sh->data_offset + t->begin + i * es), out);
    for (int64_t j = 0; j < m; j++) {
      const uint8_t *p = buf + j * es;
      uint32_t u;
      if (kind == 0) u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
      else if (kind == 1) u = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
      else {
        dst[i + j] = half_to_float((uint16_t)(p[0] | p[1] << 8));
        continue;
      }
      memcpy(&dst[i + j], &u, 4);
    }
  }
out:
  free(buf);
  return st;
}

/* Appends s to the header buffer as a JSON string. */
static int put(char **b, size_t *n, size_t *cap, const char *s, size_t len) {
  if (*n + len + 1 > *cap) {
    size_t c = (*cap + len + 1) * 2;
    char *nb = realloc(*b, c);
    if (!nb) return -1;
    *b = nb;
    *cap = c;
  }
  memcpy(*b + *n, s, len);
  *n += len;
  (*b)[*n] = 0;
  return 0;
}

static int put_str(char **b, size_t *n, size_t *cap, const char *s) {
  int r = put(b, n, cap, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p && !r; p++) {
    char e[8];
    if (*p == '"' || *p == '\\') { e[0] = '\\'; e[1] = (char)*p; r = put(b, n, cap, e, 2); }
    else if (*p < 0x20) { snprintf(e, sizeof e, "\\u%04x", *p); r = put(b, n, cap, e, 6); }
    else r = put(b, n, cap, (const char *)p, 1);
  }
  return r || put(b, n, cap, "\"", 1);
}

mpt_status mpt_st_write(const char *path, const mpt_st_write_tensor *tensors, int n,
                        const char *const *meta, int nmeta, mpt_st_dtype dtype,
                        mpt_st_fill_fn fill, void *ctx) {
  if (!path || (n > 0 && !tensors) || !fill || n < 0 || nmeta < 0 || (nmeta > 0 && !meta))
    return MPT_FAIL(MPT_EINVAL, "mpt_st_write: NULL or negative argument");
  if (dtype != MPT_ST_F32 && dtype != MPT_ST_BF16)
    return MPT_FAIL(MPT_EINVAL, "mpt_st_write: dtype %d is neither MPT_ST_F32 nor MPT_ST_BF16",
                    (int)dtype);
  const int es = dtype == MPT_ST_BF16 ? 2 : 4;
  const char *entry_head = dtype == MPT_ST_BF16 ? ":{\"dtype\":\"BF16\",\"shape\":["
                                                : ":{\"dtype\":\"F32\",\"shape\":[";
  mpt_status st = MPT_OK;
  char *hdr = NULL;
  size_t hn = 0, cap = 0;
  float *buf = NULL;
  int64_t offset = 0, max_count = 0;
  mpt__afile af;
  memset(&af, 0, sizeof af);
  int bad = put(&hdr, &hn, &cap, "{", 1);
  if (nmeta > 0) {
    bad = bad || put(&hdr, &hn, &cap, "\"__metadata__\":{", 16);
    for (int k = 0; k < nmeta; k++)
      bad = bad || (k && put(&hdr, &hn, &cap, ",", 1)) || put_str(&hdr, &hn, &cap, meta[2 * k]) ||
            put(&hdr, &hn, &cap, ":", 1) || put_str(&hdr, &hn, &cap, meta[2 * k + 1]);
    bad = bad || put(&hdr, &hn, &cap, "}", 1);
  }
  for (int i = 0; i < n && !bad; i++) {
    const mpt_st_write_tensor *t = &tensors[i];
    if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0 || t->ndim < 0 ||
        t->ndim > MPT_ST_MAX_DIMS) {
      st = MPT_FAIL(MPT_EINVAL, "safetensors write %s: tensor %d: bad name or ndim %d", path, i,
                    t->ndim);
      goto out;
    }
    for (int j = 0; j < i; j++)
      if (strcmp(tensors[j].name, t->name) == 0) {
        st = MPT_FAIL(MPT_EINVAL, "safetensors write %s: tensor '%s' given twice", path, t->name);
        goto out;
      }
    int64_t count = 1;
    char num[64];
    bad = bad || (nmeta > 0 || i ? put(&hdr, &hn, &cap, ",", 1) : 0) ||
          put_str(&hdr, &hn, &cap, t->name) ||
          put(&hdr, &hn, &cap, entry_head, strlen(entry_head));
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0 || (t->shape[d] && count > INT64_MAX / 8 / t->shape[d])) {
        st = MPT_FAIL(MPT_EINVAL, "safetensors write %s: tensor '%s': bad shape[%d] %lld", path,
                      t->name, d, (long long)t->shape[d]);
        goto out;
      }
      count *= t->shape[d];
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      bad = bad || put(&hdr, &hn, &cap, num, strlen(num));
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)offset,
             (long long)(offset + es * count));
    bad = bad || put(&hdr, &hn, &cap, num, strlen(num));
    offset += es * count;
    if (count > max_count) max_count = count;
  }
  bad = bad || put(&hdr, &hn, &cap, "}", 1);
  while (!bad && hn % 8) bad = put(&hdr, &hn, &cap, " ", 1);
  if (bad || !(buf = malloc((size_t)(max_count ? max_count : 1) * sizeof *buf))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors write %s: out of host memory", path);
    goto out;
  }
  uint8_t h8[8];
  for (int k = 0; k < 8; k++) h8[k] = (uint8_t)((uint64_t)hn >> (8 * k));
  MPT_CHECK(mpt__afile_open(&af, path, "safetensors file"), out);
  MPT_CHECK(mpt__afile_write(&af, h8, 8), out);
  MPT_CHECK(mpt__afile_write(&af, hdr, hn), out);
  for (int i = 0; i < n; i++) {
    int64_t count = 1;
    for (int d = 0; d < tensors[i].ndim; d++) count *= tensors[i].shape[d];
    MPT_CHECK(fill(ctx, i, buf), out);
    if (dtype == MPT_ST_BF16) { /* in place: element j's 2 bytes never pass float j */
      uint8_t *b = (uint8_t *)buf;
      for (int64_t j = 0; j < count; j++) {
        const uint16_t h = mpt_bf16_from_f32(buf[j]);
        b[2 * j] = (uint8_t)h;
        b[2 * j + 1] = (uint8_t)(h >> 8);
      }
    } else {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      for (int64_t j = 0; j < count; j++) {
        uint32_t u;
        memcpy(&u, &buf[j], 4);
        u = __builtin_bswap32(u);
        memcpy(&buf[j], &u, 4);
      }
#endif
    }
    MPT_CHECK(mpt__afile_write(&af, buf, (size_t)count * (size_t)es), out);
  }
  MPT_CHECK(mpt__afile_commit(&af), out);
out:
  mpt__afile_abort(&af);
  free(buf);
  free(hdr);
  return st;
}

mpt_status mpt_st_write_f32(const char *path, const mpt_st_write_tensor *tensors, int n,
                            const char *const *meta, int nmeta, mpt_st_fill_fn fill, void *ctx) {
  return mpt_st_write(path, tensors, n, meta, nmeta, MPT_ST_F32, fill, ctx);
}
