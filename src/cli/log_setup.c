/* The program's output under a launcher: --log-file gives each rank its own file
 * (FILE.RANK: stdout and stderr of that rank, info lines of every rank, not only rank 0's);
 * --quiet keeps warnings and errors only; when stderr is not a terminal (mpirun and srun
 * connect it to a pipe, a batch job to a file) rank 0 prints a one-line progress every
 * --progress-interval seconds instead of the terminal progress bar. Runs on the main thread.
 * A failure is also noted on the stderr the rank was started with, naming its log file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/train_impl.h"

mpt_status trainer_log_setup(trainer *t) {
  const mpt_cli_options *o = t->o;
  mpt_log_level level = o->quiet ? MPT_LOG_WARN : MPT_LOG_INFO;
  if (o->log_file[0]) {
    char path[4200];
    if (snprintf(path, sizeof path, "%s.%d", o->log_file, t->rank) >= (int)sizeof path)
      return MPT_FAIL(MPT_EINVAL, "--log-file '%s': path too long", o->log_file);
    /* Appended: a resubmitted job (--resume auto) keeps the interrupted attempt's lines. */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
      return MPT_FAIL(MPT_EIO, "--log-file: cannot open '%s' on rank %d: %s", path, t->rank,
                      strerror(errno));
    fflush(stdout);
    fflush(stderr);
    t->terminal_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    int bad = dup2(fd, 1) < 0 || dup2(fd, 2) < 0;
    int saved = errno;
    close(fd);
    if (bad)
      return MPT_FAIL(MPT_EIO, "--log-file '%s': %s", path, strerror(saved));
    setvbuf(stdout, NULL, _IOLBF, 0);
  }
  mpt_log_configure(t->rank, t->world, level, o->log_file[0] != '\0');
  return MPT_OK;
}

void trainer_log_rank_line(mpt_comm *comm, mpt_device device, int quiet) {
  char devname[32];
  if (quiet) return;
  fprintf(stderr, "mpitrain: rank %d/%d local rank %d host %s device %s launcher %s\n",
          mpt_comm_rank(comm), mpt_comm_world_size(comm), mpt_comm_local_rank(comm),
          mpt_comm_hostname(comm), mpt_device_str(device, devname, sizeof devname),
          mpt_launcher_name(mpt_comm_launcher(comm)));
}

void trainer_log_failure_note(trainer *t, mpt_status st) {
  if (!t->o->log_file[0] || t->terminal_fd <= 2) return;
  dprintf(t->terminal_fd, "mpitrain [rank %d/%d] error: %s: %s (log: %s.%d)\n", t->rank, t->world,
          mpt_status_message(st), mpt_last_error(), t->o->log_file, t->rank);
}

/* ETA from the steps this process has run so far (resumed steps do not count). */
void trainer_progress_line(trainer *t, int64_t epoch, int64_t step, const double *sums) {
  const mpt_cli_options *o = t->o;
  if (t->rank != 0 || t->progress || o->progress_interval_s <= 0) return;
  double now = mpt_time_ms();
  if (t->progress_last_ms < t->loop_start_ms) t->progress_last_ms = t->loop_start_ms;
  if (now - t->progress_last_ms < o->progress_interval_s * 1e3) return;
  t->progress_last_ms = now;
  int64_t total = t->steps_per_epoch * o->epochs;
  int64_t done = t->global_step - t->loop_start_step;
  double elapsed_s = (now - t->loop_start_ms) / 1e3;
  double eta_s = done > 0 ? elapsed_s / (double)done * (double)(total - t->global_step) : 0;
  double sps = elapsed_s > 0 ? (double)done * (double)o->batch_size * o->accumulate * t->world /
                                   elapsed_s : 0;
  mpt_log(MPT_LOG_INFO, "progress: epoch %" PRId64 "/%" PRId64 " step %" PRId64 "/%" PRId64
          ", global step %" PRId64 "/%" PRId64 ", train loss %.4f (this epoch, rank 0), %.0f "
          "samples/s, ETA %dh%02dm%02ds (without evaluation)", epoch + 1, o->epochs, step,
          t->steps_per_epoch, t->global_step, total, sums[2] > 0 ? sums[0] / sums[2] : 0.0,
          sps, (int)(eta_s / 3600), (int)(eta_s / 60) % 60, (int)eta_s % 60);
}

/* See train_impl.h. (faults.md F50) */
mpt_status trainer_log_check(trainer *t) {
  if (!t->o->log_file[0]) return MPT_OK;
  int bad = fflush(stdout) != 0 || fflush(stderr) != 0;
  if (!bad && !ferror(stdout) && !ferror(stderr)) return MPT_OK;
  return MPT_FAIL(MPT_EIO, "--log-file: writing '%s.%d' failed on rank %d (a full disk?): its "
                  "log is incomplete", t->o->log_file, t->rank, t->rank);
}
