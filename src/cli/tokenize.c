/* `mpitrain tokenize --bytes [--val-fraction F] [--shard-tokens N] -o DIR FILE...`: plain text
 * to llm.c token shards (include/mpitrain/data.h), byte-level: every byte is one token
 * (vocabulary 256), so the shards train a byte-level language model (nats per byte).
 *
 * Split: of each file's n bytes, the first n - floor(F n) go to the training stream and the
 * last floor(F n) to the validation stream, so validation text comes from every file (not only
 * from the last ones). The streams are cut into shards of at most --shard-tokens tokens,
 * written atomically as DIR/train_000000.bin, DIR/train_000001.bin, ... and
 * DIR/val_000000.bin, ... (no val shard when it would be empty). DIR is created if missing;
 * a DIR that already holds train_*.bin or val_*.bin is refused, so a glob over it never mixes
 * two runs. Every input is checked (a readable regular file) before anything is written, and a
 * run that fails midway removes the shards it wrote. Files are read in 64 KiB chunks, one at
 * a time; memory is the two shard buffers (at most 2 x --shard-tokens uint16). */
#include <errno.h>
#include <getopt.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/tokenize.h"
#include "mpitrain/data.h"

#define DEFAULT_SHARD_TOKENS 100000000LL /* as llm.c's data scripts (10^8 tokens per shard) */

static const char *usage_text =
    "usage: mpitrain tokenize --bytes [options] -o DIR FILE...\n"
    "Writes llm.c token shards (magic 20240520) from plain text.\n"
    "  --bytes               byte-level tokens: each byte is a token (vocabulary 256); required\n"
    "  --val-fraction F      the last floor(F * n) bytes of each file go to the validation\n"
    "                        shards, F in [0, 1) (default 0.1)\n"
    "  --shard-tokens N      at most N tokens per shard (default 100000000)\n"
    "  -o, --output DIR      folder for train_NNNNNN.bin and val_NNNNNN.bin (created if missing;\n"
    "                        must not already hold shards)\n"
    "  -h, --help            this text\n"
    "example (Debian's fortunes package):\n"
    "  mpitrain tokenize --bytes --val-fraction 0.1 -o data/fortunes \\\n"
    "      $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)\n";

typedef struct stream {
  const char *dir, *prefix; /* DIR, "train" / "val" */
  uint16_t *buf;
  int64_t fill, cap;
  int shards;
  int64_t tokens;
} stream;

static int stream_flush(stream *s) {
  if (s->fill == 0) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, s->shards);
  if (mpt_token_shard_write(path, s->buf, s->fill) != MPT_OK) {
    fprintf(stderr, "mpitrain tokenize: %s\n", mpt_last_error());
    return 1;
  }
  printf("  %s  %lld tokens\n", path, (long long)s->fill);
  s->shards++;
  s->tokens += s->fill;
  s->fill = 0;
  return 0;
}

static int stream_put(stream *s, const unsigned char *bytes, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (s->fill == s->cap && stream_flush(s) != 0) return 1;
    s->buf[s->fill++] = bytes[i];
  }
  return 0;
}

/* Whether `name` is PREFIX*.bin (what a glob 'DIR/PREFIX*.bin' over DIR takes). */
static int is_shard_name(const char *name, const char *prefix) {
  const size_t n = strlen(name), p = strlen(prefix);
  return n >= p + 4 && strncmp(name, prefix, p) == 0 && strcmp(name + n - 4, ".bin") == 0;
}

/* mkdir -p */
static int make_dir(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return ENAMETOOLONG;
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return errno;
    *p = '/';
  }
  if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return errno;
  struct stat sb;
  if (stat(tmp, &sb) != 0) return errno;
  return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
}

/* Whether `path` is a regular file this process can open for reading; prints the error and
 * returns -1 if not, else its size in bytes. */
static int64_t check_input(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    fprintf(stderr, "mpitrain tokenize: cannot read '%s': %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    fprintf(stderr, "mpitrain tokenize: '%s' is not a regular file%s\n", path,
            S_ISDIR(sb.st_mode) ? " (it is a directory: give its files)" : "");
    return -1;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "mpitrain tokenize: cannot read '%s': %s\n", path, strerror(errno));
    return -1;
  }
  fclose(f);
  return (int64_t)sb.st_size;
}

/* Removes the shards this run wrote, so that a failed run leaves no partial data set behind
 * (nor one that makes the next run refuse the folder). */
static void stream_remove(const stream *s) {
  for (int i = 0; i < s->shards; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, i);
    unlink(path);
  }
}

/* Streams one file into the streams, in chunks (memory does not grow with the file): of its n
 * bytes (its size when checked) the first n - floor(F n) go to training, the rest to
 * validation. Prints the error and returns 1 on failure (unreadable, or a size that changed). */
static int tokenize_file(const char *path, double frac, stream st[2]) {
  const int64_t n = check_input(path);
  if (n < 0) return 1;
  int64_t nval = (int64_t)(frac * (double)n);
  if (nval > n) nval = n;
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "mpitrain tokenize: cannot read '%s': %s\n", path, strerror(errno));
    return 1;
  }
  unsigned char chunk[1 << 16];
  int64_t done = 0;
  size_t got;
  int bad = 0, grew = 0;
  while (!bad && (got = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if ((grew = done + (int64_t)got > n)) break; /* reported below */
    int64_t to_train = n - nval - done;
    to_train = to_train < 0 ? 0 : to_train > (int64_t)got ? (int64_t)got : to_train;
    bad = stream_put(&st[0], chunk, to_train) ||
          stream_put(&st[1], chunk + to_train, (int64_t)got - to_train);
    done += (int64_t)got;
  }
  if (!bad && (ferror(f) || grew || done != n || fgetc(f) != EOF)) {
    fprintf(stderr, "mpitrain tokenize: cannot read '%s': %s\n", path,
            ferror(f) ? "read error" : "its size changed while being read");
    bad = 1;
  }
  fclose(f);
  return bad;
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "mpitrain tokenize: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(`mpitrain tokenize --help` lists the options)\n");
  return 2;
}

int mpt_cli_tokenize(int argc, char **argv) {
  static const struct option opts[] = {{"bytes", no_argument, NULL, 'b'},
                                       {"val-fraction", required_argument, NULL, 'v'},
                                       {"shard-tokens", required_argument, NULL, 's'},
                                       {"output", required_argument, NULL, 'o'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int bytes = 0;
  double frac = 0.1;
  long long shard_tokens = DEFAULT_SHARD_TOKENS;
  const char *dir = NULL;
  optind = 0;
  opterr = 0;
  for (;;) {
    int c = getopt_long(argc, argv, ":o:h", opts, NULL);
    if (c == -1) break;
    char *end = NULL;
    switch (c) {
      case 'b': bytes = 1; break;
      case 'v':
        errno = 0;
        frac = strtod(optarg, &end);
        if (errno == ERANGE && frac < 1 && frac > -1) errno = 0; /* an underflow: ~0 */
        if (errno || end == optarg || *end || !(frac >= 0.0 && frac < 1.0))
          return usage_error("--val-fraction '%s' must be a number in [0, 1)", optarg);
        break;
      case 's':
        errno = 0;
        shard_tokens = strtoll(optarg, &end, 10);
        if (errno || end == optarg || *end || shard_tokens < 1 ||
            shard_tokens > MPT_SHARD_MAX_TOKENS)
          return usage_error("--shard-tokens '%s' must be an integer in [1, 2147483647]", optarg);
        break;
      case 'o': dir = optarg; break;
      case 'h': printf("%s", usage_text); return 0;
      case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
      default: return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (!bytes)
    return usage_error("%sgive --bytes: only the byte-level tokenizer (vocabulary 256) exists",
                       "");
  if (!dir || !dir[0]) return usage_error("%sgive the output folder with -o DIR", "");
  if (optind >= argc) return usage_error("%sgive at least one text FILE", "");

  /* Every input is checked before anything is written: a missing or unreadable file is
   * reported with the folder untouched. */
  int64_t total = 0;
  for (int i = optind; i < argc; i++) {
    int64_t size = check_input(argv[i]);
    if (size < 0) return 1;
    total += size;
  }
  if (total == 0) { /* nothing to write: no folder either */
    fprintf(stderr, "mpitrain tokenize: no text to tokenize: %s %s empty; nothing written "
            "(no folder made)\n", argc - optind == 1 ? argv[optind] : "the files given",
            argc - optind == 1 ? "is" : "are all");
    return 1;
  }
  struct stat dir_sb;
  const int dir_existed = stat(dir, &dir_sb) == 0;
  int e = make_dir(dir);
  if (e != 0) {
    fprintf(stderr, "mpitrain tokenize: cannot create the folder '%s': %s\n", dir, strerror(e));
    return 1;
  }
  /* Read as a folder, not as a glob: a DIR with glob characters ('data[1]') matched other
   * folders and the check passed while DIR held shards. */
  const char *held = NULL;
  DIR *dp = opendir(dir);
  if (!dp) {
    fprintf(stderr, "mpitrain tokenize: cannot read the folder '%s': %s\n", dir, strerror(errno));
    return 1;
  }
  for (struct dirent *de; !held && (de = readdir(dp)) != NULL;)
    if (is_shard_name(de->d_name, "train_") || is_shard_name(de->d_name, "val_"))
      held = de->d_name;
  if (held) {
    fprintf(stderr, "mpitrain tokenize: '%s' already holds shards (%s/%s, ...): remove them or "
            "choose another -o folder\n", dir, dir, held);
    closedir(dp);
    return 1;
  }
  closedir(dp);

  int rc = 1;
  stream st[2] = {{dir, "train", NULL, 0, shard_tokens, 0, 0}, {dir, "val", NULL, 0, shard_tokens, 0, 0}};
  /* Shard buffers no larger than the input needs. */
  int64_t cap = total + 1 < shard_tokens ? total + 1 : shard_tokens;
  for (int k = 0; k < 2; k++) {
    st[k].cap = cap;
    st[k].buf = malloc((size_t)cap * sizeof(uint16_t));
    if (!st[k].buf) {
      fprintf(stderr, "mpitrain tokenize: out of memory for %lld tokens\n", (long long)cap);
      goto out;
    }
  }
  printf("tokenize: %d file%s, %lld bytes, byte-level (vocabulary 256), validation fraction "
         "%.10g\n", argc - optind, argc - optind == 1 ? "" : "s", (long long)total, frac);
  for (int i = optind; i < argc; i++) {
    if (tokenize_file(argv[i], frac, st) != 0) goto out;
  }
  if (stream_flush(&st[0]) != 0 || stream_flush(&st[1]) != 0) goto out;
  if (st[0].tokens == 0) {
    fprintf(stderr, "mpitrain tokenize: the input holds no training text (%lld bytes)\n",
            (long long)total);
    goto out;
  }
  printf("tokenize: %lld training tokens in %d shard%s, %lld validation tokens in %d shard%s\n",
         (long long)st[0].tokens, st[0].shards, st[0].shards == 1 ? "" : "s",
         (long long)st[1].tokens, st[1].shards, st[1].shards == 1 ? "" : "s");
  rc = 0;
out:
  if (rc != 0) {
    stream_remove(&st[0]);
    stream_remove(&st[1]);
    if (!dir_existed) (void)rmdir(dir); /* the folder this run made (empty by now) */
  }
  free(st[0].buf);
  free(st[1].buf);
  return rc;
}
