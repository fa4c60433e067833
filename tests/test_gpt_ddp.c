/* DDP equivalence for the GPT model (src/nn/gpt.c), run under mpirun with 2 and 3 ranks
 * (tests/test_gpt_ddp_np2.mpi, tests/test_gpt_ddp_np3.mpi):
 *
 * W ranks with B sequences each train like ONE process on the W*B sequences. Every rank also
 * runs a plain tiny GPT (L 2, H 2, C 16, T 8, V 23 -> Vp 128; no DDP) on the whole combined
 * batch, and at each of 10 AdamW steps (betas 0.9 / 0.95, weight decay 0.1 on the >= 2-D
 * weights only, through mpt_param_groups_split_decay; clipping by the global norm at 0.5,
 * active, computed by mpt_clip_grad_norm on the averaged gradients), from the same parameters,
 * DDP's averaged and clipped gradients equal the one process's (relative 1e-5) over the whole
 * flat buffer and over the tied wte alone (embedding + head: DDP must reduce it once, after
 * both uses), the global norm is the same on every rank and equals the one process's. Overlap
 * on and off, a 0.01 MiB bucket cap (several buckets) and the default 25 MiB. After each step the
 * plain model takes the replica's parameters (as tests/test_ddp.c), the replicas must be
 * bit-identical across ranks at the end, and training must have moved the parameters.
 *
 * Bucket readiness (the layer-major registration of src/nn/gpt.c): with 0.01 MiB caps (several
 * buckets), a tape-level grad-ready hook records the order in which backward finalises the
 * parameters; the first bucket (the first all-reduce DDP launches) must be complete within the
 * first half of the ready events, and every bucket no later than the next one (buckets launch in
 * index order, so a later bucket that is ready earlier waits anyway). With the llm.c file's
 * per-kind order the first bucket held layer 0's fc and fcproj tensors and was complete only
 * at ready event 17 of 28 (counted from 0); layer-major, at event 11.
 *
 * Not a test: with MPT_GPT_DDP_OVERLAP_STEPS=N set, the program instead trains a GPT of
 * gpt-mini's shape (L 6, H 6, C 384, T 256, V 256; B 2 per rank) for N + 1 steps under DDP
 * (overlap on unless MPT_GPT_DDP_NO_OVERLAP is set; caps MPT_GPT_DDP_CAP_MB, default 25, first
 * bucket 1 MiB) and rank 0 prints the share of all-reduce hidden behind backward
 * (mpt_ddp_get_stats, the first step left out), e.g.
 *     MPT_GPT_DDP_OVERLAP_STEPS=5 tests/mpirun.sh 2 600 ./tests/test_gpt_ddp
 *
 * The checks are tests/lm_ddp_check.h's, the same as tests/test_llama_ddp.c's.
 *
 * MPI rules as tests/test_ddp.c: no fork, soft checks, the ranks agree at the end of a test. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/optim.h"
#include "mpitrain/transformer.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"
#include "lm_ddp_check.h"

/* The GPT's head is always its token embedding wte: `tied` is 1 in every case. */
static mpt_model *gpt_make(uint64_t seed, int tied) {
  mpt_gpt_config c = {.max_seq_len = TT, .vocab_size = VOCAB, .num_layers = 2, .num_heads = 2,
                      .channels = 16, .padded_vocab_size = 0};
  mpt_model *m = NULL;
  ck_assert_int_eq(tied, 1);
  OK(mpt_model_init_gpt(&m, mpt_device_cpu(), &c, seed));
  return m;
}

static const lm_ddp_case CASES[] = {{1, 0.01, 1}, {0, 0.01, 1}, {1, 25, 1}};

START_TEST(test_gpt_ddp_matches_one_process_on_combined_batch) {
  lm_ddp_check_equivalence("gpt", gpt_make, &CASES[_i]);
}
END_TEST

START_TEST(test_gpt_first_bucket_is_ready_early) {
  lm_ddp_check_first_bucket("gpt", gpt_make, 1);
}
END_TEST

/* The overlap figure of a gpt-mini-shaped model (the top of this file); 0 or 1 for the exit. */
static int overlap_figure(int steps) {
  mpt_gpt_config c = {.max_seq_len = 256, .vocab_size = 256, .num_layers = 6, .num_heads = 6,
                      .channels = 384, .padded_vocab_size = 0};
  enum { MB = 2, MT = 256 };
  const char *cap = getenv("MPT_GPT_DDP_CAP_MB");
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  mpt_ddp *ddp = NULL;
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = cap ? atof(cap) : 25.0;
  dc.overlap = getenv("MPT_GPT_DDP_NO_OVERLAP") == NULL;
  dc.timeout_ms = 120000;
  static int32_t tok[MB * MT], tgt[MB * MT];
  const int64_t shape[2] = {MB, MT};
  mpt_tensor tt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_tensor gt = mpt_tensor_view(tgt, mpt_device_cpu(), MPT_I32, 2, shape);
  if (mpt_model_init_gpt(&m, mpt_device_cpu(), &c, 1) != MPT_OK ||
      mpt_tape_init(&tape, m, NULL) != MPT_OK ||
      mpt_ddp_init(&ddp, m, g_comm, NULL, &dc) != MPT_OK) {
    fprintf(stderr, "overlap figure: %s\n", mpt_last_error());
    return 1;
  }
  /* AdamW as adamw_make, without check's assertions (this runs outside a test) */
  mpt_optimizer *opt = NULL;
  mpt_optimizer_config oc = mpt_optimizer_config_default();
  oc.kind = MPT_OPTIM_ADAMW;
  oc.beta2 = 0.95f;
  mpt_param_group groups[MAX_GROUPS];
  int ng = 0;
  if (mpt_optimizer_init(&opt, &oc, mpt_device_cpu(), mpt_model_param_count(m)) != MPT_OK ||
      mpt_param_groups_split_decay(m, 0.1f, groups, MAX_GROUPS, &ng) != MPT_OK ||
      mpt_optimizer_set_groups(opt, groups, ng) != MPT_OK) {
    fprintf(stderr, "overlap figure: %s\n", mpt_last_error());
    return 1;
  }
  for (int step = 0; step <= steps; step++) {
    for (int i = 0; i < MB * MT; i++) {
      tok[i] = (i * 31 + step * 7 + g_rank * 13) % 256;
      tgt[i] = (i * 17 + step) % 256;
    }
    mpt_var *in = NULL, *logits = NULL, *loss = NULL;
    mpt_tape_reset(tape, 1);
    if (mpt_model_zero_grad(m, NULL) != MPT_OK || mpt_tape_input(tape, &tt, &in) != MPT_OK ||
        mpt_model_forward(m, tape, in, &logits) != MPT_OK ||
        mpt_nn_cross_entropy_vocab(tape, logits, &gt, 256, &loss) != MPT_OK ||
        mpt_tape_backward(tape, loss, 1.0f) != MPT_OK ||
        mpt_optimizer_step_model(opt, m, NULL, 1e-3f) != MPT_OK) {
      fprintf(stderr, "overlap figure: step %d: %s\n", step, mpt_last_error());
      return 1;
    }
    if (step == 0) mpt_ddp_reset_stats(ddp); /* warm-up */
  }
  mpt_ddp_stats s = mpt_ddp_get_stats(ddp);
  if (g_rank == 0)
    printf("gpt-mini shape, W %d, B %d, T %d, overlap %d, caps %g / %g MiB, %d buckets, "
           "%lld steps: backward %.1f ms, all-reduce %.1f ms, hidden %.1f ms (%.1f %%), "
           "exposed %.1f ms per step\n", g_world, MB, MT, dc.overlap, dc.bucket_cap_mb,
           dc.first_bucket_cap_mb, mpt_ddp_num_buckets(ddp), (long long)s.steps,
           s.sum_backward_ms / s.steps, s.sum_allreduce_ms / s.steps, s.sum_hidden_ms / s.steps,
           100.0 * s.sum_hidden_ms / s.sum_allreduce_ms, s.sum_exposed_comm_ms / s.steps);
  mpt_optimizer_free(opt);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  return 0;
}

static Suite *gpt_ddp_suite(void) {
  Suite *s = suite_create("gpt_ddp");
  TCase *tc = tcase_create("equivalence");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_gpt_ddp_matches_one_process_on_combined_batch, 0,
                      (int)(sizeof CASES / sizeof CASES[0]));
  tcase_add_test(tc, test_gpt_first_bucket_is_ready_early);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = 30000;
  mpt_status st = mpt_comm_init(&g_comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "test_gpt_ddp: mpt_comm_init: %s: %s\n", mpt_status_name(st),
            mpt_last_error());
    mpt_comm_finalize();
    return EXIT_FAILURE;
  }
  g_rank = mpt_comm_rank(g_comm);
  g_world = mpt_comm_world_size(g_comm);
  const char *figure = getenv("MPT_GPT_DDP_OVERLAP_STEPS");
  if (figure) {
    int failed = overlap_figure(atoi(figure) > 0 ? atoi(figure) : 1);
    mpt_comm_free(g_comm);
    mpt_comm_finalize();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
  }
  SRunner *sr = srunner_create(gpt_ddp_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(g_comm);
  mpt_comm_finalize();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
