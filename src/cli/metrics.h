/* Training metrics of the program: per-epoch records, the JSON file (--metrics-json), the
 * progress bar and the per-step breakdown. Rank 0 writes; the numbers are already reduced over
 * ranks (sums of losses, correct answers and sample counts, never means of per-rank ratios). */
#ifndef MPT_CLI_METRICS_H
#define MPT_CLI_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "mpitrain/core.h"

typedef struct mpt_epoch_metrics {
  int64_t epoch; /* from 1 */
  double train_loss, train_accuracy;
  double test_loss, test_accuracy;
  double samples_per_sec; /* training samples over all ranks / training seconds */
  double seconds;         /* wall time of the epoch's training and evaluation */
  int64_t steps;
  double lr_first, lr_last; /* scheduled learning rate of the epoch's first and last step */
} mpt_epoch_metrics;

/* Per-step breakdown in milliseconds, averaged over steps (max over ranks taken by caller). */
typedef struct mpt_step_breakdown {
  double forward_ms, backward_ms, exposed_comm_ms, optimizer_ms, total_ms;
  double allreduce_ms, hidden_fraction; /* all-reduce time per step; share hidden by backward */
  int64_t steps;
  int forward_includes_backward; /* DP: each device runs both in one pass; backward_ms is 0 */
} mpt_step_breakdown;

typedef struct mpt_run_info {
  const char *model;
  int64_t batch_size; /* per rank */
  int world_size;
  uint64_t seed;
  const char *optimizer;
  double lr;
  int64_t epochs;
  const char *launcher;
  double bucket_cap_mb;
  int overlap;
  int accumulate;
  const char *mode;
} mpt_run_info;

/* Writes the JSON object {"config": {...}, "epochs": [...], "final": {...}, "breakdown": {...}}.
 * Errors: MPT_EIO naming the path. */
mpt_status mpt_metrics_write_json(const char *path, const mpt_run_info *info,
                                  const mpt_epoch_metrics *epochs, int64_t nepochs,
                                  const mpt_step_breakdown *breakdown);
/* One progress bar line on `f` ("\r..."), only meant for terminals. */
void mpt_progress_draw(FILE *f, int64_t epoch, int64_t step, int64_t steps, double loss,
                       double samples_per_sec);
void mpt_progress_clear(FILE *f);

#endif
