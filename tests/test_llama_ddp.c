/* DDP equivalence for the Llama model (src/nn/llama.c), run under mpirun with 2 and 3 ranks
 * (tests/test_llama_ddp_np2.sh, tests/test_llama_ddp_np3.sh):
 *
 * W ranks with B sequences each train like ONE process on the W*B sequences. Every rank also
 * runs a plain tiny Llama (V 23, C 32, L 2, H 4, KV 2, F 48, T 8; no DDP) on the whole combined
 * batch, and at each of 10 AdamW steps (betas 0.9 / 0.95, weight decay 0.1 on the >= 2-D
 * weights only; clipping by the global norm at 0.5, active), from the same parameters, DDP's
 * averaged and clipped gradients equal the one process's (relative 1e-5) over the whole flat
 * buffer and over the embedding alone (tied to the head in one case: DDP must reduce it once,
 * after both uses), and the global norm is the same on every rank and equals the one
 * process's. Cases: untied with overlap on and a 0.01 MiB bucket cap (several buckets),
 * overlap off, the default 25 MiB cap, and the head tied to the embedding. After each step the
 * plain model takes the replica's parameters, the replicas must be bit-identical across ranks
 * at the end, and training must have moved the parameters.
 *
 * Bucket readiness: with 0.01 MiB caps, the first bucket (the first all-reduce DDP launches)
 * must be complete within the first half of backward's grad-ready events, and every bucket no
 * later than the next (the registration follows the forward's order of use).
 *
 * The checks are tests/lm_ddp_check.h's, the same as tests/test_gpt_ddp.c's.
 *
 * MPI rules as tests/test_ddp.c: no fork, soft checks, the ranks agree at the end of a test. */
#include <check.h>
#include <stdint.h>

#include "mpitrain/comm.h"
#include "mpitrain/llama.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"
#include "lm_ddp_check.h"

static mpt_model *llama_make(uint64_t seed, int tied) {
  mpt_llama_config c = {.vocab_size = VOCAB, .dim = 32, .n_layers = 2, .n_heads = 4,
                        .n_kv_heads = 2, .ffn_dim = 48, .max_seq_len = TT,
                        .rope_theta = 10000.0f, .norm_eps = 1e-5f, .tied_embeddings = tied};
  mpt_model *m = NULL;
  OK(mpt_model_init_llama(&m, mpt_device_cpu(), &c, seed));
  return m;
}

static const lm_ddp_case CASES[] = {{1, 0.01, 0}, {0, 0.01, 0}, {1, 25, 0}, {1, 0.01, 1}};

START_TEST(test_llama_ddp_matches_one_process_on_combined_batch) {
  lm_ddp_check_equivalence("llama", llama_make, &CASES[_i]);
}
END_TEST

START_TEST(test_llama_first_bucket_is_ready_early) {
  lm_ddp_check_first_bucket("llama", llama_make, 0);
}
END_TEST

static Suite *llama_ddp_suite(void) {
  Suite *s = suite_create("llama_ddp");
  TCase *tc = tcase_create("equivalence");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_llama_ddp_matches_one_process_on_combined_batch, 0,
                      (int)(sizeof CASES / sizeof CASES[0]));
  tcase_add_test(tc, test_llama_first_bucket_is_ready_early);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_llama_ddp", 30000, &g_comm, &g_world, llama_ddp_suite);
}
