/* The ranks' agreement checks of the loop (options, epoch, parameters), the output paths, the
 * parameter file, and the fault injection the tests use (MPT_TEST_* variables, src/core/fault.h).
 * Runs on the training thread; the checks are collective over the run's comm. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/atomic_file.h"
#include "core/fault.h"
#include "train/train_impl.h"

/* The parameters on the host: the flat buffer itself on the CPU, else a copy (synchronised). */
mpt_status mpt__train_params_on_host(mpt__trainer *t, float **host) {
  if (t->device.type == MPT_DEVICE_CPU) {
    *host = mpt_model_params(t->model);
    return MPT_OK;
  }
  size_t nbytes = (size_t)mpt_model_param_count(t->model) * sizeof(float);
  if (!t->host_params && !(t->host_params = malloc(nbytes ? nbytes : 1)))
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate a host copy of the parameters");
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, mpt_device_cpu(), t->host_params, t->device,
                              mpt_model_params(t->model), nbytes));
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, t->c.timeout_s * 1e3));
  *host = t->host_params;
  return MPT_OK;
}

/* Fault injection for the tests: MPT_TEST_NAN_RANK=r and MPT_TEST_NAN_STEP=s put a NaN into
 * rank r's first micro-batch of step s (numbered from 1, as the step lines and checkpoints). */
void mpt__train_maybe_poison(mpt__trainer *t, mpt_train_batch *b, int k) {
  const char *r = mpt__test_env("MPT_TEST_NAN_RANK");
  const char *s = mpt__test_env("MPT_TEST_NAN_STEP");
  if (k == 0 && r && s && atoi(r) == t->rank && atoll(s) == t->global_step + 1)
    if (b->input.dtype == MPT_F32) ((float *)b->input.data)[0] = NAN;
}

/* Fault injection for the tests: MPT_TEST_PERTURB_RANK=r and MPT_TEST_PERTURB_STEP=s change one
 * parameter of rank r after global step s, so that its replica diverges. */
void mpt__train_maybe_perturb(mpt__trainer *t) {
  const char *r = mpt__test_env("MPT_TEST_PERTURB_RANK");
  const char *s = mpt__test_env("MPT_TEST_PERTURB_STEP");
  if (!(r && s && atoi(r) == t->rank && atoll(s) == t->global_step)) return;
  float v;
  float *p = mpt_model_params(t->model);
  if (mpt_op_memcpy(t->stream, mpt_device_cpu(), &v, t->device, p, sizeof v) != MPT_OK ||
      mpt_stream_synchronize(t->stream, t->c.timeout_s * 1e3) != MPT_OK)
    return;
  v += 1e-3f;
  mpt_op_memcpy(t->stream, t->device, p, mpt_device_cpu(), &v, sizeof v);
  mpt_stream_synchronize(t->stream, t->c.timeout_s * 1e3);
}

/* --check-replicas: a CRC-32 of the parameter bytes, all-gathered; names the first rank whose
 * replica differs from rank 0's. */
mpt_status mpt__train_check_replicas(mpt__trainer *t) {
  if (t->world == 1) return MPT_OK;
  uLong crc = crc32(0L, Z_NULL, 0);
  float *host;
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_gather_params(t->ddp)); /* ZeRO-3: whole to compare */
  MPT_RETURN_IF(mpt__train_params_on_host(t, &host));
  const unsigned char *p = (const unsigned char *)host;
  size_t left = (size_t)mpt_model_param_count(t->model) * sizeof(float);
  while (left > 0) {
    uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  int32_t mine = (int32_t)(uint32_t)crc, *all = malloc(sizeof(int32_t) * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the replica check");
  mpt_status st = mpt_comm_allgather_sync(t->comm, &mine, all, 1, MPT_I32);
  for (int r = 1; st == MPT_OK && r < t->world; r++)
    if (all[r] != all[0])
      st = MPT_FAIL(MPT_EMISMATCH,
                    "replicas diverged after step %" PRId64 ": rank %d's parameters (CRC-32 "
                    "%08x) differ from rank 0's (%08x)",
                    t->global_step, r, (unsigned)all[r], (unsigned)all[0]);
  free(all);
  return st;
}

/* Fault injection for the tests of the failure model (docs/faults.md F10): MPT_TEST_KILL_RANK=r and
 * MPT_TEST_KILL_STEP=s make rank r kill itself with SIGKILL before global step s. */
void mpt__train_maybe_kill_self(mpt__trainer *t) {
  const char *r = mpt__test_env("MPT_TEST_KILL_RANK");
  const char *s = mpt__test_env("MPT_TEST_KILL_STEP");
  if (r && s && atoi(r) == t->rank && atoll(s) == t->global_step) {
    fprintf(stderr, "mpitrain: rank %d: killing itself at step %" PRId64 " (MPT_TEST_KILL_*)\n",
            t->rank, t->global_step);
    raise(SIGKILL);
  }
}

/* Fault injection for the hang tests (docs/hangs.md): MPT_TEST_STOP_RANK=r and
 * MPT_TEST_STOP_STEP=s make rank r stop itself with SIGSTOP before global step s, between two
 * collectives, as a rank stuck in its compute would (a SIGSTOP from outside may land inside a
 * collective, where the stopped rank looks like the ranks waiting for it). */
void mpt__train_maybe_stop_self(mpt__trainer *t) {
  const char *r = mpt__test_env("MPT_TEST_STOP_RANK");
  const char *s = mpt__test_env("MPT_TEST_STOP_STEP");
  if (r && s && atoi(r) == t->rank && atoll(s) == t->global_step) {
    fprintf(stderr, "mpitrain: rank %d: stopping itself at step %" PRId64 " (MPT_TEST_STOP_*)\n",
            t->rank, t->global_step);
    raise(SIGSTOP);
  }
}

/* Fault injection for the hang tests (docs/hangs.md): MPT_TEST_SKIP_STEP_RANK=r and
 * MPT_TEST_SKIP_STEP=s make rank r skip global step s (none of its collectives), as a rank whose
 * control flow diverged would. */
int mpt__train_maybe_skip_step(mpt__trainer *t) {
  const char *r = mpt__test_env("MPT_TEST_SKIP_STEP_RANK");
  const char *s = mpt__test_env("MPT_TEST_SKIP_STEP");
  if (!(r && s && atoi(r) == t->rank && atoll(s) == t->global_step)) return 0;
  fprintf(stderr, "mpitrain: rank %d: skipping step %" PRId64 " (MPT_TEST_SKIP_STEP_*)\n",
          t->rank, t->global_step);
  t->global_step++;
  return 1;
}

/* Fault injection for the straggler tests: MPT_TEST_SLOW_RANK=r and MPT_TEST_SLOW_PCT=p make
 * rank r sleep p % of each forward's time after it (counted as forward: compute). */
void mpt__train_maybe_slow(mpt__trainer *t, double ms) {
  const char *r = mpt__test_env("MPT_TEST_SLOW_RANK");
  const char *p = mpt__test_env("MPT_TEST_SLOW_PCT");
  if (!(r && p && atoi(r) == t->rank)) return;
  const double ns = ms * 1e6 * atof(p) / 100;
  if (!(ns > 0)) return;
  struct timespec ts = {(time_t)(ns / 1e9), (long)fmod(ns, 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Fault case F02: every rank must be at the same epoch (the sampler's shuffle depends on it).
 * For the tests, MPT_TEST_EPOCH_SKEW_RANK=r makes rank r report one epoch ahead. */
mpt_status mpt__train_check_epoch(mpt__trainer *t, int64_t epoch) {
  if (t->world == 1) return MPT_OK;
  const char *skew = mpt__test_env("MPT_TEST_EPOCH_SKEW_RANK");
  if (skew && atoi(skew) == t->rank) epoch++;
  int32_t mine = (int32_t)epoch, *all = malloc(sizeof(int32_t) * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the epoch check");
  mpt_status st = mpt_comm_allgather_sync(t->comm, &mine, all, 1, MPT_I32);
  for (int r = 1; st == MPT_OK && r < t->world; r++)
    if (all[r] != all[0])
      st = MPT_FAIL(MPT_EMISMATCH, "ranks disagree on the epoch: rank %d is at epoch %d, rank 0 "
                                   "at epoch %d",
                    r, all[r] + 1, all[0] + 1);
  free(all);
  return st;
}

/* An output path may be a new file or a regular file (replaced by rename); never a device, a
 * directory or a symbolic link, which a rename would destroy. */
mpt_status mpt_trainer_check_output_path(const char *option, const char *path) {
  struct stat sb;
  if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return MPT_FAIL(MPT_EINVAL, "%s '%s' exists and is not a regular file (%s): refusing to "
                                "replace it",
                    option, path,
                    S_ISDIR(sb.st_mode) ? "a directory" : S_ISLNK(sb.st_mode) ? "a symbolic link"
                                                                             : "a device or special file");
  /* Its folder must exist and be writable now, not only when the file is written at the end
   * of the run. */
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else slash[slash == dir] = '\0'; /* "/x" -> "/" */
  const char *why = NULL;
  if (stat(dir, &sb) != 0) why = strerror(errno);
  else if (!S_ISDIR(sb.st_mode)) why = "not a directory";
  else if (access(dir, W_OK | X_OK) != 0) why = strerror(errno);
  if (why)
    return MPT_FAIL(MPT_EINVAL, "%s '%s': its folder '%s' cannot take the file (%s)", option,
                    path, dir, why);
  return MPT_OK;
}

/* Whether two paths name the same file: both exist with the same device and inode, or neither
 * exists and they spell the same path once their folders are resolved. */
static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
  if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
  snprintf(da, sizeof da, "%s", a);
  snprintf(db, sizeof db, "%s", b);
  char *ba = strrchr(da, '/'), *bb = strrchr(db, '/');
  const char *na = ba ? ba + 1 : a, *nb = bb ? bb + 1 : b;
  if (strcmp(na, nb) != 0) return 0;
  if (ba) ba[ba == da] = '\0'; /* "/x" -> "/" */
  if (bb) bb[bb == db] = '\0';
  return realpath(ba ? da : ".", ra) && realpath(bb ? db : ".", rb) && strcmp(ra, rb) == 0;
}

/* Rank 0, at start-up (faults.md F48): save_params, metrics_json and trace are none of the
 * run's inputs (the caller's input files, the resume checkpoint) and no two of them the same file
 * (by device and inode, or by path for files not yet there): each is replaced at the end. */
mpt_status mpt__train_check_outputs(const mpt__trainer *t) {
  const mpt_trainer_config *o = &t->c;
  enum { NOUT = 3 };
  const char *out_name[NOUT] = {"--save-params", "--metrics-json", "--trace"};
  const char *out[NOUT] = {o->save_params, o->metrics_json, o->trace};
  char ckpt[PATH_MAX] = "";
  if (o->resume[0] && strcmp(o->resume, "auto") != 0 &&
      mpt_ckpt_resolve(o->resume, ckpt, sizeof ckpt) != MPT_OK)
    ckpt[0] = '\0';
  for (int k = 0; k < NOUT; k++) {
    if (!out[k][0]) continue;
    if (ckpt[0] && same_file(out[k], ckpt))
      return MPT_FAIL(MPT_EINVAL, "%s '%s' is the --resume checkpoint ('%s'): the run would "
                      "replace its own input (give another path)", out_name[k], out[k], ckpt);
    for (const char *p = o->input_paths; p && *p;) { /* one path per line */
      size_t len = strcspn(p, "\n");
      char in[PATH_MAX];
      snprintf(in, sizeof in, "%.*s", (int)(len < sizeof in ? len : sizeof in - 1), p);
      if (in[0] && same_file(out[k], in))
        return MPT_FAIL(MPT_EINVAL, "%s '%s' is an input of the run ('%s'): the run would "
                        "replace its own input (give another path)", out_name[k], out[k], in);
      p += len + (p[len] == '\n');
    }
    for (int j = 0; j < k; j++)
      if (out[j][0] && same_file(out[k], out[j]))
        return MPT_FAIL(MPT_EINVAL, "%s '%s' and %s '%s' are the same file: one would replace "
                        "the other (give two paths)", out_name[j], out[j], out_name[k], out[k]);
  }
  return MPT_OK;
}

/* The parameters on the host: the flat buffer itself on the CPU, else a new copy (synchronised;
 * *host is then the caller's to free). */
static mpt_status params_on_host(mpt_model *model, mpt_stream *stream, float **host) {
  const mpt_device dev = mpt_model_device(model);
  const size_t nbytes = (size_t)mpt_model_param_count(model) * sizeof(float);
  *host = NULL;
  if (dev.type == MPT_DEVICE_CPU) return MPT_OK;
  float *h = malloc(nbytes ? nbytes : 1);
  if (!h) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a host copy of the parameters");
  mpt_status st = mpt_op_memcpy(stream, mpt_device_cpu(), h, dev, mpt_model_params(model), nbytes);
  if (st == MPT_OK) st = mpt_stream_synchronize(stream, 300000.0);
  if (st != MPT_OK) {
    free(h);
    return st;
  }
  *host = h;
  return MPT_OK;
}

mpt_status mpt_trainer_save_params(mpt_model *model, mpt_stream *stream, const char *path) {
  if (!model || !path) return MPT_FAIL(MPT_EINVAL, "mpt_trainer_save_params: NULL argument");
  MPT_RETURN_IF(mpt_trainer_check_output_path("--save-params", path));
  mpt__afile af; /* written whole, then renamed into place (core/atomic_file.h) */
  MPT_RETURN_IF(mpt__afile_open(&af, path, "--save-params"));
  const size_t n = (size_t)mpt_model_param_count(model);
  float *host = NULL;
  mpt_status st = params_on_host(model, stream, &host);
  if (st == MPT_OK)
    st = mpt__afile_write(&af, host ? host : mpt_model_params(model), n * sizeof(float));
  if (st == MPT_OK) st = mpt__afile_commit(&af);
  mpt__afile_abort(&af);
  free(host);
  return st;
}

/* 64-bit FNV-1a of `n` bytes, continuing from `h`. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

/* Argument i of the options (argv[1..]) as two int32 of its hash (NUL included); a missing
 * argument hashes as a value no argument has (an argument always ends with its NUL). */
static void arg_hash(int argc, char **argv, int i, int32_t out[2]) {
  uint64_t h = i + 1 < argc ? fnv1a(FNV_OFFSET, argv[i + 1], strlen(argv[i + 1]) + 1)
                               : FNV_OFFSET;
  out[0] = (int32_t)(uint32_t)h;
  out[1] = (int32_t)(uint32_t)(h >> 32);
}

/* Every rank must run with the same options: a rank started with other options would issue
 * other collectives (a hang until the deadline) or train another model (a silent wrong answer).
 * The whole command lines are compared, whatever their length: a 64-bit hash of every argument
 * (all-gathered with the count); when they differ, the hashes of each argument find the first
 * that differs from rank 0's, and it is named (with the argument before it), cut at WORD bytes. */
mpt_status mpt__train_check_same_options(mpt_comm *comm, int argc, char **argv) {
  const int world = mpt_comm_world_size(comm);
  if (world == 1) return MPT_OK;
  enum { WORD = 256 };
  const size_t W = (size_t)world;
  mpt_status st = MPT_OK;
  int32_t *all = NULL, *hashes = NULL;
  char *words = NULL, *mine = NULL;
  uint64_t h = FNV_OFFSET;
  for (int i = 1; i < argc; i++) h = fnv1a(h, argv[i], strlen(argv[i]) + 1);
  int32_t head[3] = {argc - 1, (int32_t)(uint32_t)h, (int32_t)(uint32_t)(h >> 32)};
  if (!(all = malloc(sizeof(int32_t) * 3 * W))) goto nomem;
  MPT_CHECK(mpt_comm_allgather_sync(comm, head, all, 3, MPT_I32), done);
  int same = 1, nmax = 0;
  for (size_t r = 0; r < W; r++) {
    same = same && memcmp(all + 3 * r, all, sizeof head) == 0;
    if (all[3 * r] > nmax) nmax = all[3 * r];
  }
  if (same) goto done;
  /* Collective from here on: every rank saw the same table and takes this branch. */
  const size_t per = 2 * (size_t)nmax;
  if (!(hashes = malloc(sizeof(int32_t) * (per ? per : 1) * (W + 1)))) goto nomem;
  int32_t *my_hashes = hashes + per * W;
  for (int i = 0; i < nmax; i++) arg_hash(argc, argv, i, my_hashes + 2 * i);
  MPT_CHECK(mpt_comm_allgather_sync(comm, my_hashes, hashes, (int64_t)per, MPT_I32), done);
  int bad = -1, at = 0;
  for (size_t r = 1; r < W && bad < 0; r++)
    for (int i = 0; i < nmax; i++)
      if (memcmp(hashes + per * r + 2 * i, hashes + 2 * i, 2 * sizeof(int32_t)) != 0) {
        bad = (int)r;
        at = i;
        break;
      }
  if (bad < 0) { /* only hash collisions of whole lines could get here */
    st = MPT_FAIL(MPT_EMISMATCH, "ranks were started with different options (every rank must run "
                                 "the same command line)");
    goto done;
  }
  /* Everybody's argument `at` and the one before it, cut at WORD - 1 bytes. */
  if (!(words = calloc(2 * WORD, W + 1))) goto nomem;
  mine = words + 2 * WORD * W;
  for (int j = 0; j < 2; j++) {
    int i = at - 1 + j;
    if (i >= 0 && i + 1 < argc) snprintf(mine + j * WORD, WORD, "%s", argv[i + 1]);
  }
  MPT_CHECK(mpt_comm_allgather_sync(comm, mine, words, 2 * WORD, MPT_U8), done);
  const char *a = words + WORD, *b = words + 2 * WORD * (size_t)bad + WORD;
  const char *prev = at > 0 ? words : NULL;
  st = MPT_FAIL(MPT_EMISMATCH,
                "ranks were started with different options: rank %d has '%s' where rank 0 "
                "has '%s'%s%s%s (argument %d; every rank must run the same command line)",
                bad, at < all[3 * bad] ? b : "(end of options)",
                at < all[0] ? a : "(end of options)", prev ? " (after '" : "", prev ? prev : "",
                prev ? "')" : "", at + 1);
  goto done;
nomem:
  st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the option check");
done:
  free(all);
  free(hashes);
  free(words);
  return st;
}
