/* Metrics output: JSON file and terminal progress bar. */
#include "cli/metrics.h"

#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


/* JSON has no NaN/Infinity: write null for them. */
static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

mpt_status mpt_metrics_write_json(const char *path, const mpt_run_info *info,
                                  const mpt_epoch_metrics *epochs, int64_t nepochs,
                                  const mpt_step_breakdown *b) {
  /* to "<path>.tmp.<pid>", renamed over path once complete: a failed write (a full disk)
   * leaves an earlier file whole, not an empty one (faults.md F51) */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return MPT_FAIL(MPT_EIO, "cannot open metrics file '%s' for writing: %s", tmp,
                          strerror(errno));
  fprintf(f, "{\n  \"config\": {\"model\": \"%s\", \"batch_size\": %" PRId64
             ", \"world_size\": %d, \"seed\": %" PRIu64
             ", \"optimizer\": \"%s\", \"lr\": ",
          info->model, info->batch_size, info->world_size, info->seed, info->optimizer);
  json_num(f, info->lr);
  fprintf(f, ", \"epochs\": %" PRId64 ", \"launcher\": \"%s\", \"bucket_cap_mb\": ",
          info->epochs, info->launcher);
  json_num(f, info->bucket_cap_mb);
  fprintf(f, ", \"overlap\": %s, \"accumulate\": %d, \"mode\": \"%s\"},\n",
          info->overlap ? "true" : "false", info->accumulate, info->mode);
  fprintf(f, "  \"model\": \"%s\", \"batch_size\": %" PRId64 ", \"world_size\": %d, \"seed\": %" PRIu64 ",\n",
          info->model, info->batch_size, info->world_size, info->seed);
  fprintf(f, "  \"epochs\": [\n");
  for (int64_t i = 0; i < nepochs; i++) {
    const mpt_epoch_metrics *e = &epochs[i];
    fprintf(f, "    {\"epoch\": %" PRId64 ", \"train_loss\": ", e->epoch);
    json_num(f, e->train_loss);
    fprintf(f, ", \"train_accuracy\": ");
    json_num(f, e->train_accuracy);
    fprintf(f, ", \"test_loss\": ");
    json_num(f, e->test_loss);
    fprintf(f, ", \"test_accuracy\": ");
    json_num(f, e->test_accuracy);
    fprintf(f, ", \"samples_per_sec\": ");
    json_num(f, e->samples_per_sec);
    fprintf(f, ", \"seconds\": ");
    json_num(f, e->seconds);
    fprintf(f, ", \"lr_first\": ");
    json_num(f, e->lr_first);
    fprintf(f, ", \"lr_last\": ");
    json_num(f, e->lr_last);
    fprintf(f, ", \"steps\": %" PRId64 "}%s\n", e->steps, i + 1 < nepochs ? "," : "");
  }
  fprintf(f, "  ],\n  \"final\": {\"test_accuracy\": ");
  json_num(f, nepochs ? epochs[nepochs - 1].test_accuracy : NAN);
  fprintf(f, ", \"samples_per_sec\": ");
  json_num(f, nepochs ? epochs[nepochs - 1].samples_per_sec : NAN);
  fprintf(f, "},\n  \"breakdown\": {\"forward_ms\": ");
  json_num(f, b->forward_ms);
  fprintf(f, ", \"backward_ms\": ");
  json_num(f, b->backward_ms);
  fprintf(f, ", \"exposed_comm_ms\": ");
  json_num(f, b->exposed_comm_ms);
  fprintf(f, ", \"optimizer_ms\": ");
  json_num(f, b->optimizer_ms);
  fprintf(f, ", \"total_ms\": ");
  json_num(f, b->total_ms);
  fprintf(f, ", \"allreduce_ms\": ");
  json_num(f, b->allreduce_ms);
  fprintf(f, ", \"hidden_fraction\": ");
  json_num(f, b->hidden_fraction);
  fprintf(f, ", \"steps\": %" PRId64 ", \"forward_includes_backward\": %s}\n}\n", b->steps,
          b->forward_includes_backward ? "true" : "false");
  int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
  int e = errno;
  if (fclose(f) != 0 && !bad) {
    bad = 1;
    e = errno;
  }
  if (!bad && rename(tmp, path) != 0) {
    bad = 1;
    e = errno;
  }
  if (bad) {
    remove(tmp);
    return MPT_FAIL(MPT_EIO, "cannot write metrics file '%s': %s", path, strerror(e));
  }
  return MPT_OK;
}

void mpt_progress_draw(FILE *f, int64_t epoch, int64_t step, int64_t steps, double loss,
                       double samples_per_sec) {
  const int width = 30;
  int filled = steps > 0 ? (int)(width * step / steps) : 0;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[width] = '\0';
  fprintf(f, "\repoch %3" PRId64 " [%s] %5.1f%% loss %.4f %8.0f samples/s", epoch, bar,
          steps > 0 ? 100.0 * (double)step / (double)steps : 0.0, loss, samples_per_sec);
  fflush(f);
}

void mpt_progress_clear(FILE *f) {
  fprintf(f, "\r%100s\r", "");
  fflush(f);
}
