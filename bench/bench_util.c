/* Helpers of mpt_allreduce_bench: size parsing, run/rank descriptions, the nccl-tests style
 * table (fixed columns, units in the header), and the JSON mirror. No state; printing is done by
 * whichever rank calls (rank 0). */
#include "config.h"

#include "bench/bench_util.h"

#include <ctype.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"

/* A value in [0, 64) that changes from element to element (Knuth's multiplicative hash). */
static inline int32_t pattern(int64_t i) { return (int32_t)(((uint32_t)i * 2654435761u) >> 26); }

/* bfloat16 holds integers exactly up to 256: its pattern stays in [0, 32), so sums over up to 7
 * ranks (7 * 31 + 28 = 245) and every partial sum are exact. */
static inline int32_t pattern_of(int64_t i, mpt_dtype dtype) {
  return dtype == MPT_BF16 ? pattern(i) & 31 : pattern(i);
}

void bench_fill_range(void *buf, mpt_dtype dtype, int64_t first, int64_t n, int rank) {
  for (int64_t k = 0; k < n; k++) {
    int32_t v = pattern_of(first + k, dtype) + rank + 1;
    if (dtype == MPT_F32)
      ((float *)buf)[k] = (float)v;
    else if (dtype == MPT_BF16)
      ((uint16_t *)buf)[k] = mpt_bf16_from_f32((float)v);
    else
      ((int32_t *)buf)[k] = v;
  }
}

void bench_fill(void *buf, mpt_dtype dtype, int64_t count, int rank) {
  bench_fill_range(buf, dtype, 0, count, rank);
}

static double value_at(const void *buf, mpt_dtype dtype, int64_t k) {
  if (dtype == MPT_F32) return (double)((const float *)buf)[k];
  if (dtype == MPT_BF16) return (double)mpt_bf16_to_f32(((const uint16_t *)buf)[k]);
  return (double)((const int32_t *)buf)[k];
}

static double expected(int64_t i, int n, mpt_reduce_op op, mpt_dtype dtype) {
  int64_t h = pattern_of(i, dtype);
  int64_t sum = (int64_t)n * h + (int64_t)n * (n + 1) / 2;
  switch (op) {
    case MPT_REDUCE_MIN:
      return (double)(h + 1);
    case MPT_REDUCE_MAX:
      return (double)(h + n);
    case MPT_REDUCE_AVG:
      if (dtype == MPT_F32) return (double)((float)sum / (float)n);
      if (dtype == MPT_BF16)
        return (double)mpt_bf16_to_f32(mpt_bf16_from_f32((float)sum / (float)n));
      return (double)sum / n;
    case MPT_REDUCE_SUM:
      break;
  }
  return (double)sum;
}

int64_t bench_count_wrong_range(const void *buf, mpt_dtype dtype, int64_t first, int64_t n,
                                int world, mpt_reduce_op op) {
  int64_t wrong = 0;
  for (int64_t k = 0; k < n; k++)
    wrong += value_at(buf, dtype, k) != expected(first + k, world, op, dtype);
  return wrong;
}

int64_t bench_count_wrong(const void *buf, mpt_dtype dtype, int64_t count, int world,
                          mpt_reduce_op op) {
  return bench_count_wrong_range(buf, dtype, 0, count, world, op);
}

int64_t bench_count_wrong_copy(const void *buf, mpt_dtype dtype, int64_t first, int64_t n,
                               int rank) {
  int64_t wrong = 0;
  for (int64_t k = 0; k < n; k++)
    wrong += value_at(buf, dtype, k) != (double)(pattern_of(first + k, dtype) + rank + 1);
  return wrong;
}

const char *bench_coll_name(bench_coll coll) {
  switch (coll) {
    case BENCH_COLL_ALLREDUCE:
      return "allreduce";
    case BENCH_COLL_REDUCESCATTER:
      return "reducescatter";
    case BENCH_COLL_ALLGATHER:
      return "allgather";
    case BENCH_COLL_RSAG:
      return "rsag";
  }
  return "unknown";
}

int bench_parse_size(const char *text, int64_t *bytes) {
  char *end;
  if (!text || !isdigit((unsigned char)text[0])) return -1;
  unsigned long long v = strtoull(text, &end, 10);
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
    case '\0':
      break;
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    default:
      return -1;
  }
  if (*end && end[1] && !(toupper((unsigned char)end[1]) == 'B' && !end[2])) return -1;
  if (v > (1ULL << 40) >> shift) return -1;
  *bytes = (int64_t)(v << shift);
  return 0;
}

void bench_rank_info_fill(bench_rank_info *r, const mpt_comm *comm, const char *device) {
  memset(r, 0, sizeof *r);
  r->rank = mpt_comm_rank(comm);
  r->local_rank = mpt_comm_local_rank(comm);
  r->pid = (int32_t)getpid();
  snprintf(r->host, sizeof r->host, "%s", mpt_comm_hostname(comm));
  snprintf(r->device, sizeof r->device, "%s", device);
}

static void cpu_model(char *buf, size_t n) {
  snprintf(buf, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *p = strchr(line, ':');
    if (!p) break;
    p++;
    while (*p == ' ' || *p == '\t') p++;
    snprintf(buf, n, "%s", p);
    buf[strcspn(buf, "\n")] = '\0';
    break;
  }
  fclose(f);
}

void bench_run_info_fill(bench_run_info *info, const mpt_comm *comm, const char *device) {
  memset(info, 0, sizeof *info);
  snprintf(info->version, sizeof info->version, "%s", PACKAGE_VERSION);
#ifdef MPT_HAVE_CUDA
  info->cuda = 1;
#endif
#ifdef MPT_HAVE_NCCL
  info->nccl = 1;
#endif
  snprintf(info->backend, sizeof info->backend, "%s",
           mpt_comm_backend_name(mpt_comm_backend_kind(comm)));
  snprintf(info->progress, sizeof info->progress, "%s",
           mpt_comm_backend_kind(comm) != MPT_COMM_BACKEND_MPI ? "-"
           : mpt_comm_blocking(comm)                          ? "blocking"
                                                              : "polling");
  snprintf(info->device, sizeof info->device, "%s", device);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
    lib[strcspn(lib, "\n,")] = '\0';
    lib[sizeof info->mpi_library - 1] = '\0';
    memcpy(info->mpi_library, lib, strlen(lib) + 1);
  }
  cpu_model(info->cpu_model, sizeof info->cpu_model);
  info->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(info->launcher, sizeof info->launcher, "%s", mpt_launcher_name(mpt_comm_launcher(comm)));
  info->world = mpt_comm_world_size(comm);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(info->date, sizeof info->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

double bench_bus_factor(bench_coll coll, int world) {
  if (world <= 1) return 0.0;
  const int allreduce = coll == BENCH_COLL_ALLREDUCE || coll == BENCH_COLL_RSAG;
  return allreduce ? 2.0 * (world - 1) / world : (double)(world - 1) / world;
}

void bench_print_preamble(FILE *f, const bench_run_info *info, const bench_rank_info *ranks,
                          int nranks) {
  fprintf(f, "# mpt_allreduce_bench: mpitrain %s, build: CUDA %s, NCCL %s; backend %s%s%s, "
             "buffers on %s; %s\n",
          info->version, info->cuda ? "yes" : "no", info->nccl ? "yes" : "no", info->backend,
          info->progress[0] != '-' ? " progress " : "", info->progress[0] != '-' ? info->progress : "",
          info->device, info->mpi_library);
  fprintf(f, "# %d rank(s) launched by %s; rank 0's host: %d CPU(s), %s; %s\n", info->world,
          info->launcher, info->cpus, info->cpu_model, info->date);
  fprintf(f, "#\n# Using devices\n");
  for (int i = 0; i < nranks; i++)
    fprintf(f, "#  Rank %2d Pid %7d on %10s device %s (local rank %d)\n", ranks[i].rank,
            ranks[i].pid, ranks[i].host, ranks[i].device, ranks[i].local_rank);
  fprintf(f, "#\n");
}

/* Column layout: one format per cell width, shared by the header and the rows. */
void bench_print_header(FILE *f, const char *raw_name) {
  char raw_title[64];
  snprintf(raw_title, sizeof raw_title, "raw %s", raw_name);
  fprintf(f, "# %42s  %-31s  %-31s  %-32s  %s\n", "", "mpitrain out-of-place",
          "mpitrain in-place", raw_title, "busbw ratio");
  fprintf(f, "# %42s  %-31s  %-31s  %-15s  %-15s  %s\n", "", "", "", "out-of-place", "in-place",
          "mpitrain/raw");
  fprintf(f, "#%11s  %12s  %8s  %6s", "size", "count", "type", "redop");
  for (int g = 0; g < 2; g++) fprintf(f, "  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
  for (int g = 0; g < 2; g++) fprintf(f, "  %7s  %6s", "time", "busbw");
  fprintf(f, "  %6s  %6s\n", "oop", "ip");
  fprintf(f, "#%11s  %12s  %8s  %6s", "(B)", "(elements)", "", "");
  for (int g = 0; g < 2; g++) fprintf(f, "  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
  for (int g = 0; g < 2; g++) fprintf(f, "  %7s  %6s", "(us)", "(GB/s)");
  fprintf(f, "\n");
}

/* nccl-tests' time format: fewer decimals for longer times. */
static void fmt_time(char *buf, size_t n, double us) {
  if (us >= 10000.0)
    snprintf(buf, n, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(buf, n, "%7.1f", us);
  else
    snprintf(buf, n, "%7.2f", us);
}

void bench_print_row(FILE *f, const bench_row *r, const char *type, const char *redop,
                     double factor) {
  char t[32];
  fprintf(f, "%12lld  %12lld  %8s  %6s", (long long)r->bytes,
          (long long)(r->rank_count ? r->rank_count : r->count), type, redop);
  for (int v = BENCH_MPT_OOP; v <= BENCH_MPT_IP; v++) {
    double alg = (double)r->bytes / (r->time_us[v] * 1e3);
    fmt_time(t, sizeof t, r->time_us[v]);
    fprintf(f, "  %7s  %6.2f  %6.2f  %6lld", t, alg, alg * factor, (long long)r->wrong[v]);
  }
  for (int v = BENCH_RAW_OOP; v <= BENCH_RAW_IP; v++) {
    double alg = (double)r->bytes / (r->time_us[v] * 1e3);
    fmt_time(t, sizeof t, r->time_us[v]);
    fprintf(f, "  %7s  %6.2f", t, alg * factor);
  }
  fprintf(f, "  %6.3f  %6.3f\n", r->time_us[BENCH_RAW_OOP] / r->time_us[BENCH_MPT_OOP],
          r->time_us[BENCH_RAW_IP] / r->time_us[BENCH_MPT_IP]);
}

/* ---- JSON -------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

static void json_variant(FILE *f, const char *name, const bench_row *r, int v, double factor) {
  double alg = (double)r->bytes / (r->time_us[v] * 1e3);
  fprintf(f, "\"%s\": {\"time_us\": ", name);
  json_num(f, r->time_us[v]);
  fprintf(f, ", \"algbw_gbps\": ");
  json_num(f, alg);
  fprintf(f, ", \"busbw_gbps\": ");
  json_num(f, alg * factor);
  fprintf(f, ", \"wrong\": %lld}", (long long)r->wrong[v]);
}

int bench_write_json(const char *path, const bench_run_info *info, const bench_rank_info *ranks,
                     const bench_config *cfg, const bench_row *rows, int64_t nrows,
                     const bench_summary *s) {
  mpt__afile af; /* atomic: a failed write leaves an earlier file whole */
  if (mpt__afile_open(&af, path, "JSON file") != MPT_OK) return -1;
  FILE *f = af.f;
  double factor = bench_bus_factor(info->coll, info->world);
  fprintf(f, "{\n  \"benchmark\": \"%s\",\n  \"mpitrain_version\": ",
          bench_coll_name(info->coll));
  json_str(f, info->version);
  fprintf(f, ",\n  \"build\": {\"cuda\": %s, \"nccl\": %s},\n  \"backend\": ",
          info->cuda ? "true" : "false", info->nccl ? "true" : "false");
  json_str(f, info->backend);
  fprintf(f, ",\n  \"progress\": ");
  json_str(f, info->progress);
  fprintf(f, ",\n  \"device\": ");
  json_str(f, info->device);
  fprintf(f, ",\n  \"mpi_library\": ");
  json_str(f, info->mpi_library);
  fprintf(f, ",\n  \"machine\": {\"cpus\": %d, \"cpu_model\": ", info->cpus);
  json_str(f, info->cpu_model);
  fprintf(f, "},\n  \"date\": ");
  json_str(f, info->date);
  fprintf(f, ",\n  \"launcher\": ");
  json_str(f, info->launcher);
  fprintf(f, ",\n  \"world_size\": %d,\n  \"config\": {\"dtype\": ", info->world);
  json_str(f, cfg->dtype);
  fprintf(f, ", \"op\": ");
  json_str(f, cfg->op);
  fprintf(f, ", \"iters\": %d, \"warmup_iters\": %d, \"repeats\": %d, \"check\": %d, "
             "\"blocking\": %d, \"confirm_collectives\": %d, \"raw\": \"%s\"},\n",
          cfg->iters, cfg->warmup, cfg->repeats, cfg->check, cfg->blocking, cfg->confirm,
          cfg->raw);
  fprintf(f, "  \"ranks\": [\n");
  for (int i = 0; i < info->world; i++) {
    fprintf(f, "    {\"rank\": %d, \"local_rank\": %d, \"pid\": %d, \"host\": ", ranks[i].rank,
            ranks[i].local_rank, ranks[i].pid);
    json_str(f, ranks[i].host);
    fprintf(f, ", \"device\": ");
    json_str(f, ranks[i].device);
    fprintf(f, "}%s\n", i + 1 < info->world ? "," : "");
  }
  fprintf(f, "  ],\n  \"rows\": [\n");
  for (int64_t i = 0; i < nrows; i++) {
    const bench_row *r = &rows[i];
    fprintf(f, "    {\"bytes\": %lld, \"count\": %lld, \"count_per_rank\": %lld, ",
            (long long)r->bytes, (long long)r->count,
            (long long)(r->rank_count ? r->rank_count : r->count));
    json_variant(f, "out_of_place", r, BENCH_MPT_OOP, factor);
    fprintf(f, ", ");
    json_variant(f, "in_place", r, BENCH_MPT_IP, factor);
    fprintf(f, ",\n     ");
    json_variant(f, "raw_out_of_place", r, BENCH_RAW_OOP, factor);
    fprintf(f, ", ");
    json_variant(f, "raw_in_place", r, BENCH_RAW_IP, factor);
    fprintf(f, ",\n     \"ratio_out_of_place\": ");
    json_num(f, r->time_us[BENCH_RAW_OOP] / r->time_us[BENCH_MPT_OOP]);
    fprintf(f, ", \"ratio_in_place\": ");
    json_num(f, r->time_us[BENCH_RAW_IP] / r->time_us[BENCH_MPT_IP]);
    fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
  }
  fprintf(f, "  ],\n  \"summary\": {\"avg_busbw_gbps\": ");
  json_num(f, s->avg_busbw);
  fprintf(f, ", \"avg_busbw_raw_gbps\": ");
  json_num(f, s->avg_busbw_raw);
  fprintf(f, ", \"sizes_ge_1mib\": %d, \"ratio_ge_1mib_out_of_place\": ", s->nratio);
  json_num(f, s->ratio_oop);
  fprintf(f, ", \"ratio_ge_1mib_in_place\": ");
  json_num(f, s->ratio_ip);
  fprintf(f, ", \"ratio_ge_1mib_mean\": ");
  json_num(f, 0.5 * (s->ratio_oop + s->ratio_ip));
  fprintf(f, ", \"ratio_ge_1mib_min\": ");
  json_num(f, s->ratio_min);
  fprintf(f, ", \"wrong\": %lld}\n}\n", (long long)s->wrong_total);
  if (ferror(f) || mpt__afile_commit(&af) != MPT_OK) {
    mpt__afile_abort(&af);
    return -1;
  }
  return 0;
}

int bench_json_probe(const char *path, char *why, size_t n) {
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    snprintf(why, n, "it exists and is not a regular file");
    return -1;
  }
  mpt__afile af;
  if (mpt__afile_open(&af, path, "JSON file") != MPT_OK) {
    snprintf(why, n, "%s", mpt_last_error());
    return -1;
  }
  mpt__afile_abort(&af);
  return 0;
}
