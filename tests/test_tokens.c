/* Tests for src/data/tokens.c and src/data/token_data.c: llm.c token shards written and read
 * back bit-identically (the bytes checked against the format by hand), every malformed shard
 * refused with the file (and for a bad token, its index and byte offset) named, a sparse shard
 * over 4 GiB read at its end, and the windows of B T + 1 tokens: their layout over several
 * shards, and their DDP sharding through the sampler (each window exactly once per epoch over
 * the ranks, the same order on every rank, different epochs differ). */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain/data.h"

#define FILE_CHECK_NAME "test_tokens"
#include "file_check.h"

/* A shard written by hand, independently of the writer: header slots h[0..2], `count` tokens
 * (v(i) = (i * 7919 + salt) mod vocab), then `extra` bytes (negative: cut that many). */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t hcount,
                      int64_t count, int vocab, int salt, int64_t extra) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  uint8_t h[1024] = {0};
  int32_t v[3] = {magic, version, hcount};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) h[4 * i + k] = (uint8_t)((uint32_t)v[i] >> (8 * k));
  ck_assert_int_eq(fwrite(h, 1, sizeof h, f), sizeof h);
  for (int64_t i = 0; i < count; i++) {
    unsigned t = (unsigned)((i * 7919 + salt) % vocab);
    uint8_t b[2] = {(uint8_t)(t & 0xFF), (uint8_t)(t >> 8)};
    ck_assert_int_eq(fwrite(b, 1, 2, f), 2);
  }
  for (int64_t i = 0; i < extra; i++) fputc(0, f);
  ck_assert_int_eq(fclose(f), 0);
  if (extra < 0) ck_assert_int_eq(truncate(path, 1024 + 2 * count + extra), 0);
}

static int64_t file_size(const char *path) {
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  return (int64_t)sb.st_size;
}

/* ------------------------------------------------------------------------------------------ */
/* Shards                                                                                     */

START_TEST(test_shard_round_trip_is_bit_identical_and_matches_the_format) {
  /* More than one 512 Ki-token chunk, every uint16 value. */
  int64_t n = 600001;
  uint16_t *t = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)((i * 40503u) ^ (i >> 3));
  t[5] = 65535;
  const char *p = path_of("rt.bin");
  ck_assert_int_eq(mpt_token_shard_write(p, t, n), MPT_OK);
  ck_assert_int_eq(file_size(p), 1024 + 2 * n);
  /* The bytes by hand: little-endian int32 header, little-endian uint16 tokens. */
  FILE *f = fopen(p, "rb");
  uint8_t *bytes = malloc((size_t)(1024 + 2 * n));
  ck_assert_int_eq(fread(bytes, 1, (size_t)(1024 + 2 * n), f), (size_t)(1024 + 2 * n));
  fclose(f);
  ck_assert_int_eq(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24, 20240520);
  ck_assert_int_eq(bytes[4] | bytes[5] << 8 | bytes[6] << 16 | bytes[7] << 24, 1);
  ck_assert_int_eq(bytes[8] | bytes[9] << 8 | bytes[10] << 16 | bytes[11] << 24, n);
  for (int i = 12; i < 1024; i++) ck_assert_int_eq(bytes[i], 0);
  for (int64_t i = 0; i < n; i++) ck_assert_int_eq(bytes[1024 + 2 * i] | bytes[1025 + 2 * i] << 8, t[i]);
  free(bytes);
  int64_t count = -1;
  ck_assert_int_eq(mpt_token_shard_read_header(p, &count), MPT_OK);
  ck_assert_int_eq(count, n);
  mpt_token_shard s;
  ck_assert_int_eq(mpt_token_shard_read(p, 65536, &s), MPT_OK);
  ck_assert_int_eq(s.count, n);
  ck_assert_int_eq(memcmp(s.tokens, t, (size_t)n * 2), 0);
  mpt_token_shard_free(&s);
  mpt_token_shard_free(&s); /* zeroed: no-op */
  /* An empty shard is valid. */
  ck_assert_int_eq(mpt_token_shard_write(path_of("empty.bin"), NULL, 0), MPT_OK);
  ck_assert_int_eq(mpt_token_shard_read(path_of("empty.bin"), 256, &s), MPT_OK);
  ck_assert_int_eq(s.count, 0);
  free(t);
}
END_TEST

START_TEST(test_shard_write_is_atomic_and_leaves_no_temporary_file) {
  const char *p = path_of("atomic.bin");
  uint16_t a[3] = {1, 2, 3}, b[2] = {9, 8};
  ck_assert_int_eq(mpt_token_shard_write(p, a, 3), MPT_OK);
  ck_assert_int_eq(mpt_token_shard_write(p, b, 2), MPT_OK); /* replaces */
  mpt_token_shard s;
  ck_assert_int_eq(mpt_token_shard_read(p, 10, &s), MPT_OK);
  ck_assert_int_eq(s.count, 2);
  ck_assert_int_eq(s.tokens[0], 9);
  mpt_token_shard_free(&s);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp", tmpdir);
  ck_assert_int_ne(system(cmd), 0);
  ASSERT_ERR(mpt_token_shard_write(path_of("no/such/dir.bin"), a, 3), MPT_EIO, "no/such/dir.bin");
  ASSERT_ERR(mpt_token_shard_write(p, a, -1), MPT_EINVAL, "atomic.bin");
  ASSERT_ERR(mpt_token_shard_write(p, NULL, 3), MPT_EINVAL, "atomic.bin");
  ASSERT_ERR(mpt_token_shard_write(p, a, MPT_SHARD_MAX_TOKENS + 1), MPT_EINVAL, "atomic.bin");
}
END_TEST

START_TEST(test_shard_rejects_bad_files_naming_them) {
  mpt_token_shard s;
  int64_t c;
  const char *p = path_of("magic.bin");
  write_raw(p, 20240521, 1, 10, 10, 256, 0, 0);
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "magic.bin", "magic 20240521",
             "expected 20240520");
  ck_assert_ptr_null(s.tokens);
  write_raw(p, 20240326, 3, 10, 10, 256, 0, 0);
  ASSERT_ERR(mpt_token_shard_read_header(p, &c), MPT_EFORMAT, "model file, not a shard");
  p = path_of("version.bin");
  write_raw(p, 20240520, 2, 10, 10, 256, 0, 0);
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "version.bin", "version 2",
             "expected 1");
  p = path_of("trunc.bin");
  write_raw(p, 20240520, 1, 10, 10, 256, 0, -1); /* one byte short */
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "trunc.bin", "is 1043 bytes",
             "10 tokens (1044 bytes)", "truncated");
  p = path_of("long.bin");
  write_raw(p, 20240520, 1, 10, 10, 256, 0, 2);
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "long.bin", "bytes after the data");
  p = path_of("neg.bin");
  write_raw(p, 20240520, 1, -4, 0, 256, 0, 0);
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "neg.bin", "negative");
  p = path_of("short.bin");
  FILE *f = fopen(p, "wb");
  fputs("hello", f);
  fclose(f);
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "short.bin", "shorter than its");
  ASSERT_ERR(mpt_token_shard_read(path_of("missing.bin"), 256, &s), MPT_ENOENT, "missing.bin");
  ASSERT_ERR(mpt_token_shard_read(tmpdir, 256, &s), MPT_EIO, "not a regular file");
  ASSERT_ERR(mpt_token_shard_read(p, 0, &s), MPT_EINVAL, "vocab_size 0");
  ASSERT_ERR(mpt_token_shard_read(p, 65537, &s), MPT_EINVAL, "vocab_size 65537");
}
END_TEST

START_TEST(test_shard_rejects_token_out_of_range_naming_index_and_offset) {
  /* The bad token in the second 512 Ki-token chunk, so the chunk offset arithmetic shows. */
  int64_t n = 600000, bad = 550001;
  uint16_t *t = calloc((size_t)n, 2);
  for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)(i % 256);
  t[bad] = 300;
  const char *p = path_of("range.bin");
  ck_assert_int_eq(mpt_token_shard_write(p, t, n), MPT_OK);
  mpt_token_shard s;
  char want[128];
  snprintf(want, sizeof want, "token %lld (byte offset %lld) is 300", (long long)bad,
           (long long)(1024 + 2 * bad));
  ASSERT_ERR(mpt_token_shard_read(p, 256, &s), MPT_EFORMAT, "range.bin", want,
             "vocabulary of 256");
  ck_assert_ptr_null(s.tokens);
  ck_assert_int_eq(mpt_token_shard_read(p, 301, &s), MPT_OK); /* in range for a larger vocab */
  mpt_token_shard_free(&s);
  free(t);
}
END_TEST

/* A sparse shard of 2^31 - 1 tokens (4 GiB + 1 KiB; no disk blocks but its last few): the size
 * arithmetic must not overflow 32 bits, and the last window (at a byte offset over 4 GiB) must
 * be read where it is. */
START_TEST(test_shard_over_4_gib_sparse_reads_its_last_window) {
  const char *p = path_of("huge.bin");
  int64_t n = MPT_SHARD_MAX_TOKENS;
  write_raw(p, 20240520, 1, (int32_t)n, 0, 256, 0, 0);
  if (truncate(p, 1024 + 2 * n) != 0) {
    fprintf(stderr, "SKIP sparse 4 GiB shard: truncate failed\n");
    return;
  }
  int64_t c = 0;
  ck_assert_int_eq(mpt_token_shard_read_header(p, &c), MPT_OK);
  ck_assert_int_eq(c, n);
  /* Windows of B T = 2 * 3 = 6: floor((n - 1) / 6); the last one starts at token
   * (W - 1) * 6. Write its 7 tokens by hand at their 64-bit offset. */
  int64_t bt = 6, nw = (n - 1) / bt, first = (nw - 1) * bt;
  int fd = open(p, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  uint8_t w[14];
  for (int i = 0; i < 7; i++) w[2 * i] = (uint8_t)(100 + i), w[2 * i + 1] = (uint8_t)i;
  ck_assert_int_eq(pwrite(fd, w, sizeof w, (off_t)(1024 + 2 * first)), (ssize_t)sizeof w);
  close(fd);
  mpt_token_data_config cfg = {2, 3, 65536};
  mpt_token_data *d;
  ck_assert_int_eq(mpt_token_data_init(&d, p, &cfg), MPT_OK);
  ck_assert_int_eq(mpt_token_data_num_windows(d), nw);
  int32_t x[6], y[6];
  ck_assert_int_eq(mpt_token_data_read_window(d, nw - 1, x, y), MPT_OK);
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(x[i], (100 + i) | i << 8);
    ck_assert_int_eq(y[i], (101 + i) | (i + 1) << 8);
  }
  /* With a vocabulary of 256 the same window names the bad token's 64-bit offset. */
  mpt_token_data_free(d);
  cfg.vocab_size = 256;
  ck_assert_int_eq(mpt_token_data_init(&d, p, &cfg), MPT_OK);
  char want[128];
  snprintf(want, sizeof want, "token %lld (byte offset %lld) is %d", (long long)(first + 1),
           (long long)(1024 + 2 * (first + 1)), 101 | 1 << 8);
  ASSERT_ERR(mpt_token_data_read_window(d, nw - 1, x, y), MPT_EFORMAT, "huge.bin", want);
  mpt_token_data_free(d);
  /* One byte more than the header says, over 4 GiB: refused. */
  ck_assert_int_eq(truncate(p, 1024 + 2 * n + 1), 0);
  ASSERT_ERR(mpt_token_shard_read_header(p, &c), MPT_EFORMAT, "is 4294968319 bytes",
             "(4294968318 bytes)");
  unlink(p);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Windows                                                                                    */

/* Shards a.bin (100 tokens), b.bin (10: no window), c.bin (31): token i of shard s is
 * s * 1000 + i. B = 2, T = 5: windows of 11 tokens with stride 10: 9 + 0 + 3. */
static void write_three_shards(void) {
  const int64_t counts[3] = {100, 10, 31};
  const char *names[3] = {"w_a.bin", "w_b.bin", "w_c.bin"};
  for (int s = 0; s < 3; s++) {
    uint16_t t[100];
    for (int64_t i = 0; i < counts[s]; i++) t[i] = (uint16_t)(s * 1000 + i);
    ck_assert_int_eq(mpt_token_shard_write(path_of(names[s]), t, counts[s]), MPT_OK);
  }
}

START_TEST(test_windows_cover_the_shards_in_order_with_next_token_targets) {
  write_three_shards();
  mpt_token_data_config cfg = {2, 5, 4000};
  mpt_token_data *d;
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/w_*.bin", tmpdir);
  ck_assert_int_eq(mpt_token_data_init(&d, pattern, &cfg), MPT_OK);
  ck_assert_int_eq(mpt_token_data_num_shards(d), 3);
  ck_assert_int_eq(mpt_token_data_num_tokens(d), 141);
  ck_assert_int_eq(mpt_token_data_num_windows(d), 12);
  ck_assert_ptr_nonnull(strstr(mpt_token_data_shard_path(d, 2), "w_c.bin"));
  ck_assert_int_eq(mpt_token_data_shard_tokens(d, 1), 10);
  ck_assert_ptr_null(mpt_token_data_shard_path(d, 3));
  for (int64_t w = 0; w < 12; w++) {
    int32_t x[10], y[10];
    ck_assert_int_eq(mpt_token_data_read_window(d, w, x, y), MPT_OK);
    int64_t base = w < 9 ? w * 10 : 2000 + (w - 9) * 10;
    for (int j = 0; j < 10; j++) {
      ck_assert_int_eq(x[j], base + j);
      ck_assert_int_eq(y[j], base + j + 1);
    }
  }
  int32_t x[10], y[10];
  ASSERT_ERR(mpt_token_data_read_window(d, 12, x, y), MPT_EINVAL, "window 12");
  ASSERT_ERR(mpt_token_data_read_window(d, -1, x, y), MPT_EINVAL, "window -1");
  mpt_token_data_free(d);
  /* A vocabulary of 1001 makes the first token of c.bin (2000) bad: window 9 names it. */
  cfg.vocab_size = 1001;
  ck_assert_int_eq(mpt_token_data_init(&d, pattern, &cfg), MPT_OK);
  ASSERT_ERR(mpt_token_data_read_window(d, 9, x, y), MPT_EFORMAT, "w_c.bin",
             "token 0 (byte offset 1024) is 2000");
  mpt_token_data_free(d);
}
END_TEST

START_TEST(test_windows_reject_empty_globs_small_shards_and_bad_shards) {
  write_three_shards();
  mpt_token_data *d = (mpt_token_data *)1;
  mpt_token_data_config cfg = {2, 5, 4000};
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/nothing_*.bin", tmpdir);
  ASSERT_ERR(mpt_token_data_init(&d, pattern, &cfg), MPT_ENOENT, "no file matches", "nothing_");
  ck_assert_ptr_null(d);
  /* b.bin alone has no window of 11 tokens. */
  ASSERT_ERR(mpt_token_data_init(&d, path_of("w_b.bin"), &cfg), MPT_EFORMAT, "B*T+1 = 11",
             "10 tokens in all");
  /* A bad shard among good ones is named. */
  write_raw(path_of("w_bad.bin"), 20240520, 1, 50, 49, 256, 0, 0);
  snprintf(pattern, sizeof pattern, "%s/w_*.bin", tmpdir);
  ASSERT_ERR(mpt_token_data_init(&d, pattern, &cfg), MPT_EFORMAT, "w_bad.bin", "truncated");
  unlink(path_of("w_bad.bin"));
  cfg.seq_len = 0;
  ASSERT_ERR(mpt_token_data_init(&d, pattern, &cfg), MPT_EINVAL, "sequence length 0");
  cfg.seq_len = 5;
  cfg.vocab_size = 70000;
  ASSERT_ERR(mpt_token_data_init(&d, pattern, &cfg), MPT_EINVAL, "70000");
}
END_TEST

/* The per-rank loaders of W ranks, each over its own mpt_token_data (as separate processes
 * would be): in every epoch each window is seen exactly once over the ranks' real steps; every
 * rank's order is the same permutation (rank r's step i is position r + i W of the one-rank
 * order); epochs differ; inputs and targets are the window's. 12 windows over W = 5 ranks:
 * 3 steps each, the last 3 positions padding. */
START_TEST(test_token_loader_shards_windows_like_the_distributed_sampler) {
  write_three_shards();
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/w_*.bin", tmpdir);
  mpt_token_data_config cfg = {2, 5, 4000};
  enum { W = 5, NW = 12 };
  int64_t order[2][NW];
  for (int epoch = 0; epoch < 2; epoch++) {
    /* The one-rank order of this epoch (prefetch off). */
    mpt_token_data *d1;
    ck_assert_int_eq(mpt_token_data_init(&d1, pattern, &cfg), MPT_OK);
    mpt_sampler_config sc = mpt_sampler_config_default();
    sc.seed = 1234;
    mpt_loader_config lc = mpt_loader_config_default();
    lc.prefetch = 0;
    mpt_token_loader *one;
    ck_assert_int_eq(mpt_token_loader_init(&one, d1, &sc, &lc), MPT_OK);
    ck_assert_int_eq(mpt_token_loader_start_epoch(one, epoch), MPT_OK);
    ck_assert_int_eq(mpt_token_loader_num_steps(one), NW);
    mpt_token_batch b;
    for (int i = 0; i < NW; i++) {
      ck_assert_int_eq(mpt_token_loader_next(one, &b), MPT_OK);
      order[epoch][i] = b.window;
      ck_assert_int_eq(b.is_padding, 0);
    }
    ck_assert_int_eq(mpt_token_loader_next(one, &b), MPT_LOADER_END);
    mpt_token_loader_free(one);
    mpt_token_data_free(d1);

    int seen[NW] = {0};
    for (int r = 0; r < W; r++) {
      mpt_token_data *d;
      ck_assert_int_eq(mpt_token_data_init(&d, pattern, &cfg), MPT_OK);
      sc.num_replicas = W;
      sc.rank = r;
      mpt_token_loader *tl;
      ck_assert_int_eq(mpt_token_loader_init(&tl, d, &sc, NULL), MPT_OK); /* prefetch on */
      ck_assert_int_eq(mpt_token_loader_start_epoch(tl, epoch), MPT_OK);
      ck_assert_int_eq(mpt_token_loader_num_steps(tl), 3);
      for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(mpt_token_loader_next(tl, &b), MPT_OK);
        int64_t pos = r + (int64_t)i * W;
        ck_assert_int_eq(b.window, order[epoch][pos % NW]);
        ck_assert_int_eq(b.is_padding, pos >= NW);
        ck_assert_int_eq(b.epoch, epoch);
        ck_assert_int_eq(b.inputs.ndim, 2);
        ck_assert_int_eq(b.inputs.shape[0], 2);
        ck_assert_int_eq(b.inputs.shape[1], 5);
        ck_assert_int_eq(b.targets.dtype, MPT_I32);
        int32_t x[10], y[10];
        ck_assert_int_eq(mpt_token_data_read_window(d, b.window, x, y), MPT_OK);
        ck_assert_int_eq(memcmp(b.inputs.data, x, sizeof x), 0);
        ck_assert_int_eq(memcmp(b.targets.data, y, sizeof y), 0);
        if (!b.is_padding) seen[b.window]++;
      }
      ck_assert_int_eq(mpt_token_loader_next(tl, &b), MPT_LOADER_END);
      mpt_token_loader_free(tl);
      mpt_token_data_free(d);
    }
    for (int w = 0; w < NW; w++) ck_assert_msg(seen[w] == 1, "window %d seen %d times", w, seen[w]);
  }
  /* Both epochs are permutations, and they differ. */
  ck_assert_int_ne(memcmp(order[0], order[1], sizeof order[0]), 0);
  for (int e = 0; e < 2; e++) {
    int hit[NW] = {0};
    for (int i = 0; i < NW; i++) hit[order[e][i]]++;
    for (int w = 0; w < NW; w++) ck_assert_int_eq(hit[w], 1);
  }
}
END_TEST

/* A bad token inside a window reaches the caller of mpt_token_loader_next as an error naming
 * the shard and offset (never a hang), with prefetch on. */
START_TEST(test_token_loader_reports_a_bad_token_with_its_shard_and_offset) {
  uint16_t t[41];
  for (int i = 0; i < 41; i++) t[i] = (uint16_t)(i == 33 ? 999 : i);
  ck_assert_int_eq(mpt_token_shard_write(path_of("l_bad.bin"), t, 41), MPT_OK);
  mpt_token_data_config cfg = {2, 5, 256};
  mpt_token_data *d;
  ck_assert_int_eq(mpt_token_data_init(&d, path_of("l_bad.bin"), &cfg), MPT_OK);
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.shuffle = 0;
  mpt_token_loader *tl;
  ck_assert_int_eq(mpt_token_loader_init(&tl, d, &sc, NULL), MPT_OK);
  mpt_token_batch b;
  for (int i = 0; i < 3; i++) ck_assert_int_eq(mpt_token_loader_next(tl, &b), MPT_OK);
  int r = mpt_token_loader_next(tl, &b);
  ck_assert_int_eq(r, MPT_EFORMAT);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "l_bad.bin"));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "token 33 (byte offset 1090) is 999"));
  mpt_token_loader_free(tl);
  mpt_token_data_free(d);
}
END_TEST

/* mpt_token_data_check_ids: every id a window can read, by part; ids after the last window
 * are never read and not checked. */
START_TEST(test_check_ids_finds_a_bad_token_up_front_in_its_part_only) {
  uint16_t t[45];
  for (int i = 0; i < 45; i++) t[i] = (uint16_t)i;
  ck_assert_int_eq(mpt_token_shard_write(path_of("c_0.bin"), t, 41), MPT_OK);
  t[33] = 999; /* inside the windows of c_1 (B T = 10: 4 windows read tokens 0 .. 40) */
  ck_assert_int_eq(mpt_token_shard_write(path_of("c_1.bin"), t, 41), MPT_OK);
  t[33] = 33;
  t[44] = 999; /* after c_2's last window (45 tokens: 4 windows, tokens 0 .. 40 read) */
  ck_assert_int_eq(mpt_token_shard_write(path_of("c_2.bin"), t, 45), MPT_OK);
  mpt_token_data_config cfg = {2, 5, 256};
  mpt_token_data *d;
  ck_assert_int_eq(mpt_token_data_init(&d, path_of("c_*.bin"), &cfg), MPT_OK);
  ck_assert_int_eq(mpt_token_data_num_shards(d), 3);
  ASSERT_ERR(mpt_token_data_check_ids(d, 0, 1), MPT_EFORMAT, "c_1.bin",
             "token 33 (byte offset 1090) is 999, outside the vocabulary of 256");
  ck_assert_int_eq(mpt_token_data_check_ids(d, 0, 2), MPT_OK); /* c_0 and c_2 */
  ASSERT_ERR(mpt_token_data_check_ids(d, 1, 2), MPT_EFORMAT, "c_1.bin", "token 33");
  ck_assert_int_eq(mpt_token_data_check_ids(d, 2, 3), MPT_OK);
  ck_assert_int_eq(mpt_token_data_check_ids(d, 3, 4), MPT_OK); /* no shard in this part */
  ASSERT_ERR(mpt_token_data_check_ids(d, 2, 2), MPT_EINVAL, "part 2 outside [0, 2)");
  ASSERT_ERR(mpt_token_data_check_ids(d, -1, 2), MPT_EINVAL, "part -1");
  ASSERT_ERR(mpt_token_data_check_ids(d, 0, 0), MPT_EINVAL, "outside [0, 0)");
  ASSERT_ERR(mpt_token_data_check_ids(NULL, 0, 1), MPT_EINVAL, "NULL");
  mpt_token_data_free(d);
}
END_TEST

static void add_tests(TCase *tc) {
  tcase_add_test(tc, test_shard_round_trip_is_bit_identical_and_matches_the_format);
  tcase_add_test(tc, test_shard_write_is_atomic_and_leaves_no_temporary_file);
  tcase_add_test(tc, test_shard_rejects_bad_files_naming_them);
  tcase_add_test(tc, test_shard_rejects_token_out_of_range_naming_index_and_offset);
  tcase_add_test(tc, test_shard_over_4_gib_sparse_reads_its_last_window);
  tcase_add_test(tc, test_windows_cover_the_shards_in_order_with_next_token_targets);
  tcase_add_test(tc, test_windows_reject_empty_globs_small_shards_and_bad_shards);
  tcase_add_test(tc, test_token_loader_shards_windows_like_the_distributed_sampler);
  tcase_add_test(tc, test_token_loader_reports_a_bad_token_with_its_shard_and_offset);
  tcase_add_test(tc, test_check_ids_finds_a_bad_token_up_front_in_its_part_only);
}

int main(void) { return file_check_main("tokens", 60, add_tests); }
