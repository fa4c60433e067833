/* Tests of the sharded collectives (reduce-scatter, all-gather of shards) and of the bfloat16
 * reductions of the comm layer (include/mpitrain/comm.h), under mpirun: the tests
 * tests/test_comm_shard_npN.mpi run this program with 2, 3 and 4 ranks. Check runs without
 * forking (MPI); tests/run_np.sh bounds the run with a timeout. The suite runs twice, in
 * blocking and in polling mode, each pass with its own shared comm; the unchecked mismatch runs
 * in the polling pass only (a mismatched blocking call may never return; see tests/test_comm.c).
 *
 * Oracles: small-integer inputs whose sums are exact in float32 and bfloat16, compared with
 * naive loops over the ranks; the bfloat16 error bound of comm.h for inputs that are not
 * representable, against the exact sum computed in double. Every rank runs every test in the
 * same order: the tests are collective. The peak resident memory of a large reduce-scatter,
 * against a bound (/proc/self/status after /proc/self/clear_refs). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"

static mpt_comm *comm; /* shared comm of the pass, timeout 60 s */
static int rank, world;
static int g_blocking;

/* Sizes: empty, one element (most ranks own nothing), odd, not divisible by 2, 3 or 4 (7, 1023,
 * 300001 = 4 * 75000 + 1), fewer elements than ranks (2, 3). */
static const int64_t sizes[] = {0, 1, 2, 3, 7, 1023, 300001};
enum { NSIZES = sizeof sizes / sizeof sizes[0] };

static float input_value(int r, int64_t i) { return (float)((r + 1) * (int)(i % 13 + 1)); }

static void *xmalloc(size_t nbytes) {
  void *p = malloc(nbytes ? nbytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

static mpt_status sync_stream(mpt_stream *stream) {
  mpt_event *ev;
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  mpt_status st = mpt_event_record(ev, stream);
  if (st == MPT_OK) st = mpt_event_synchronize(ev, 120000.0);
  if (st != MPT_OK)
    fprintf(stderr, "rank %d: %s: %s\n", rank, mpt_status_name(st), mpt_last_error());
  mpt_event_free(ev);
  return st;
}

static mpt_comm *new_comm(double timeout_ms, int checked, int blocking, int64_t chunk) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = timeout_ms;
  cfg.check_collectives = checked;
  cfg.blocking = blocking;
  cfg.configure_log = 0;
  if (chunk > 0) cfg.max_chunk_count = chunk;
  mpt_comm *c = NULL;
  mpt_status st = mpt_comm_init(&c, &cfg);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s\n", rank, mpt_last_error());
  ck_assert_int_eq(st, MPT_OK);
  return c;
}

START_TEST(test_shard_layout_covers_the_buffer_with_a_shorter_last_shard) {
  const struct {
    int64_t count;
    int world;
    int64_t want[4];
  } cases[] = {{5, 4, {2, 2, 1, 0}}, {10, 3, {4, 4, 2}}, {9, 3, {3, 3, 3}}, {1, 4, {1, 0, 0, 0}},
               {0, 2, {0, 0}},       {7, 2, {4, 3}},    {6, 4, {2, 2, 2, 0}}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int64_t next = 0;
    for (int r = 0; r < cases[k].world; r++) {
      int64_t off, n;
      mpt_comm_shard(cases[k].count, cases[k].world, r, &off, &n);
      ck_assert_int_eq(n, cases[k].want[r]);
      if (n > 0) ck_assert_int_eq(off, next); /* contiguous, in rank order */
      next = off + n;
    }
    ck_assert_int_eq(next, cases[k].count);
  }
  int64_t off = -1, n = -1;
  mpt_comm_shard(5, 0, 0, &off, &n);
  ck_assert(off == 0 && n == 0);
  mpt_comm_shard(5, 2, 2, &off, &n);
  ck_assert(off == 0 && n == 0);
}
END_TEST

/* Reduce-scatter of float32 and int32, sum and avg, in place and not, on every size. */
static void check_reduce_scatter(mpt_comm *c, const int64_t *ns, int nn) {
  for (int s = 0; s < nn; s++) {
    const int64_t n = ns[s];
    int64_t off, mine;
    mpt_comm_shard(n, world, rank, &off, &mine);
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    int32_t *xi = xmalloc(sizeof(int32_t) * n), *yi = xmalloc(sizeof(int32_t) * n);
    for (int mode = 0; mode < 3; mode++) { /* 0: sum, 1: sum in place, 2: avg */
      for (int64_t i = 0; i < n; i++) {
        x[i] = input_value(rank, i);
        y[i] = -1.0f;
        xi[i] = (int32_t)(rank * 100000 + i % 1000);
        yi[i] = -1;
      }
      float *out = mode == 1 ? x + off : y;
      int32_t *outi = mode == 1 ? xi + off : yi;
      mpt_reduce_op op = mode == 2 ? MPT_REDUCE_AVG : MPT_REDUCE_SUM;
      ck_assert_int_eq(mpt_comm_reduce_scatter(c, NULL, x, out, n, MPT_F32, op), MPT_OK);
      ck_assert_int_eq(mpt_comm_reduce_scatter(c, NULL, xi, outi, n, MPT_I32, MPT_REDUCE_SUM),
                       MPT_OK);
      ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_OK);
      for (int64_t i = 0; i < mine; i++) {
        float want = 0;
        int32_t wanti = 0;
        for (int r = 0; r < world; r++) {
          want += input_value(r, off + i);
          wanti += (int32_t)(r * 100000 + (off + i) % 1000);
        }
        if (mode == 2) want /= (float)world;
        if (out[i] != want || outi[i] != wanti)
          ck_abort_msg("n %lld mode %d shard element %lld: got %g / %d, want %g / %d",
                       (long long)n, mode, (long long)i, out[i], outi[i], want, wanti);
      }
      if (mode != 1) /* out of place: nothing written past the shard */
        for (int64_t i = mine; i < n; i++) ck_assert_float_eq(y[i], -1.0f);
    }
    free(x);
    free(y);
    free(xi);
    free(yi);
  }
}

/* All-gather of shards: each rank writes only its own shard; afterwards every rank holds every
 * owner's values, the last shard shorter. */
static void check_allgather_shards(mpt_comm *c, const int64_t *ns, int nn) {
  for (int s = 0; s < nn; s++) {
    const int64_t n = ns[s];
    int64_t off, mine;
    mpt_comm_shard(n, world, rank, &off, &mine);
    float *x = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) x[i] = i >= off && i < off + mine ? input_value(rank, i) : -1;
    ck_assert_int_eq(mpt_comm_allgather_shards(c, NULL, x, n, MPT_F32), MPT_OK);
    ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_OK);
    for (int q = 0; q < world; q++) {
      int64_t qo, qn;
      mpt_comm_shard(n, world, q, &qo, &qn);
      for (int64_t i = qo; i < qo + qn; i++)
        if (x[i] != input_value(q, i))
          ck_abort_msg("n %lld element %lld (rank %d's shard): got %g want %g", (long long)n,
                       (long long)i, q, x[i], input_value(q, i));
    }
    free(x);
  }
}

START_TEST(test_reduce_scatter_is_exact_on_every_size) {
  check_reduce_scatter(comm, sizes, NSIZES);
}
END_TEST

START_TEST(test_allgather_shards_is_exact_on_every_size) {
  check_allgather_shards(comm, sizes, NSIZES);
}
END_TEST

/* This process's resident and peak resident memory (VmRSS, VmHWM) in KiB; after
 * reset_peak() the peak restarts from the current size (Linux: clear_refs 5). Returns 0 if
 * either is unavailable. */
static int read_rss_kib(long *rss, long *hwm) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int got = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    got += sscanf(line, "VmRSS: %ld kB", rss) == 1;
    got += sscanf(line, "VmHWM: %ld kB", hwm) == 1;
  }
  fclose(f);
  return got == 2;
}

static int reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return 0;
  int ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

/* A 32 MiB reduce-scatter in place (8 Mi + 1 floats: pieces of 1 Mi elements per shard, the last
 * one shorter) is exact and raises this process's peak resident memory by less than 16 MiB
 * above what it held before (measured 4-8 MiB): Open MPI's MPI_Reduce_scatter over the whole
 * buffer took 33-49 MiB more here, its temporaries, which the comm layer's pieces avoid
 * (comm_mpi_call.c RS_PIECE). Then one of 8 Mi + 1 bfloat16 elements is exact too. The memory
 * check needs /proc/self/clear_refs (else only noted). */
START_TEST(test_large_reduce_scatter_is_exact_and_bounded_in_memory) {
  const int64_t n = 8 * 1048576 + 1;
  int64_t off, mine;
  mpt_comm_shard(n, world, rank, &off, &mine);
  float *x = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) x[i] = input_value(rank, i);
  long rss0 = 0, hwm0 = 0, rss1 = 0, hwm1 = 0;
  const int measured = reset_peak() && read_rss_kib(&rss0, &hwm0);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, x + off, n, MPT_F32, MPT_REDUCE_SUM),
                   MPT_OK);
  ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
  const int measured1 = measured && read_rss_kib(&rss1, &hwm1);
  int64_t wrong = 0;
  for (int64_t i = 0; i < mine; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += input_value(r, off + i);
    wrong += x[off + i] != want;
  }
  free(x);
  ck_assert_msg(wrong == 0, "rank %d: %lld wrong elements of its shard", rank, (long long)wrong);
  /* the same in bfloat16 (sums of small integers: exact), through the pieces' MPI_Reduce */
  uint16_t *h = xmalloc(sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = mpt_bf16_from_f32(input_value(rank, i));
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, h, h + off, n, MPT_BF16, MPT_REDUCE_SUM),
                   MPT_OK);
  ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
  for (int64_t i = 0; i < mine; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += input_value(r, off + i);
    wrong += mpt_bf16_to_f32(h[off + i]) != want;
  }
  free(h);
  ck_assert_msg(wrong == 0, "rank %d: %lld wrong bfloat16 elements", rank, (long long)wrong);
  if (!measured1) {
    if (rank == 0) printf("note: no /proc/self/clear_refs: the memory check is left out\n");
    return;
  }
  const long grew = hwm1 - rss0;
  if (rank == 0) printf("reduce-scatter of 32 MiB: peak resident +%ld KiB\n", grew);
  ck_assert_msg(grew < 16 * 1024, "rank %d: the reduce-scatter of 32 MiB raised the peak "
                "resident memory by %ld KiB (want < 16 MiB)", rank, grew);
}
END_TEST

/* Chunk 1000: 1500 takes the per-owner path with one chunk per shard (the whole buffer is over
 * the chunk), 2500 * world + 1 several chunks per shard; 999 the single call. */
START_TEST(test_sharded_collectives_are_exact_when_chunked) {
  mpt_comm *c = new_comm(60000, 0, g_blocking, 1000);
  const int64_t ns[] = {999, 1500, 2500 * (int64_t)world + 1};
  check_reduce_scatter(c, ns, 3);
  check_allgather_shards(c, ns, 3);
  mpt_comm_free(c);
}
END_TEST

START_TEST(test_sharded_bad_arguments_are_rejected) {
  float x[16] = {0}, y[16] = {0};
  uint64_t seq = mpt_comm_sequence(comm);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, y, 8, MPT_F32, MPT_REDUCE_MAX),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, y, 8, MPT_U8, MPT_REDUCE_SUM),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, y, 8, MPT_I32, MPT_REDUCE_AVG),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, y, -1, MPT_F32, MPT_REDUCE_SUM),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, NULL, y, 8, MPT_F32, MPT_REDUCE_SUM),
                   MPT_EINVAL);
  int64_t off, mine;
  mpt_comm_shard(16, world, rank, &off, &mine);
  /* Overlapping, but not this rank's shard. */
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, x, x + off + 1, 16, MPT_F32,
                                           MPT_REDUCE_SUM),
                   MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "overlaps"));
  ck_assert_int_eq(mpt_comm_allgather_shards(comm, NULL, NULL, 8, MPT_F32), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, y, 4, MPT_BF16, MPT_REDUCE_MAX),
                   MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "bfloat16 takes sum or avg"));
  ck_assert_uint_eq(mpt_comm_sequence(comm), seq);
}
END_TEST

/* F09 for reduce-scatter, checked mode: rank 0 reduce-scatters 8 floats, the others 4. Every
 * rank fails with MPT_EMISMATCH naming the ranks and both signatures, before data moves. */
START_TEST(test_reduce_scatter_checked_mode_names_mismatched_counts) {
  mpt_comm *c = new_comm(20000, 1, g_blocking, 0);
  float x[8], y[8];
  for (int i = 0; i < 8; i++) {
    x[i] = 1.0f;
    y[i] = -5.0f;
  }
  int n = rank == 0 ? 8 : 4;
  mpt_stream *st; /* a mismatch leaves the stream that ran it failed: one stream each */
  ck_assert_int_eq(mpt_stream_init(&st, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_comm_reduce_scatter(c, st, x, y, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  ck_assert_int_eq(sync_stream(st), MPT_EMISMATCH);
  const char *msg = mpt_last_error();
  ck_assert_ptr_nonnull(strstr(msg, "rank 0 reduce-scatters 8 float32 (sum)"));
  ck_assert_ptr_nonnull(strstr(msg, "rank 1 reduce-scatters 4 float32 (sum)"));
  if (world > 2) ck_assert_ptr_nonnull(strstr(msg, "rank 2 reduce-scatters 4 float32 (sum)"));
  for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], -5.0f);
  ck_assert_int_eq(mpt_comm_error(c), MPT_OK);
  mpt_stream_free(st);
  /* All-gather of shards too, and the comm still works afterwards. */
  ck_assert_int_eq(mpt_stream_init(&st, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_comm_allgather_shards(c, st, x, n, MPT_F32), MPT_OK);
  ck_assert_int_eq(sync_stream(st), MPT_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "rank 0 all-gathers shards of 8 float32"));
  mpt_stream_free(st);
  ck_assert_int_eq(mpt_comm_reduce_scatter_sync(c, x, y, 8, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  mpt_comm_free(c);
}
END_TEST

/* The same mismatch without checked mode, polling, 3 s deadline: an error on every rank within
 * the deadline, never a hang or a silent result. */
START_TEST(test_reduce_scatter_unchecked_mismatch_fails_on_every_rank) {
  mpt_comm *c = new_comm(3000, 0, 0, 0);
  float x[8], y[8];
  for (int i = 0; i < 8; i++) x[i] = 1.0f;
  int n = rank == 0 ? 8 * world : 4;
  float *big = xmalloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++) big[i] = 1.0f;
  ck_assert_int_eq(mpt_comm_reduce_scatter(c, NULL, big, y, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  mpt_status st = sync_stream(mpt_comm_stream(c));
  ck_assert_int_ne(st, MPT_OK);
  ck_assert(st == MPT_ECOMM || st == MPT_EMISMATCH || st == MPT_ETIMEOUT);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "reduce-scatter #0"));
  ck_assert_int_eq(mpt_comm_error(c), st);
  free(big);
  (void)x;
  mpt_comm_free(c);
}
END_TEST

/* ---- bfloat16 --------------------------------------------------------------------------------- */

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

START_TEST(test_bf16_rounding_is_nearest_even_and_keeps_nan) {
  ck_assert_uint_eq(mpt_bf16_from_f32(1.0f), 0x3F80);
  ck_assert_uint_eq(mpt_bf16_from_f32(1.0f + 0x1p-8f), 0x3F80);      /* tie: to even (down) */
  ck_assert_uint_eq(mpt_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3F82);  /* tie: to even (up) */
  ck_assert_uint_eq(mpt_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81); /* above the tie */
  ck_assert_uint_eq(mpt_bf16_from_f32(-0.0f), 0x8000);
  ck_assert_uint_eq(mpt_bf16_from_f32(INFINITY), 0x7F80);
  ck_assert_uint_eq(mpt_bf16_from_f32(3.4e38f), 0x7F80); /* beyond the largest bf16: inf */
  /* A NaN whose payload is only in the dropped bits: truncation or a carry would give inf. */
  ck_assert(isnan(mpt_bf16_to_f32(mpt_bf16_from_f32(bits_f32(0x7F800001u)))));
  ck_assert(isnan(mpt_bf16_to_f32(mpt_bf16_from_f32(bits_f32(0xFFFFFFFFu)))));
  for (uint32_t h = 0; h < 0x10000; h++) { /* widening then rounding is the identity */
    float f = mpt_bf16_to_f32((uint16_t)h);
    if (!isnan(f)) ck_assert_uint_eq(mpt_bf16_from_f32(f), h);
  }
  /* The vectorised array forms give the scalar rounding's bits (a NaN sum: a NaN, whichever
   * operand's payload): every bf16 value (NaNs and infinities included) against a spread of
   * others, float32 bit patterns of every kind, a length that is not a multiple of 32. */
  enum { M = 0x10000 + 7 };
  uint16_t *a = malloc(sizeof(uint16_t) * M), *b = malloc(sizeof(uint16_t) * M);
  float *f = malloc(sizeof(float) * M);
  ck_assert(a && b && f);
  for (uint32_t k = 0; k < 3; k++) {
    for (uint32_t i = 0; i < M; i++) {
      a[i] = (uint16_t)i;
      b[i] = (uint16_t)(i * 40503u + k * 7919u);
      f[i] = bits_f32(i * 2654435761u + k); /* any float32 bits, NaN payloads included */
    }
    uint16_t *sum = malloc(sizeof(uint16_t) * M), *rnd = malloc(sizeof(uint16_t) * M);
    ck_assert(sum && rnd);
    memcpy(sum, b, sizeof(uint16_t) * M);
    mpt_bf16_add_array(a, sum, M);
    mpt_bf16_round_array(f, rnd, M);
    for (uint32_t i = 0; i < M; i++) {
      uint16_t want = mpt_bf16_from_f32(mpt_bf16_to_f32(a[i]) + mpt_bf16_to_f32(b[i]));
      const int nan = isnan(mpt_bf16_to_f32(want)); /* any NaN: the payload may follow either */
      if (nan ? !isnan(mpt_bf16_to_f32(sum[i])) : sum[i] != want)
        ck_abort_msg("add %#x + %#x: %#x, want %#x", a[i], b[i], sum[i], want);
      if (rnd[i] != mpt_bf16_from_f32(f[i]))
        ck_abort_msg("round element %u: %#x, want %#x", i, rnd[i], mpt_bf16_from_f32(f[i]));
    }
    free(sum);
    free(rnd);
  }
  /* Widening every bf16 value (the last 7 again) gives mpt_bf16_to_f32's bits, NaNs too. */
  float *wide = malloc(sizeof(float) * M);
  ck_assert(wide);
  for (uint32_t i = 0; i < M; i++) a[i] = (uint16_t)i;
  mpt_bf16_widen_array(a, wide, M);
  for (uint32_t i = 0; i < M; i++) {
    const float want = mpt_bf16_to_f32(a[i]);
    if (memcmp(&wide[i], &want, sizeof want) != 0)
      ck_abort_msg("widen %#x: %a, want %a", a[i], (double)wide[i], (double)want);
  }
  free(wide);
  free(a);
  free(b);
  free(f);
}
END_TEST

/* Rank r's float32 gradient element i: not representable in bfloat16, mixed signs. */
static float grad_value(int r, int64_t i) {
  float v = 1.0f + 0.0123457f * (float)((i * 7 + r * 3) % 101) + 1e-5f * (float)r;
  return ((i + r) % 3 == 0 ? -v : v) * (float)(1 + i % 5);
}

/* A bfloat16 all-reduce and reduce-scatter of values rounded from float32, against the exact
 * sum of the float32 values: within c(W) * sum |g_r| (comm.h), and mostly inexact (else the
 * test would not test the bound). Then small integers: exact, bit for bit. NaN stays NaN. */
START_TEST(test_bf16_reductions_are_within_the_stated_bound) {
  const int64_t n = 4099;
  float *g = xmalloc(sizeof(float) * n);
  uint16_t *h = xmalloc(sizeof(uint16_t) * n), *hs = xmalloc(sizeof(uint16_t) * n);
  for (int64_t i = 0; i < n; i++) g[i] = grad_value(rank, i);
  mpt_bf16_round_array(g, h, n);
  memcpy(hs, h, sizeof(uint16_t) * n);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, h, h, n, MPT_BF16, MPT_REDUCE_SUM), MPT_OK);
  int64_t off, mine;
  mpt_comm_shard(n, world, rank, &off, &mine);
  ck_assert_int_eq(mpt_comm_reduce_scatter(comm, NULL, hs, hs + off, n, MPT_BF16, MPT_REDUCE_SUM),
                   MPT_OK);
  ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
  /* comm.h: one rounding of each input, float32 accumulation, one rounding of the sum */
  const double u = 0x1p-8, e = 0x1p-24, ge = (world - 1) * e / (1 - (world - 1) * e);
  const double gamma = u * (2 + u) + (1 + u) * (1 + u) * ge;
  double worst = 0;
  int inexact = 0;
  for (int64_t i = 0; i < n; i++) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < world; r++) {
      exact += grad_value(r, i);
      abs_sum += fabs(grad_value(r, i));
    }
    double got = mpt_bf16_to_f32(h[i]), err = fabs(got - exact);
    if (err > gamma * abs_sum)
      ck_abort_msg("element %lld: bf16 sum %.9g, exact %.9g: error %.3g over the bound %.3g",
                   (long long)i, got, exact, err, gamma * abs_sum);
    if (err / abs_sum > worst) worst = err / abs_sum;
    inexact += got != exact;
    /* Reduce-scatter: the all-reduce's bits (one float32 sum in rank order, one rounding). */
    if (i >= off && i < off + mine && hs[i] != h[i])
      ck_abort_msg("element %lld: bf16 reduce-scatter %.9g, all-reduce %.9g: not the same bits",
                   (long long)i, mpt_bf16_to_f32(hs[i]), got);
  }
  ck_assert_int_gt(inexact, n / 2);
  if (rank == 0)
    printf("bf16 all-reduce at %d ranks: worst |error| / sum|g| = %.3g, bound c(W) = %.3g\n",
           world, worst, gamma);

  /* Exactly representable: small integers, their sums and avg with W a power of two. */
  for (int64_t i = 0; i < n; i++) h[i] = mpt_bf16_from_f32(input_value(rank, i));
  ck_assert_int_eq(mpt_comm_allreduce_sync(comm, h, h, n, MPT_BF16, MPT_REDUCE_SUM), MPT_OK);
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += input_value(r, i);
    ck_assert_uint_eq(h[i], mpt_bf16_from_f32(want));
    ck_assert_float_eq(mpt_bf16_to_f32(h[i]), want);
  }
  /* NaN on the last rank reaches every rank. */
  for (int64_t i = 0; i < 4; i++) h[i] = mpt_bf16_from_f32(rank == world - 1 ? NAN : 1.0f);
  ck_assert_int_eq(mpt_comm_allreduce_sync(comm, h, h, 4, MPT_BF16, MPT_REDUCE_AVG), MPT_OK);
  for (int64_t i = 0; i < 4; i++) ck_assert(isnan(mpt_bf16_to_f32(h[i])));
  free(g);
  free(h);
  free(hs);
}
END_TEST

static int run_pass(int blocking) {
  g_blocking = blocking;
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  cfg.blocking = blocking;
  mpt_status st = mpt_comm_init(&comm, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "test_comm_shard: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  rank = mpt_comm_rank(comm);
  world = mpt_comm_world_size(comm);
  Suite *s = suite_create(blocking ? "comm shards (blocking)" : "comm shards (polling)");
  TCase *tc = tcase_create("shard");
  tcase_add_test(tc, test_shard_layout_covers_the_buffer_with_a_shorter_last_shard);
  tcase_add_test(tc, test_reduce_scatter_is_exact_on_every_size);
  tcase_add_test(tc, test_allgather_shards_is_exact_on_every_size);
  tcase_add_test(tc, test_sharded_collectives_are_exact_when_chunked);
  tcase_add_test(tc, test_large_reduce_scatter_is_exact_and_bounded_in_memory);
  tcase_add_test(tc, test_sharded_bad_arguments_are_rejected);
  tcase_add_test(tc, test_reduce_scatter_checked_mode_names_mismatched_counts);
  tcase_add_test(tc, test_bf16_rounding_is_nearest_even_and_keeps_nan);
  tcase_add_test(tc, test_bf16_reductions_are_within_the_stated_bound);
  if (!blocking) tcase_add_test(tc, test_reduce_scatter_unchecked_mismatch_fails_on_every_rank);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(comm);
  comm = NULL;
  return failed;
}

int main(void) {
  int failed = run_pass(1);
  failed += run_pass(0);
  mpt_status st = mpt_comm_finalize();
  if (st != MPT_OK) fprintf(stderr, "test_comm_shard: %s\n", mpt_last_error());
  return failed == 0 && st == MPT_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
