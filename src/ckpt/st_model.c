/* Safetensors models (include/mpitrain/safetensors.h): where a model's files lie (a folder with
 * model.safetensors or a sharded model.safetensors.index.json, or a file), the writer that
 * shards as transformers does, and the config.json helpers the GPT-2 and Llama mappings share
 * (st_model.h).
 *
 * Invariants: every file is written atomically (temporary file, fsync, rename); a sharded
 * model's shards are written before its index, and the files of the model it replaces are
 * removed only after (a crash between leaves both, which the reader refuses as ambiguous).
 * Runs on the calling thread. */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/st_model.h"
#include "core/atomic_file.h"

#define ST_MAX_CONFIG_NBYTES (16 << 20)
#define ST_MAX_SHARDS 99999 /* the 5 digits of model-00001-of-00002.safetensors */

static int is_dir(const char *path) {
  struct stat s;
  return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

static int exists(const char *path) {
  struct stat s;
  return stat(path, &s) == 0;
}

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

mpt_st_save_options mpt_st_save_options_default(void) {
  mpt_st_save_options o = {MPT_ST_F32, MPT_ST_DEFAULT_SHARD_NBYTES};
  return o;
}

mpt_status mpt_st_parse_size(const char *text, int64_t *nbytes) {
  if (!text || !nbytes) return MPT_FAIL(MPT_EINVAL, "mpt_st_parse_size: NULL argument");
  static const struct { const char *unit; int64_t scale; } units[] = {
      {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000},
      {"TB", 1000000000000}, {"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30},
      {"TIB", INT64_C(1) << 40}};
  const char *p = text;
  int64_t v = 0;
  if (*p < '0' || *p > '9') goto bad;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (INT64_MAX - 9) / 10) goto bad;
    v = v * 10 + (*p - '0');
  }
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    const size_t n = strlen(units[i].unit);
    if (strlen(p) != n) continue;
    int same = 1;
    for (size_t k = 0; k < n; k++)
      same = same && (p[k] == units[i].unit[k] || p[k] == units[i].unit[k] - 'A' + 'a');
    if (!same) continue;
    if (v < 1 || v > INT64_MAX / units[i].scale) goto bad;
    *nbytes = v * units[i].scale;
    return MPT_OK;
  }
bad:
  return MPT_FAIL(MPT_EINVAL, "size '%.60s' is not a positive whole number with an optional "
                  "unit (B, KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: of 1024)", text);
}

int mpt_st_is_model_path(const char *path) {
  if (!path) return 0;
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) return 1;
  if (!is_dir(path)) return 0;
  static const char *const names[3] = {"model.safetensors", "model.safetensors.index.json",
                                       "config.json"};
  char p[MPT__ST_PATH_MAX];
  for (int k = 0; k < 3; k++) /* a folder of another kind is not taken for a model */
    if (snprintf(p, sizeof p, "%s/%s", path, names[k]) < (int)sizeof p && exists(p)) return 1;
  return 0;
}

mpt_status mpt_st_model_paths(const char *path, char *tensors_path, char *config_path,
                              size_t cap) {
  if (!path || !tensors_path || !config_path)
    return MPT_FAIL(MPT_EINVAL, "mpt_st_model_paths: NULL argument");
  if (is_dir(path)) {
    char one[MPT__ST_PATH_MAX], index[MPT__ST_PATH_MAX];
    if (snprintf(one, sizeof one, "%s/model.safetensors", path) >= (int)sizeof one ||
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", path) >=
            (int)sizeof index ||
        snprintf(config_path, cap, "%s/config.json", path) >= (int)cap)
      return MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
    const int has_one = exists(one), has_index = exists(index);
    if (has_one && has_index)
      return MPT_FAIL(MPT_EFORMAT, "safetensors model '%s' holds both model.safetensors and "
                      "model.safetensors.index.json (a sharded model): remove the stale one",
                      path);
    if (!has_one && !has_index)
      return MPT_FAIL(MPT_ENOENT, "safetensors model '%s' holds neither model.safetensors nor "
                      "model.safetensors.index.json", path);
    if (snprintf(tensors_path, cap, "%s", has_one ? one : index) >= (int)cap)
      return MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
    return MPT_OK;
  }
  const char *slash = strrchr(path, '/');
  const int dir = slash ? (int)(slash - path + 1) : 0;
  if (snprintf(tensors_path, cap, "%s", path) >= (int)cap ||
      snprintf(config_path, cap, "%.*sconfig.json", dir, path) >= (int)cap)
    return MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
  return MPT_OK;
}

mpt_status mpt_st_open_model(const char *path, mpt_st_file **out) {
  if (!path || !out) return MPT_FAIL(MPT_EINVAL, "mpt_st_open_model: NULL argument");
  *out = NULL;
  char tp[MPT__ST_PATH_MAX], cp[MPT__ST_PATH_MAX];
  MPT_RETURN_IF(mpt_st_model_paths(path, tp, cp, sizeof tp));
  return ends_with(tp, ".index.json") ? mpt_st_open_index(tp, out) : mpt_st_open(tp, out);
}

/* ---- writing ---- */

/* The tensors [first, first + n) of a model as a file of their own. */
typedef struct sub_ctx {
  mpt_st_fill_fn fill;
  void *ctx;
  int first;
} sub_ctx;

static mpt_status sub_fill(void *ctx, int index, float *dst) {
  const sub_ctx *s = ctx;
  return s->fill(s->ctx, s->first + index, dst);
}

/* 1 when name is a shard of transformers' naming, model-NNNNN-of-NNNNN.safetensors; *of its
 * count. */
static int shard_name(const char *name, int *of) {
  if (strlen(name) != 32 || strncmp(name, "model-", 6) || strncmp(name + 11, "-of-", 4) ||
      strcmp(name + 20, ".safetensors"))
    return 0;
  int n = 0;
  for (int i = 0; i < 5; i++) {
    if (name[6 + i] < '0' || name[6 + i] > '9' || name[15 + i] < '0' || name[15 + i] > '9')
      return 0;
    n = n * 10 + (name[15 + i] - '0');
  }
  *of = n;
  return 1;
}

/* Removes the folder's shards of another count than keep_of (0: all) and, when `index`, its
 * model.safetensors.index.json; `single`: its model.safetensors. A file that cannot be removed
 * is a warning-free no-op: the reader refuses what is left ambiguous. */
static void remove_stale(const char *dir, int keep_of, int index, int single) {
  char p[MPT__ST_PATH_MAX];
  if (single && snprintf(p, sizeof p, "%s/model.safetensors", dir) < (int)sizeof p) unlink(p);
  if (index && snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir) < (int)sizeof p)
    unlink(p);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int of;
    if (shard_name(e->d_name, &of) && of != keep_of &&
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
      unlink(p);
  }
  closedir(d);
}

static mpt_status write_text(const char *path, const char *what, const char *text) {
  mpt__afile af;
  mpt_status st;
  MPT_CHECK(mpt__afile_open(&af, path, what), out);
  MPT_CHECK(mpt__afile_write(&af, text, strlen(text)), out);
  MPT_CHECK(mpt__afile_commit(&af), out);
out:
  mpt__afile_abort(&af);
  return st;
}

/* Appends printf output to the growing buffer *b (*n used, *cap allocated); -1 out of memory. */
static int append(char **b, size_t *n, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int append(char **b, size_t *n, size_t *cap, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(*b ? *b + *n : NULL, *b ? *cap - *n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if (*b && *n + (size_t)k < *cap) {
      *n += (size_t)k;
      return 0;
    }
    const size_t c = (*cap + (size_t)k + 1) * 2;
    char *nb = realloc(*b, c);
    if (!nb) return -1;
    *b = nb;
    *cap = c;
  }
}

/* A JSON string literal of s (names are plain ASCII in practice; escaped anyway). */
static int append_str(char **b, size_t *n, size_t *cap, const char *s) {
  int r = append(b, n, cap, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p && !r; p++)
    r = *p == '"' || *p == '\\' ? append(b, n, cap, "\\%c", *p)
        : *p < 0x20             ? append(b, n, cap, "\\u%04x", *p)
                                : append(b, n, cap, "%c", *p);
  return r || append(b, n, cap, "\"");
}

mpt_status mpt_st_write_model(const char *path, const mpt_st_write_tensor *tensors, int n,
                              const char *const *meta, int nmeta, const char *config_json,
                              const mpt_st_save_options *opts, mpt_st_fill_fn fill, void *ctx) {
  if (!path || (n > 0 && !tensors) || n < 0 || !fill)
    return MPT_FAIL(MPT_EINVAL, "mpt_st_write_model: NULL or negative argument");
  const mpt_st_save_options o = opts ? *opts : mpt_st_save_options_default();
  if (ends_with(path, ".index.json"))
    return MPT_FAIL(MPT_EINVAL, "safetensors model write '%s': an index is written with its "
                    "shards: give their folder", path);
  if (o.shard_nbytes < 1)
    return MPT_FAIL(MPT_EINVAL, "mpt_st_write_model: shard size %lld bytes", (long long)o.shard_nbytes);
  const int es = o.dtype == MPT_ST_BF16 ? 2 : 4;
  char cfg[MPT__ST_PATH_MAX], p[MPT__ST_PATH_MAX];
  const int dir = is_dir(path);
  const char *slash = strrchr(path, '/');
  const int dlen = slash ? (int)(slash - path + 1) : 0;
  if ((dir ? snprintf(cfg, sizeof cfg, "%s/config.json", path)
           : snprintf(cfg, sizeof cfg, "%.*sconfig.json", dlen, path)) >= (int)sizeof cfg)
    return MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
  /* the shards, filled greedily in order as transformers (huggingface_hub) does: a tensor that
   * does not fit the current shard starts the next; one larger than the size has its own */
  int *shard_of = calloc((size_t)n + 1, sizeof *shard_of);
  char *index = NULL;
  size_t in = 0, icap = 0;
  mpt_status st = MPT_OK;
  if (!shard_of) return MPT_FAIL(MPT_ENOMEM, "safetensors model write %s", path);
  int nshards = n > 0 ? 1 : 0;
  int64_t used = 0, total = 0;
  for (int i = 0; i < n; i++) {
    int64_t count = 1;
    for (int d = 0; d < tensors[i].ndim && d < MPT_ST_MAX_DIMS; d++)
      if (tensors[i].shape[d] >= 0 && count <= INT64_MAX / 8 / (tensors[i].shape[d] + 1))
        count *= tensors[i].shape[d];
    const int64_t nb = count * es;
    if (used > 0 && used + nb > o.shard_nbytes) {
      nshards++;
      used = 0;
    }
    used += nb;
    total += nb;
    shard_of[i] = nshards - 1;
  }
  if (!dir || nshards <= 1) { /* one file */
    if (dir && snprintf(p, sizeof p, "%s/model.safetensors", path) >= (int)sizeof p) {
      st = MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
      goto out;
    }
    MPT_CHECK(mpt_st_write(dir ? p : path, tensors, n, meta, nmeta, o.dtype, fill, ctx), out);
    if (dir) remove_stale(path, 0, 1, 0);
  } else {
    if (nshards > ST_MAX_SHARDS) {
      st = MPT_FAIL(MPT_EINVAL, "safetensors model write %s: %d shards of %lld bytes, more "
                    "than %d: give a larger shard size", path, nshards,
                    (long long)o.shard_nbytes, ST_MAX_SHARDS);
      goto out;
    }
    int bad = append(&index, &in, &icap, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n"
                     "  \"weight_map\": {", (long long)total);
    for (int k = 0, first = 0; k < nshards; k++) {
      int last = first;
      while (last < n && shard_of[last] == k) last++;
      char name[40];
      snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
      if (snprintf(p, sizeof p, "%s/%s", path, name) >= (int)sizeof p) {
        st = MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
        goto out;
      }
      sub_ctx sc = {fill, ctx, first};
      MPT_CHECK(mpt_st_write(p, tensors + first, last - first, meta, nmeta, o.dtype, sub_fill,
                             &sc), out);
      for (int i = first; i < last; i++)
        bad = bad || append(&index, &in, &icap, "%s\n    ", i ? "," : "") ||
              append_str(&index, &in, &icap, tensors[i].name) ||
              append(&index, &in, &icap, ": \"%s\"", name);
      first = last;
    }
    if (bad || append(&index, &in, &icap, "\n  }\n}\n")) {
      st = MPT_FAIL(MPT_ENOMEM, "safetensors model write %s: index", path);
      goto out;
    }
    if (snprintf(p, sizeof p, "%s/model.safetensors.index.json", path) >= (int)sizeof p) {
      st = MPT_FAIL(MPT_EINVAL, "safetensors model path too long: %.100s...", path);
      goto out;
    }
    MPT_CHECK(write_text(p, "safetensors index", index), out);
    remove_stale(path, nshards, 0, 1);
  }
  if (config_json) MPT_CHECK(write_text(cfg, "model config", config_json), out);
out:
  free(index);
  free(shard_of);
  return st;
}

/* ---- config.json (st_model.h) ---- */

mpt_status mpt__st_config_read(const char *cfg_path, const char *model, const char *needs,
                               mpt__json **root) {
  *root = NULL;
  int fd;
  int64_t size;
  mpt_status st = mpt__file_open_regular(cfg_path, "model config", &fd, &size);
  if (st == MPT_ENOENT)
    return MPT_FAIL(MPT_ENOENT, "safetensors model '%s': its config '%s' does not exist (it "
                    "gives %s)", model, cfg_path, needs);
  MPT_RETURN_IF(st);
  char *text = NULL;
  if (size > ST_MAX_CONFIG_NBYTES) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s' is %lld bytes: not a config.json", cfg_path,
                  (long long)size);
    goto out;
  }
  if (!(text = malloc((size_t)size + 1))) {
    st = MPT_FAIL(MPT_ENOMEM, "model config '%s'", cfg_path);
    goto out;
  }
  MPT_CHECK(mpt__file_pread(fd, "model config", cfg_path, text, size, 0), out);
  text[size] = 0;
  char what[MPT__ST_PATH_MAX + 32];
  snprintf(what, sizeof what, "model config '%s'", cfg_path);
  MPT_CHECK(mpt__json_parse(text, size, what, root), out);
  if ((*root)->type != MPT__JSON_OBJECT) {
    mpt__json_free(*root);
    *root = NULL;
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s' is not a JSON object", cfg_path);
  }
out:
  free(text);
  close(fd);
  return st;
}

mpt_status mpt__st_config_int(const mpt__json *root, const char *cfg_path, const char *key,
                              int64_t lo, int64_t hi, const int64_t *fallback, int64_t *out) {
  const mpt__json *v = mpt__json_get(root, key);
  if (!v && fallback) {
    *out = *fallback;
    return MPT_OK;
  }
  if (!v || v->type != MPT__JSON_NUMBER || !v->is_int || v->i < lo || v->i > hi)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s %s [%lld, %lld]", cfg_path, key,
                    v ? "is not an integer in" : "is missing; an integer in", (long long)lo,
                    (long long)hi);
  *out = v->i;
  return MPT_OK;
}

mpt_status mpt__st_config_num(const mpt__json *root, const char *cfg_path, const char *key,
                              double lo, double hi, const double *fallback, double *out) {
  const mpt__json *v = mpt__json_get(root, key);
  if (!v && fallback) {
    *out = *fallback;
    return MPT_OK;
  }
  if (!v || v->type != MPT__JSON_NUMBER || !isfinite(v->d) || v->d < lo || v->d > hi)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s %s [%g, %g]", cfg_path, key,
                    v ? "is not a number in" : "is missing; a number in", lo, hi);
  *out = v->d;
  return MPT_OK;
}

mpt_status mpt__st_config_dtype(const mpt__json *root, const char *cfg_path, char dtype[12]) {
  static const char *const keys[2] = {"torch_dtype", "dtype"};
  static const struct { const char *torch, *st; } names[3] = {
      {"float32", "F32"}, {"bfloat16", "BF16"}, {"float16", "F16"}};
  dtype[0] = 0;
  for (int k = 0; k < 2; k++) {
    const mpt__json *v = mpt__json_get(root, keys[k]);
    if (!v || v->type == MPT__JSON_NULL) continue;
    for (int i = 0; i < 3 && v->type == MPT__JSON_STRING; i++)
      if (strcmp(v->s, names[i].torch) == 0) {
        snprintf(dtype, 12, "%s", names[i].st);
        return MPT_OK;
      }
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s %s%.40s%s is not float32, bfloat16 or "
                    "float16", cfg_path, keys[k], v->type == MPT__JSON_STRING ? "'" : "",
                    v->type == MPT__JSON_STRING ? v->s : "(not a string)",
                    v->type == MPT__JSON_STRING ? "'" : "");
  }
  return MPT_OK;
}

mpt_status mpt__st_check_tensor(const mpt_st_file *f, const mpt_st_tensor *t, int ndim,
                                const int64_t *shape, const char *cfg_dtype,
                                const char *cfg_path) {
  const char *file = mpt_st_shard_path(f, t->shard);
  if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16"))
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' is %s; F32, BF16 and F16 "
                    "are read", file, t->name, t->dtype);
  if (cfg_dtype[0] && strcmp(t->dtype, cfg_dtype) != 0)
    return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' is %s, the config '%s' "
                    "gives %s (torch_dtype)", file, t->name, t->dtype, cfg_path, cfg_dtype);
  int same = t->ndim == ndim;
  for (int d = 0; d < ndim && same; d++) same = t->shape[d] == shape[d];
  if (same) return MPT_OK;
  char got[160] = "", want[160] = "";
  for (int d = 0; d < t->ndim && strlen(got) < 120; d++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
             (long long)t->shape[d]);
  for (int d = 0; d < ndim && strlen(want) < 120; d++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
             (long long)shape[d]);
  return MPT_FAIL(MPT_EFORMAT, "safetensors file '%s': tensor '%s' has shape [%s], the config "
                  "'%s' gives [%s]", file, t->name, got, cfg_path, want);
}

const char *mpt__st_torch_dtype(mpt_st_dtype dtype) {
  return dtype == MPT_ST_BF16 ? "bfloat16" : "float32";
}
