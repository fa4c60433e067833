/* `mpitrain ckpt info FILE|DIR`: validates a checkpoint (a directory: its newest one, as
 * --resume picks it) with the library's reader, CRC included, and prints its format version,
 * what it holds (tensor and value counts, optimizer state), the training position (global
 * step, epoch, samples of the epoch consumed), the world size and global batch that wrote it,
 * and the run settings it records, then the model and run options of the run-options.txt the
 * trainer keeps in the same folder. One process, no MPI; nothing is allocated from the file's
 * values (mpt_ckpt_read_info validates before it returns anything). */
#include "cli/ckpt_info.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "mpitrain/ckpt.h"
#include "mpitrain/core.h"
#include "mpitrain/optim.h"

static const char usage[] =
    "usage: mpitrain ckpt info FILE|DIR\n"
    "  Verifies a checkpoint (its size and CRC-32 over every byte, every field) and prints\n"
    "  what it holds: format version, parameter and buffer tensors and values, optimizer\n"
    "  state, global step, epoch, samples of the epoch consumed, the world size that wrote it,\n"
    "  the global batch G (ranks x batch per rank x accumulate), the seed, the data set\n"
    "  size, and the model and run options of the folder's run-options.txt. A directory\n"
    "  means its newest checkpoint (ckpt-step<N>.mpt with the highest N), the one\n"
    "  `--resume DIR` would load.\n"
    "  Exit status: 0 the checkpoint verifies, 1 it does not (missing, not a checkpoint,\n"
    "  truncated, corrupt, a newer format), 2 bad usage.\n";

enum { MAX_OPTION_LINES = 256, LINE = 512 };

/* The folder of `path` into dir[n] ("." when it has none). */
static void folder_of(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, n, ".");
  else if (slash == path)
    snprintf(dir, n, "/");
  else
    snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* Prints "model: NAME" and the run options the trainer recorded next to the checkpoint
 * (FOLDER/run-options.txt, "key value" lines), or says they are not there. The file is
 * untrusted: at most MAX_OPTION_LINES lines, each cut at LINE bytes, unprintable bytes as '?'. */
static void print_run_options(const char *path) {
  char dir[PATH_MAX], file[PATH_MAX + 32], line[LINE];
  folder_of(path, dir, sizeof dir);
  snprintf(file, sizeof file, "%s/run-options.txt", dir);
  FILE *f = fopen(file, "r");
  if (!f) {
    printf("model: not recorded (no %s next to the checkpoint)\n", file);
    return;
  }
  char model[LINE] = "";
  int n = 0;
  while (n < MAX_OPTION_LINES && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    for (char *c = line; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
    if (strncmp(line, "model ", 6) == 0 && !model[0]) snprintf(model, sizeof model, "%s", line + 6);
    n++;
  }
  printf("model: %s\n", model[0] ? model : "not recorded");
  rewind(f);
  printf("run options (%s):\n", file);
  for (int i = 0; i < n && fgets(line, sizeof line, f); i++) {
    line[strcspn(line, "\r\n")] = '\0';
    for (char *c = line; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
    printf("  %s\n", line);
  }
  fclose(f);
}

static double mib(uint64_t values) { return (double)values * 4.0 / (1024.0 * 1024.0); }

/* Prints the library's last error, without the " (at file:line, rank R)" it ends with: this
 * tool is one process, and the place in the source means nothing to its reader. */
static void print_error(mpt_status st) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", mpt_last_error());
  char *at = strstr(msg, " (at ");
  for (char *next = at; next; next = strstr(next + 1, " (at ")) at = next;
  if (at && strstr(at, ", rank ") && at[strlen(at) - 1] == ')') *at = '\0';
  fprintf(stderr, "mpitrain ckpt info: %s: %s\n", mpt_status_message(st), msg);
}

static int info(const char *arg) {
  char path[PATH_MAX];
  struct stat sb;
  if (stat(arg, &sb) != 0) { /* said plainly: nothing was read, so no checksum line */
    fprintf(stderr, "mpitrain ckpt info: %s: %s\n", arg,
            errno == ENOENT ? "no such file or directory" : strerror(errno));
    return 1;
  }
  mpt_status st = mpt_ckpt_resolve(arg, path, sizeof path);
  if (st != MPT_OK) { /* a folder without a checkpoint: no file was read either */
    print_error(st);
    return 1;
  }
  mpt_ckpt_info in;
  st = mpt_ckpt_read_info(path, &in);
  if (st != MPT_OK) {
    print_error(st);
    /* NOT OK only where the CRC was computed and differs; other faults stop the reader first */
    printf("file: %s\nchecksum: %s\n", path,
           strstr(mpt_last_error(), "CRC-32 mismatch") ? "NOT OK" : "not verified");
    return 1;
  }
  const mpt_ckpt_meta *m = &in.meta;
  printf("file: %s\n", path);
  printf("format version: %" PRIu32 "\n", m->format_version);
  printf("size: %" PRIu64 " bytes\n", in.file_nbytes);
  printf("checksum: OK (CRC-32 0x%08" PRIx32 " over every byte)\n", in.crc);
  printf("parameters: %d tensors, %" PRIu64 " values (%.2f MiB)\n", (int)in.num_params,
         in.param_count, mib(in.param_count));
  printf("buffers: %d tensors, %" PRIu64 " values\n", (int)in.num_buffers, in.buffer_count);
  if (in.optimizer_kind == MPT_CKPT_NO_OPTIMIZER)
    printf("optimizer: none\n");
  else
    printf("optimizer: %s, %d state buffer(s) of %" PRIu64 " values, step count %" PRId64 "\n",
           mpt_optimizer_kind_name((mpt_optim_kind)in.optimizer_kind),
           (int)in.optimizer_nbuffers, in.optimizer_count, in.optimizer_step_count);
  printf("global step: %" PRId64 "\n", m->global_step);
  /* m->epoch counts from 0 (the epoch in progress); the training log counts from 1 */
  if (m->step_in_epoch == 0 && m->epoch > 0)
    printf("epoch: %" PRId64 " complete (counted from 1, as the training log does)\n", m->epoch);
  else
    printf("epoch: %" PRId64 " (counted from 1, as the training log does)\n", m->epoch + 1);
  printf("step in epoch: %" PRId64 "\n", m->step_in_epoch);
  printf("world size: %d\n", (int)m->world_size);
  printf("seed: %" PRIu64 "\n", m->seed);
  if (m->format_version >= 2) {
    printf("samples consumed in epoch: %" PRId64 " of %" PRId64 "\n", m->epoch_cursor,
           m->epoch_samples);
    /* G = ranks x samples per micro-batch x accumulate; a language model's sample is one
     * window of --batch-size rows, so its batch size is not that factor */
    const int64_t per_micro = m->world_size > 0 && m->accumulate > 0
        ? m->global_batch / ((int64_t)m->world_size * m->accumulate) : m->batch_size;
    if (per_micro == m->batch_size)
      printf("global batch: %" PRId64 " (%d rank%s x batch %" PRId64 " x accumulate %d)\n",
             m->global_batch, (int)m->world_size, m->world_size == 1 ? "" : "s", m->batch_size,
             (int)m->accumulate);
    else
      printf("global batch: %" PRId64 " (%d rank%s x %" PRId64 " x accumulate %d; a sample is "
             "one window of batch %" PRId64 " x the sequence length)\n", m->global_batch,
             (int)m->world_size, m->world_size == 1 ? "" : "s", per_micro, (int)m->accumulate,
             m->batch_size);
    printf("batch size: %" PRId64 "\n", m->batch_size);
    printf("accumulate: %d\n", (int)m->accumulate);
    printf("data set: %" PRId64 " training samples\n", m->dataset_count);
  } else {
    printf("samples consumed in epoch: not recorded (format version 1)\n");
    printf("global batch: not recorded (format version 1)\n");
  }
  printf("RNG states: %d\n", (int)m->num_rngs);
  print_run_options(path);
  return 0;
}

int mpt_cli_ckpt(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    }
  if (argc < 2) {
    fprintf(stderr, "mpitrain ckpt: no subcommand (`info`)\n%s", usage);
    return 2;
  }
  if (strcmp(argv[1], "info") != 0) {
    fprintf(stderr, "mpitrain ckpt: unknown subcommand '%s' (`info`)\n%s", argv[1], usage);
    return 2;
  }
  if (argc != 3 || argv[2][0] == '\0' || (argv[2][0] == '-' && argv[2][1] != '\0')) {
    fprintf(stderr, "mpitrain ckpt info: %s\n%s",
            argc < 3 ? "no checkpoint file or directory given"
                     : argc > 3 ? "give one checkpoint file or directory"
                                : "unknown option or empty path",
            usage);
    return 2;
  }
  return info(argv[2]);
}
