/* `mpitrain hang-report DIR [--json]`: merges the flight recorder's dumps (comm.h "Flight
 * recorder": DIR/flight-rankR.txt, one per rank, copied from every host into one folder) and
 * says, first, what a person needs to know about a stuck or failed job: the last collective
 * every rank finished, the first one where the ranks differ (who finished it, who is inside it
 * and for how long, who never entered it, with host and pid), the first collective whose
 * signature (op, dtype, count, root or reduction, global step, purpose) differs between ranks,
 * and the ranks that left no dump. --json prints the same as one JSON object for tools.
 *
 * Dumps are untrusted input: a rank killed while writing leaves a file cut anywhere (or only its
 * .tmp); any line may be cut or garbage. Every line is parsed on its own, bad ones are counted,
 * a file without its "end" line is named as cut short, and nothing is assumed about order.
 * One process, no MPI. */
#include "cli/hang_report.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RANKS = 1 << 16, TEXT = 64 };

typedef struct coll {
  uint64_t seq;
  char op[TEXT], dtype[TEXT], state[TEXT], purpose[TEXT];
  int64_t count, arg, step;
  double enq, start, end;
} coll;

typedef struct peer {
  int pid;
  char host[TEXT];
} peer;

typedef struct dump {
  int rank, world;         /* world -1: unknown */
  char host[TEXT];
  long pid;
  char reason[160];
  double now_ms, timeout_ms;
  int64_t wall_s, capacity;
  uint64_t next_seq;
  int have_next, complete, from_tmp, bad_lines;
  char file[4200];
  coll *c;
  int n, cap;
  peer *peers; /* [npeers] */
  int npeers;
} dump;

static void copy(char *dst, const char *src, size_t cap) {
  size_t n = strcspn(src, "\r\n");
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* "key=value" of a collective line into c; 0 when the key is known and the value parses. */
static int coll_field(coll *c, const char *key, size_t klen, const char *v) {
  char *end = NULL;
#define KEY(k) (klen == sizeof k - 1 && memcmp(key, k, klen) == 0)
  if (KEY("seq")) {
    errno = 0;
    c->seq = strtoull(v, &end, 10);
  } else if (KEY("count")) {
    c->count = strtoll(v, &end, 10);
  } else if (KEY("arg")) {
    c->arg = strtoll(v, &end, 10);
  } else if (KEY("step")) {
    c->step = strtoll(v, &end, 10);
  } else if (KEY("enq")) {
    c->enq = strtod(v, &end);
  } else if (KEY("start")) {
    c->start = strtod(v, &end);
  } else if (KEY("end")) {
    c->end = strtod(v, &end);
  } else if (KEY("op") || KEY("dtype") || KEY("state")) {
    char *dst = KEY("op") ? c->op : KEY("dtype") ? c->dtype : c->state;
    size_t n = strcspn(v, " \r\n");
    if (n == 0 || n >= TEXT) return -1;
    memcpy(dst, v, n);
    dst[n] = '\0';
    return 0;
  } else {
    return -1;
  }
#undef KEY
  return end && end != v && (*end == ' ' || *end == '\0' || *end == '\n') ? 0 : -1;
}

/* "c seq=.. op=.. ... purpose=REST"; 0 when seq, op and state were read. */
static int parse_coll(const char *line, coll *c) {
  memset(c, 0, sizeof *c);
  c->step = -1;
  int have = 0;
  const char *p = line + 2;
  while (*p && *p != '\n') {
    while (*p == ' ') p++;
    const char *eq = strchr(p, '=');
    if (!eq) break;
    const size_t klen = (size_t)(eq - p);
    if (klen == 7 && memcmp(p, "purpose", 7) == 0) {
      copy(c->purpose, eq + 1, sizeof c->purpose);
      if (strcmp(c->purpose, "-") == 0) c->purpose[0] = '\0';
      break;
    }
    if (coll_field(c, p, klen, eq + 1) != 0) return -1;
    if ((klen == 3 && memcmp(p, "seq", 3) == 0) || (klen == 2 && memcmp(p, "op", 2) == 0) ||
        (klen == 5 && memcmp(p, "state", 5) == 0))
      have++;
    p = eq + 1 + strcspn(eq + 1, " \n");
  }
  return have == 3 ? 0 : -1;
}

static int add_coll(dump *d, const coll *c) {
  if (d->n == d->cap) {
    int ncap = d->cap ? 2 * d->cap : 256;
    coll *g = realloc(d->c, sizeof *g * (size_t)ncap);
    if (!g) return -1;
    d->c = g;
    d->cap = ncap;
  }
  d->c[d->n++] = *c;
  return 0;
}

static int coll_cmp(const void *a, const void *b) {
  const coll *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Reads one dump; -1 only when the file cannot be opened or memory runs out. */
static int read_dump(const char *path, int rank_from_name, int from_tmp, dump *d) {
  memset(d, 0, sizeof *d);
  d->rank = rank_from_name;
  d->world = -1;
  d->pid = -1;
  d->from_tmp = from_tmp;
  snprintf(d->file, sizeof d->file, "%s", path);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int first = 1;
  while (fgets(line, sizeof line, f)) {
    const size_t len = strlen(line);
    if (len == 0) continue;
    if (line[len - 1] != '\n') {
      if (len == sizeof line - 1) { /* a line too long for a dump's: skip the rest of it */
        int ch;
        while ((ch = fgetc(f)) != EOF && ch != '\n') {
        }
        d->bad_lines++;
        continue;
      }
      d->bad_lines++; /* the last line, cut short by a rank killed while writing */
      break;
    }
    if (first) {
      first = 0;
      if (strncmp(line, "mpitrain-flight-recorder ", 25) != 0) {
        d->bad_lines++;
        continue;
      }
      continue;
    }
    long a = 0, b = 0;
    char s[TEXT];
    if (strncmp(line, "c ", 2) == 0) {
      coll c;
      if (parse_coll(line, &c) == 0) {
        if (add_coll(d, &c) != 0) {
          fclose(f);
          return -1;
        }
      } else {
        d->bad_lines++;
      }
    } else if (sscanf(line, "rank %ld of %ld", &a, &b) == 2 && a >= 0 && a < MAX_RANKS && b > a &&
               b <= MAX_RANKS) {
      if (d->rank >= 0 && d->rank != (int)a) d->bad_lines++; /* the name says otherwise */
      d->rank = (int)a;
      d->world = (int)b;
    } else if (strncmp(line, "host ", 5) == 0) {
      copy(d->host, line + 5, sizeof d->host);
    } else if (sscanf(line, "pid %ld", &a) == 1) {
      d->pid = a;
    } else if (strncmp(line, "reason ", 7) == 0) {
      copy(d->reason, line + 7, sizeof d->reason);
    } else if (sscanf(line, "now_ms %lf", &d->now_ms) == 1) {
    } else if (sscanf(line, "timeout_ms %lf", &d->timeout_ms) == 1) {
    } else if (sscanf(line, "wall_s %" SCNd64, &d->wall_s) == 1) {
    } else if (sscanf(line, "capacity %" SCNd64, &d->capacity) == 1) {
    } else if (sscanf(line, "next_seq %" SCNu64, &d->next_seq) == 1) {
      d->have_next = 1;
    } else if (sscanf(line, "peer %ld pid %ld host %63s", &a, &b, s) == 3 && a >= 0 &&
               a < MAX_RANKS) {
      if (a >= d->npeers) {
        peer *g = realloc(d->peers, sizeof *g * (size_t)(a + 1));
        if (!g) {
          fclose(f);
          return -1;
        }
        memset(g + d->npeers, 0, sizeof *g * (size_t)(a + 1 - d->npeers));
        for (long k = d->npeers; k <= a; k++) g[k].pid = -1;
        d->peers = g;
        d->npeers = (int)a + 1;
      }
      d->peers[a].pid = (int)b;
      copy(d->peers[a].host, s, sizeof d->peers[a].host);
    } else if (strncmp(line, "end ", 4) == 0) {
      d->complete = 1;
    } else {
      d->bad_lines++;
    }
  }
  fclose(f);
  if (d->from_tmp) d->complete = 0;
  if (d->n > 1) qsort(d->c, (size_t)d->n, sizeof *d->c, coll_cmp);
  if (!d->have_next) d->next_seq = d->n ? d->c[d->n - 1].seq + 1 : 0;
  return 0;
}

static const coll *find(const dump *d, uint64_t seq) {
  int lo = 0, hi = d->n - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (d->c[mid].seq == seq) return &d->c[mid];
    if (d->c[mid].seq < seq) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

static int is_done(const coll *c) { return c && strcmp(c->state, "done") == 0; }

static int same_sig(const coll *a, const coll *b) {
  return strcmp(a->op, b->op) == 0 && strcmp(a->dtype, b->dtype) == 0 && a->count == b->count &&
         a->arg == b->arg && a->step == b->step && strcmp(a->purpose, b->purpose) == 0;
}

/* "all-reduce #42 (668426 float32, step 12, grad bucket 0)" */
static void describe(const coll *c, char *buf, size_t n) {
  char step[40] = "";
  if (c->step >= 0) snprintf(step, sizeof step, ", step %" PRId64, c->step);
  snprintf(buf, n, "%s #%" PRIu64 " (%" PRId64 " %s%s%s%s)", c->op, c->seq, c->count, c->dtype,
           step, c->purpose[0] ? ", " : "", c->purpose);
}

/* ---- the report ----------------------------------------------------------------------------- */

typedef struct report {
  dump *d; /* [nd], sorted by rank */
  int nd, world;
  peer *peers; /* [world]: from any dump (pid -1: unknown) */
  int have_last;
  uint64_t last_done; /* the last collective every dump has done */
  int have_diff;
  uint64_t diff; /* the first collective not done by every rank */
  int have_sig;
  uint64_t sig; /* the first collective whose signatures differ */
} report;

static const char *host_of(const report *r, int rank) {
  for (int i = 0; i < r->nd; i++)
    if (r->d[i].rank == rank && r->d[i].host[0]) return r->d[i].host;
  return rank < r->world && r->peers[rank].host[0] ? r->peers[rank].host : "?";
}

static long pid_of(const report *r, int rank) {
  for (int i = 0; i < r->nd; i++)
    if (r->d[i].rank == rank && r->d[i].pid >= 0) return r->d[i].pid;
  return rank < r->world ? r->peers[rank].pid : -1;
}

static const dump *dump_of(const report *r, int rank) {
  for (int i = 0; i < r->nd; i++)
    if (r->d[i].rank == rank) return &r->d[i];
  return NULL;
}

static int analyse(report *r) {
  r->world = 0;
  for (int i = 0; i < r->nd; i++) {
    const dump *d = &r->d[i];
    if (d->world > r->world) r->world = d->world;
    if (d->npeers > r->world) r->world = d->npeers;
    if (d->rank + 1 > r->world) r->world = d->rank + 1;
  }
  r->peers = calloc((size_t)(r->world ? r->world : 1), sizeof *r->peers);
  if (!r->peers) return -1;
  for (int k = 0; k < r->world; k++) r->peers[k].pid = -1;
  for (int i = 0; i < r->nd; i++)
    for (int k = 0; k < r->d[i].npeers; k++)
      if (r->d[i].peers[k].pid >= 0 && r->peers[k].pid < 0) r->peers[k] = r->d[i].peers[k];
  /* the window every dump covers: from the latest first entry */
  uint64_t lo = 0, hi = 0;
  for (int i = 0; i < r->nd; i++) {
    const dump *d = &r->d[i];
    if (d->n && d->c[0].seq > lo) lo = d->c[0].seq;
    if (d->next_seq > hi) hi = d->next_seq;
  }
  for (uint64_t s = lo; s < hi; s++) {
    const coll *first = NULL;
    int all_done = 1, any = 0;
    for (int i = 0; i < r->nd; i++) {
      const coll *c = find(&r->d[i], s);
      if (!is_done(c)) all_done = 0;
      if (!c) continue;
      any = 1;
      if (!first) first = c;
      else if (!r->have_sig && !same_sig(first, c)) {
        r->have_sig = 1;
        r->sig = s;
      }
    }
    if (!any) continue;
    if (all_done) {
      r->have_last = 1;
      r->last_done = s;
    } else if (!r->have_diff) {
      r->have_diff = 1;
      r->diff = s;
    }
  }
  return 0;
}

/* What `rank` (with a dump) did with collective s: "done", "inside", "queued", "never". */
static const char *where(const dump *d, uint64_t s, const coll **c) {
  *c = find(d, s);
  if (*c && strcmp((*c)->state, "done") == 0) return "done";
  if (*c && strcmp((*c)->state, "running") == 0) return "inside";
  if (*c && strcmp((*c)->state, "failed") == 0) return "failed";
  if (*c && strcmp((*c)->state, "queued") == 0) return "queued";
  return "never";
}

static void print_text(const report *r, const char *dir) {
  char what[256];
  printf("hang report for %s: %d dump(s), world of %d rank(s)\n", dir, r->nd, r->world);
  /* the headline lines first */
  const dump *any = r->nd ? &r->d[0] : NULL;
  if (r->have_last && any) {
    const coll *c = NULL;
    for (int i = 0; i < r->nd && !c; i++) c = find(&r->d[i], r->last_done);
    describe(c, what, sizeof what);
    printf("last collective every rank finished: %s\n", what);
  } else {
    printf("last collective every rank finished: none in the dumps\n");
  }
  if (r->have_diff) {
    const coll *c = NULL;
    for (int i = 0; i < r->nd && !c; i++) c = find(&r->d[i], r->diff);
    describe(c, what, sizeof what);
    printf("first collective where the ranks differ: %s\n", what);
    static const char *const kinds[] = {"inside", "queued", "failed", "never", "done"};
    static const char *const label[] = {"inside it", "queued behind another (not started)",
                                        "failed in it", "never entered it", "finished it"};
    for (int k = 0; k < 5; k++) {
      int shown = 0;
      for (int i = 0; i < r->nd; i++) {
        const dump *d = &r->d[i];
        const coll *c;
        if (strcmp(where(d, r->diff, &c), kinds[k]) != 0) continue;
        if (!shown++) printf("  %s:", label[k]);
        printf(" rank %d (host %s, pid %ld", d->rank, host_of(r, d->rank), pid_of(r, d->rank));
        if (k == 0 && c->start > 0 && d->now_ms >= c->start)
          printf(", for %.1f s", (d->now_ms - c->start) / 1e3);
        if (k == 1 && c->enq > 0 && d->now_ms >= c->enq)
          printf(", enqueued %.1f s ago", (d->now_ms - c->enq) / 1e3);
        if (k == 3) {
          uint64_t lastd = 0;
          int have = 0;
          for (int j = d->n - 1; j >= 0 && !have; j--)
            if (is_done(&d->c[j])) lastd = d->c[j].seq, have = 1;
          if (have) printf(", last finished #%" PRIu64, lastd);
          else printf(", finished none recorded");
        }
        printf(")");
      }
      if (shown) printf("\n");
    }
  } else if (r->nd) {
    printf("first collective where the ranks differ: none (every rank finished every "
           "collective recorded)\n");
  }
  int missing = 0;
  for (int k = 0; k < r->world; k++) {
    if (dump_of(r, k)) continue;
    if (!missing++) printf("ranks that left no dump (stopped, killed, or their folder is on "
                           "another host: copy every host's dumps into one folder):");
    printf(" rank %d (host %s, pid %ld)", k, host_of(r, k), pid_of(r, k));
  }
  if (missing) printf("\n");
  if (r->have_sig) {
    printf("ranks whose collectives differ: #%" PRIu64 ":", r->sig);
    int *seen = calloc((size_t)r->nd, sizeof *seen);
    for (int i = 0; seen && i < r->nd; i++) {
      const coll *ci = find(&r->d[i], r->sig);
      if (!ci || seen[i]) continue;
      printf(" rank");
      int nr = 0;
      for (int j = i; j < r->nd; j++) {
        const coll *cj = find(&r->d[j], r->sig);
        if (!cj || seen[j] || !same_sig(ci, cj)) continue;
        seen[j] = 1;
        printf("%s %d", nr++ ? "," : "", r->d[j].rank);
      }
      describe(ci, what, sizeof what);
      printf(" %s;", what);
    }
    free(seen);
    printf(" (a rank that skipped or repeated a step, or synced alone, pairs its collectives "
           "with other steps' collectives)\n");
  }
  printf("per rank:\n");
  for (int i = 0; i < r->nd; i++) {
    const dump *d = &r->d[i];
    printf("  rank %d host %s pid %ld: dump reason '%s', %d collective(s) recorded, next #%"
           PRIu64 "%s", d->rank, host_of(r, d->rank), pid_of(r, d->rank),
           d->reason[0] ? d->reason : "?", d->n, d->next_seq,
           d->complete ? "" : d->from_tmp ? "; CUT SHORT (only the .tmp: killed while writing)"
                                          : "; CUT SHORT (no end line)");
    if (d->bad_lines) printf("; %d unreadable line(s)", d->bad_lines);
    printf("\n");
  }
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    const unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20 || ch >= 0x7f) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

static void json_coll(const coll *c) {
  printf("{\"seq\": %" PRIu64 ", \"op\": ", c->seq);
  json_str(c->op);
  printf(", \"dtype\": ");
  json_str(c->dtype);
  printf(", \"count\": %" PRId64 ", \"arg\": %" PRId64 ", \"step\": %" PRId64 ", \"purpose\": ",
         c->count, c->arg, c->step);
  json_str(c->purpose);
  printf("}");
}

static void json_rank(const report *r, int rank) {
  printf("{\"rank\": %d, \"host\": ", rank);
  json_str(host_of(r, rank));
  printf(", \"pid\": %ld}", pid_of(r, rank));
}

static void print_json(const report *r, const char *dir) {
  printf("{\"dir\": ");
  json_str(dir);
  printf(", \"world\": %d, \"dumps\": [", r->world);
  for (int i = 0; i < r->nd; i++) {
    const dump *d = &r->d[i];
    printf("%s{\"rank\": %d, \"host\": ", i ? ", " : "", d->rank);
    json_str(host_of(r, d->rank));
    printf(", \"pid\": %ld, \"reason\": ", pid_of(r, d->rank));
    json_str(d->reason);
    printf(", \"file\": ");
    json_str(d->file);
    printf(", \"collectives\": %d, \"next_seq\": %" PRIu64 ", \"truncated\": %s, "
           "\"bad_lines\": %d}", d->n, d->next_seq, d->complete ? "false" : "true", d->bad_lines);
  }
  printf("], \"no_dump\": [");
  int m = 0;
  for (int k = 0; k < r->world; k++)
    if (!dump_of(r, k)) {
      printf("%s", m++ ? ", " : "");
      json_rank(r, k);
    }
  printf("], \"last_all_finished\": ");
  const coll *c = NULL;
  for (int i = 0; r->have_last && i < r->nd && !c; i++) c = find(&r->d[i], r->last_done);
  if (c) json_coll(c);
  else printf("null");
  printf(", \"first_difference\": ");
  c = NULL;
  for (int i = 0; r->have_diff && i < r->nd && !c; i++) c = find(&r->d[i], r->diff);
  if (!c) {
    printf("null");
  } else {
    printf("{\"collective\": ");
    json_coll(c);
    static const char *const kinds[] = {"done", "inside", "queued", "failed", "never"};
    static const char *const keys[] = {"finished", "inside", "queued", "failed",
                                       "never_entered"};
    for (int k = 0; k < 5; k++) {
      printf(", \"%s\": [", keys[k]);
      int n = 0;
      for (int i = 0; i < r->nd; i++) {
        const coll *ci;
        if (strcmp(where(&r->d[i], r->diff, &ci), kinds[k]) != 0) continue;
        printf("%s{\"rank\": %d, \"host\": ", n++ ? ", " : "", r->d[i].rank);
        json_str(host_of(r, r->d[i].rank));
        printf(", \"pid\": %ld", pid_of(r, r->d[i].rank));
        if (k == 1 && ci->start > 0) printf(", \"seconds\": %.3f", (r->d[i].now_ms - ci->start) / 1e3);
        printf("}");
      }
      printf("]");
    }
    printf("}");
  }
  printf(", \"signature_mismatch\": ");
  if (!r->have_sig) {
    printf("null");
  } else {
    printf("{\"seq\": %" PRIu64 ", \"ranks\": [", r->sig);
    int n = 0;
    for (int i = 0; i < r->nd; i++) {
      const coll *ci = find(&r->d[i], r->sig);
      if (!ci) continue;
      printf("%s{\"rank\": %d, \"collective\": ", n++ ? ", " : "", r->d[i].rank);
      json_coll(ci);
      printf("}");
    }
    printf("]}");
  }
  printf("}\n");
}

static int rank_cmp(const void *a, const void *b) {
  const dump *x = a, *y = b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static void usage(FILE *f) {
  fprintf(f, "usage: mpitrain hang-report DIR [--json]\n"
             "  DIR     the folder of the flight recorder's dumps (flight-rankR.txt, one per\n"
             "          rank: --debug-dir, else --checkpoint-dir, else ./mpitrain-debug);\n"
             "          copy every host's dumps into one folder first\n"
             "  --json  the report as one JSON object\n"
             "Prints the last collective every rank finished, the first where the ranks\n"
             "differ (who is inside it and for how long, who never entered it, with host and\n"
             "pid), ranks whose collectives differ (op, count, dtype, step, purpose), and the\n"
             "ranks that left no dump. Exit status: 0 report printed, 1 no dump read, 2 usage.\n");
}

int mpt_cli_hang_report(int argc, char **argv) {
  const char *dir = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "mpitrain hang-report: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else if (dir) {
      fprintf(stderr, "mpitrain hang-report: one folder, not '%s' and '%s'\n", dir, argv[i]);
      return 2;
    } else {
      dir = argv[i];
    }
  }
  if (!dir) {
    fprintf(stderr, "mpitrain hang-report: no folder given\n");
    usage(stderr);
    return 2;
  }
  DIR *dp = opendir(dir);
  if (!dp) {
    fprintf(stderr, "mpitrain hang-report: cannot read the folder %s: %s\n", dir,
            strerror(errno));
    return 1;
  }
  report r;
  memset(&r, 0, sizeof r);
  int cap = 0, status = 0;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    int rank = -1, used = 0;
    if (sscanf(e->d_name, "flight-rank%d.txt%n", &rank, &used) != 1 || rank < 0 ||
        rank >= MAX_RANKS)
      continue;
    const char *rest = e->d_name + used;
    const int tmp = strcmp(rest, ".tmp") == 0;
    if (rest[0] && !tmp) continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (tmp) { /* only when the rank has no whole dump */
      char whole[4200];
      snprintf(whole, sizeof whole, "%s/flight-rank%d.txt", dir, rank);
      FILE *f = fopen(whole, "r");
      if (f) {
        fclose(f);
        continue;
      }
    }
    if (r.nd == cap) {
      cap = cap ? 2 * cap : 16;
      dump *g = realloc(r.d, sizeof *g * (size_t)cap);
      if (!g) {
        status = 1;
        break;
      }
      r.d = g;
    }
    if (read_dump(path, rank, tmp, &r.d[r.nd]) != 0) {
      fprintf(stderr, "mpitrain hang-report: cannot read %s: %s\n", path, strerror(errno));
      free(r.d[r.nd].c);
      free(r.d[r.nd].peers);
      continue;
    }
    r.nd++;
  }
  closedir(dp);
  if (status == 0 && r.nd == 0) {
    fprintf(stderr, "mpitrain hang-report: no dump (flight-rankR.txt) in %s: a rank writes one "
            "on SIGUSR2, on a collective timeout or error, and on a fatal signal\n", dir);
    status = 1;
  }
  if (status == 0) {
    qsort(r.d, (size_t)r.nd, sizeof *r.d, rank_cmp);
    if (analyse(&r) != 0) {
      fprintf(stderr, "mpitrain hang-report: out of memory\n");
      status = 1;
    } else if (json) {
      print_json(&r, dir);
    } else {
      print_text(&r, dir);
    }
  }
  for (int i = 0; i < r.nd; i++) {
    free(r.d[i].c);
    free(r.d[i].peers);
  }
  free(r.d);
  free(r.peers);
  return status;
}
