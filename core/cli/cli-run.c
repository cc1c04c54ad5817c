/* cli-run.c — `spindle run PIPELINE.toml`: load a pipeline, run one job
 * through it, show live progress on a TTY, print a summary, and exit with
 * the outcome: 0 the job succeeded, 1 it failed (or the pipeline could not
 * start), 2 a usage or config error, 130 interrupted (Ctrl-C cancels the
 * job first, so stages remove partial outputs).
 *
 * Runtime callbacks only store into atomics; the main thread does all the
 * printing, so nothing the runtime calls ever blocks on a terminal.
 */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jobs-internal.h"

typedef struct run_state {
  atomic_llong done;
  atomic_llong total;
  atomic_bool finished;
  int32_t status;               /* written before finished is set */
  char msg[SPN_ERROR_MSG_MAX];
} run_state_t;

static volatile sig_atomic_t interrupted;

/* The first Ctrl-C or SIGTERM cancels the job (its stages stop, the
 * output is not published); a second one quits at once, for a stage that
 * does not stop (one blocked in a read that nothing interrupts). */
static void on_sigint(int sig) {
  if (interrupted) {
    static const char msg[] = "\nspindle run: interrupted again: quitting without waiting for the stages\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    _exit(128 + sig);
  }
  interrupted = 1;
}

static void on_progress(void *data, const spn_job_progress_t *p) {
  run_state_t *s = data;
  atomic_store(&s->done, p->done);
  atomic_store(&s->total, p->total);
}

static void on_done(void *data, uint64_t job_id, int32_t status, const char *msg) {
  run_state_t *s = data;
  s->status = status;
  snprintf(s->msg, sizeof s->msg, "%s", msg ? msg : "");
  atomic_store(&s->finished, true);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The pipeline's counters (busy time and copies per stage, traffic per
 * edge) add up over every job since it was loaded; with --repeat each run's
 * summary shows what that run added: the counters at its start are kept
 * here and subtracted. */
typedef struct run_base {
  size_t n_stages, n_edges;
  uint64_t *busy, *stream, *stream_calls;
  spn_transfer_stats_t *stage_x;
  spn_edge_stats_t *edge;
} run_base_t;

static void base_free(run_base_t *b) {
  free(b->busy);
  free(b->stream);
  free(b->stream_calls);
  free(b->stage_x);
  free(b->edge);
  memset(b, 0, sizeof *b);
}

/* Fill b with the counters now (allocating on first use); false when out of
 * memory. */
static bool base_take(const spn_pipeline_t *pipe, run_base_t *b) {
  if (!b->busy) {
    b->n_stages = spn_pipeline_stage_count(pipe);
    b->n_edges = spn_pipeline_edge_count(pipe);
    b->busy = calloc(b->n_stages + 1, sizeof *b->busy);
    b->stream = calloc(b->n_stages + 1, sizeof *b->stream);
    b->stream_calls = calloc(b->n_stages + 1, sizeof *b->stream_calls);
    b->stage_x = calloc(b->n_stages + 1, sizeof *b->stage_x);
    b->edge = calloc(b->n_edges + 1, sizeof *b->edge);
    if (!b->busy || !b->stream || !b->stream_calls || !b->stage_x || !b->edge)
      return false;
  }
  for (size_t i = 0; i < b->n_stages; i++) {
    spn_pipeline_stage_time(pipe, i, &b->busy[i]);
    spn_pipeline_stage_stream_time(pipe, i, &b->stream[i], &b->stream_calls[i]);
    b->stage_x[i] = (spn_transfer_stats_t)SPN_TRANSFER_STATS_INIT;
    spn_pipeline_stage_transfers(pipe, i, &b->stage_x[i]);
  }
  for (size_t i = 0; i < b->n_edges; i++)
    if (spn_pipeline_edge_stats(pipe, i, &b->edge[i]) != SPN_OK)
      memset(&b->edge[i], 0, sizeof b->edge[i]);
  return true;
}

static void sub4(uint64_t a[4], const uint64_t b[4]) {
  for (int d = 0; d < 4; d++)
    a[d] -= b[d];
}

/* Stage i's busy ns and own copies since the base. */
static const char *stage_run(const spn_pipeline_t *pipe, const run_base_t *b, size_t i, uint64_t *ns,
                             spn_transfer_stats_t *x) {
  const char *name = spn_pipeline_stage_time(pipe, i, ns);
  *x = (spn_transfer_stats_t)SPN_TRANSFER_STATS_INIT;
  spn_pipeline_stage_transfers(pipe, i, x);
  if (i < b->n_stages) {
    *ns -= b->busy[i];
    sub4(x->copies, b->stage_x[i].copies);
    sub4(x->bytes, b->stage_x[i].bytes);
    sub4(x->ns, b->stage_x[i].ns);
  }
  return name;
}

/* Stage i's stream time since the base (*ns) and the calls timed; false
 * when none was (not on a device, or the device cannot time). */
static bool stage_stream(const spn_pipeline_t *pipe, const run_base_t *b, size_t i, uint64_t *ns) {
  uint64_t calls = 0;
  spn_pipeline_stage_stream_time(pipe, i, ns, &calls);
  if (i < b->n_stages) {
    *ns -= b->stream[i];
    calls -= b->stream_calls[i];
  }
  return calls > 0;
}

static void json_string(FILE *f, const char *s);

static const char *const copy_dirs[] = {"h2d", "d2h", "d2d", "h2h"};
static const char *const mem_names[] = {"device", "host", "pinned"};

/* Copies by direction (count, bytes, time): every direction as JSON
 * members, or the non-zero ones as text; the same shape for an edge, a
 * stage and the job. */
static void print_copies(const uint64_t copies[4], const uint64_t bytes[4], const uint64_t ns[4], bool json) {
  for (int d = 0; d < 4; d++) {
    if (json)
      printf(",\"%s\":{\"copies\":%llu,\"bytes\":%llu,\"ms\":%.3f}", copy_dirs[d], (unsigned long long)copies[d],
             (unsigned long long)bytes[d], (double)ns[d] / 1e6);
    else if (copies[d])
      printf(", %s %llu copies %llu bytes %.1f ms", copy_dirs[d], (unsigned long long)copies[d],
             (unsigned long long)bytes[d], (double)ns[d] / 1e6);
  }
}

/* Bytes that crossed between host and device or between devices (not host
 * to host) per output frame: the figure issue 14 holds to one frame. */
static double device_bytes_per_frame(const spn_transfer_stats_t *x, long long frames) {
  uint64_t b = x->bytes[SPN_COPY_H2D] + x->bytes[SPN_COPY_D2H] + x->bytes[SPN_COPY_D2D];
  return frames > 0 ? (double)b / (double)frames : 0.0;
}

/* Per-edge traffic: format, memory, what passed as it was, what was copied
 * (count, bytes, time per direction), and whether a conversion sits there. */
static void print_edges(const spn_pipeline_t *pipe, const run_base_t *b, bool json) {
  if (json)
    printf(",\"edges\":[");
  for (size_t i = 0; i < spn_pipeline_edge_count(pipe); i++) {
    spn_edge_stats_t e;
    if (spn_pipeline_edge_stats(pipe, i, &e) != SPN_OK)
      continue;
    if (i < b->n_edges) {
      e.messages -= b->edge[i].messages;
      e.items_passed -= b->edge[i].items_passed;
      sub4(e.copies, b->edge[i].copies);
      sub4(e.bytes, b->edge[i].bytes);
      sub4(e.ns, b->edge[i].ns);
    }
    const char *mem = e.mem_kind >= 0 && e.mem_kind <= 2 ? mem_names[e.mem_kind] : "?";
    if (json) {
      printf("%s{\"from\":", i ? "," : "");
      json_string(stdout, e.from_stage);
      printf(",\"from_port\":");
      json_string(stdout, e.from_port);
      printf(",\"to\":");
      json_string(stdout, e.to_stage);
      printf(",\"to_port\":");
      json_string(stdout, e.to_port);
      printf(",\"format\":\"%s\",\"memory\":\"%s\",\"conversion\":%s,\"messages\":%llu,\"passed\":%llu", e.format,
             mem, e.converted ? "true" : "false", (unsigned long long)e.messages, (unsigned long long)e.items_passed);
      print_copies(e.copies, e.bytes, e.ns, true);
      printf("}");
    } else {
      printf("  edge  %s.%s -> %s.%s: %s, %s memory%s; %llu messages, %llu items passed", e.from_stage, e.from_port,
             e.to_stage, e.to_port, e.format, mem, e.converted ? ", conversion" : "", (unsigned long long)e.messages,
             (unsigned long long)e.items_passed);
      print_copies(e.copies, e.bytes, e.ns, false);
      printf("\n");
    }
  }
  if (json)
    printf("]");
}

static double stage_share(const spn_pipeline_t *pipe, const run_base_t *b, uint64_t ns) {
  uint64_t total = 0;
  for (size_t i = 0; i < spn_pipeline_stage_count(pipe); i++) {
    uint64_t t = 0;
    spn_pipeline_stage_time(pipe, i, &t);
    total += t - (i < b->n_stages ? b->busy[i] : 0);
  }
  return total ? (double)ns / (double)total : 0.0;
}

/* Config and input problems are the user's to fix (2); anything else that
 * stops a pipeline from starting (a device, a model) is a failure (1). */
static int load_exit_code(int32_t status) {
  switch (status) {
  case SPN_ECONFIG:
  case SPN_ETYPE:
  case SPN_EPARSE:
  case SPN_ENOENT:
  case SPN_EINVAL:
    return 2;
  default:
    return 1;
  }
}

static void json_string(FILE *f, const char *s) {
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

static void usage(FILE *f) {
  fprintf(f,
          "usage: spindle run PIPELINE.toml [--input NAME=PATH]... [--output NAME=PATH]...\n"
          "                   [--param NAME=VALUE]... [--set stage.key=value]... [--devices SPEC]\n"
          "                   [--plugin-path DIR]... [--log-format json|text] [--repeat N]\n"
          "                   [--timeout S] [--cancel-grace S] [--log-level debug|info|warn|error]\n"
          "Runs one job through the pipeline. --devices: auto, cpu, cpu:N, cuda, cuda:0,1.\n"
          "--input/--output/--param: the job's files and params by the names the config\n"
          "binds ([pipeline.inputs], [pipeline.outputs], [pipeline.params]), as spindle\n"
          "submit takes them: an input sets every key it is bound to; what is not given\n"
          "keeps the config's value. --set sets one stage key.\n"
          "--repeat N: N jobs, one after the other, on the pipeline loaded once (models\n"
          "stay resident, as on a worker): a summary per run; the first includes the\n"
          "warm-up (cuDNN algorithm choice, CUDA Graph capture), later ones do not.\n"
          "--timeout S: a run that takes longer is cancelled and fails (exit 1).\n"
          "--log-level: the least severe log lines shown (default info; debug shows what\n"
          "the stages log for each batch or frame).\n"
          "--cancel-grace S: once a run is cancelled (--timeout, Ctrl-C), how long its\n"
          "stages may take to stop before spindle run quits without them, naming the\n"
          "stage still in a call (default 120; 0 waits for ever).\n"
          "Exit status: 0 job succeeded, 1 job failed or timed out, 2 usage or config error,\n"
          "130 interrupted.\n");
}

/* What the stages warned of (docs/jobs.md, "Warnings"), the pipeline's then
 * the job's; the log showed them as they came, among the rest. JSON: the
 * members of an array of strings (n counts them); text: a line each. */
typedef struct warn_out {
  bool json;
  size_t n;
} warn_out_t;

static void print_warning(void *user, const char *line) {
  warn_out_t *w = user;
  if (w->json) {
    printf("%s", w->n++ ? "," : "");
    json_string(stdout, line);
  } else {
    printf("  warning: %s\n", line);
  }
}

/* One run's summary: JSON (one object on a line) or text. run is 1..n with
 * --repeat, 0 without. */
static void print_summary(const spn_pipeline_t *pipe, spn_job_t *job, const run_base_t *b, const run_state_t *st,
                          const spn_error_t *err, int32_t status, double elapsed, bool json, int32_t run, int32_t n) {
  long long frames = atomic_load(&st->done);
  const char *what = status == SPN_OK              ? "succeeded"
                     : status == SPN_ECANCELLED ? "cancelled"
                     : status == SPN_ETIMEDOUT  ? "timed out"
                                                : "failed";
  double fps = elapsed > 0 ? (double)frames / elapsed : 0;
  spn_transfer_stats_t xfer = SPN_TRANSFER_STATS_INIT;
  spn_job_transfers(job, &xfer);
  if (json) {
    printf("{\"pipeline\":");
    json_string(stdout, spn_pipeline_name(pipe));
    if (run)
      printf(",\"run\":%d,\"runs\":%d", (int)run, (int)n);
    printf(",\"job_id\":%llu,\"status\":\"%s\",\"frames\":%lld,\"elapsed_s\":%.3f,\"frames_per_s\":%.1f",
           (unsigned long long)spn_job_id(job), status == SPN_ETIMEDOUT ? "timed_out" : what, frames, elapsed,
           isfinite(fps) ? fps : 0.0);
    printf(",\"device_s\":%.3f,\"restarts\":%u", spn_job_device_seconds(job), spn_job_restarts(job));
    printf(",\"transfers\":{\"bytes_per_frame\":%.1f", device_bytes_per_frame(&xfer, frames));
    print_copies(xfer.copies, xfer.bytes, xfer.ns, true);
    printf("}");
    if (status != SPN_OK) {
      printf(",\"error\":");
      json_string(stdout, st->msg[0] ? st->msg : err->msg);
    }
    printf(",\"stages\":[");
    for (size_t i = 0; i < spn_pipeline_stage_count(pipe); i++) {
      uint64_t ns = 0;
      spn_transfer_stats_t x;
      const char *name = stage_run(pipe, b, i, &ns, &x);
      printf("%s{\"name\":", i ? "," : "");
      json_string(stdout, name ? name : "");
      printf(",\"busy_ms\":%.3f,\"share\":%.4f", (double)ns / 1e6, stage_share(pipe, b, ns));
      uint64_t sns = 0;
      if (stage_stream(pipe, b, i, &sns))
        printf(",\"stream_ms\":%.3f", (double)sns / 1e6);
      print_copies(x.copies, x.bytes, x.ns, true);
      printf("}");
    }
    printf("]");
    print_edges(pipe, b, true);
    printf(",\"warnings\":[");
    spn_job_warnings_each(job, "the log", print_warning, &(warn_out_t){.json = true});
    printf("]}\n");
  } else {
    if (run)
      printf("run %d of %d: ", (int)run, (int)n);
    printf("%s: job %llu %s: %lld frame%s in %.2f s (%.1f frames/s)\n", spn_pipeline_name(pipe),
           (unsigned long long)spn_job_id(job), what, frames, frames == 1 ? "" : "s", elapsed, fps);
    /* Only with stages on devices (GPUs, or emulated cpu:N ones). */
    if (spn_job_device_seconds(job) > 0 || spn_job_restarts(job))
      printf("  device time %.2f s; restarted %u times after a device was quarantined\n", spn_job_device_seconds(job),
             spn_job_restarts(job));
    for (size_t i = 0; i < spn_pipeline_stage_count(pipe); i++) {
      uint64_t ns = 0;
      spn_transfer_stats_t x;
      const char *name = stage_run(pipe, b, i, &ns, &x);
      printf("  stage %-16s %10.1f ms %5.1f%%", name ? name : "", (double)ns / 1e6, 100.0 * stage_share(pipe, b, ns));
      uint64_t sns = 0;
      if (stage_stream(pipe, b, i, &sns))
        printf(", stream %.1f ms", (double)sns / 1e6);
      print_copies(x.copies, x.bytes, x.ns, false); /* the stage's own (buffer_copy) */
      printf("\n");
    }
    print_edges(pipe, b, false);
    bool copied = false;
    for (int d = 0; d < 4; d++)
      copied |= xfer.copies[d] != 0;
    if (copied) { /* edges and stages together, this job's */
      printf("  transfers");
      print_copies(xfer.copies, xfer.bytes, xfer.ns, false);
      printf("; %.1f bytes per frame between host and devices\n", device_bytes_per_frame(&xfer, frames));
    }
    spn_job_warnings_each(job, "the log", print_warning, &(warn_out_t){.json = false});
  }
  fflush(stdout);
}

/* After a cancel that the stages did not answer within --cancel-grace:
 * which stage is still inside a call, and for how long. */
static void stuck_report(const spn_pipeline_t *pipe, double since_cancel, double grace) {
  const char *name = NULL;
  double longest = 0;
  for (size_t i = 0; i < spn_pipeline_stage_count(pipe); i++) {
    double secs = 0;
    const char *n = spn_pipeline_stage_in_call(pipe, i, &secs);
    if (n && secs > longest) {
      name = n;
      longest = secs;
    }
  }
  if (name)
    fprintf(stderr, "spindle run: stage \"%s\" has been inside one call for %.0f s and did not stop within "
            "--cancel-grace %g s of the cancel; quitting without waiting for it\n", name, longest, grace);
  else
    fprintf(stderr, "spindle run: the job did not end within --cancel-grace %g s of the cancel (%.0f s); quitting "
            "without waiting for it\n", grace, since_cancel);
}

/* --input/--output/--param as the job service maps them onto the stage
 * keys (spn__pipeline_job_overrides): the job's overrides. Paths go as
 * typed: a job's key, as --set's, is taken from the working directory.
 * Returns 0 or the exit status. */
/* "NAME=VALUE" (the parser checked the '=') into copies of both; 1 when
 * out of memory. */
static int split_binding(const char *v, char **name, char **value) {
  const char *eq = strchr(v, '=');
  *name = strndup(v, (size_t)(eq - v));
  *value = strdup(eq + 1);
  return *name && *value ? 0 : 1;
}

static int job_bindings(const spn_cli_opts_t *o, const spn_pipeline_t *pipe, char ***ov, size_t *n) {
  if (!o->n_inputs && !o->n_outputs && !o->n_params)
    return 0;
  spn_job_spec_t job = {.pipeline = (char *)spn_pipeline_name(pipe)};
  size_t n_io = o->n_inputs + o->n_outputs;
  spn_job_io_t *io = calloc(n_io ? n_io : 1, sizeof *io);
  spn_job_param_t *pa = calloc(o->n_params ? o->n_params : 1, sizeof *pa);
  int rc = io && pa ? 0 : 1;
  for (size_t i = 0; i < n_io && !rc; i++)
    rc = split_binding(i < o->n_inputs ? o->inputs[i] : o->outputs[i - o->n_inputs], &io[i].name, &io[i].path);
  for (size_t i = 0; i < o->n_params && !rc; i++)
    rc = split_binding(o->params[i], &pa[i].key, &pa[i].value);
  if (rc) {
    fprintf(stderr, "spindle run: out of memory\n");
  } else {
    job.inputs = io, job.n_inputs = o->n_inputs;
    job.outputs = io + o->n_inputs, job.n_outputs = o->n_outputs;
    job.params = pa, job.n_params = o->n_params;
    spn_error_t err = SPN_ERROR_INIT;
    if (spn__pipeline_job_overrides(pipe, &job, ov, n, &err) != SPN_OK) {
      fprintf(stderr, "spindle run: %s\n", err.msg);
      rc = 2;
    }
  }
  for (size_t i = 0; io && i < n_io; i++)
    free(io[i].name), free(io[i].path);
  for (size_t i = 0; pa && i < o->n_params; i++)
    free(pa[i].key), free(pa[i].value);
  free(io);
  free(pa);
  return rc;
}

int spn_cli_run(int argc, char **argv) {
  static const char *const allowed[] = {"plugin-path", "set",          "devices", "log-format", "log-level", "repeat",
                                        "timeout",     "cancel-grace", "input",   "output",     "param",     NULL};
  spn_cli_opts_t o;
  int rc = spn_cli_parse_cmd(argc, argv, allowed, true, usage, &o);
  if (rc >= 0)
    return rc;
  spn_runtime_t *rt = NULL;
  spn_pipeline_t *pipe = NULL;
  spn_job_t *job = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  char **job_ov = NULL; /* the job's overrides from --input/--output/--param */
  size_t n_job_ov = 0;
  run_state_t st = {.total = -1};
  bool json = o.log_format == SPN_LOG_FORMAT_JSON;
  bool tty = isatty(STDERR_FILENO) && !json;
  if ((rc = spn_cli_runtime(&o, true, &rt)))
    goto out;
  int32_t status = spn_pipeline_load(rt, o.file, o.sets, o.n_sets, &pipe, &err);
  if (status != SPN_OK) {
    fprintf(stderr, "spindle run: %s\n", err.msg);
    rc = load_exit_code(status);
    goto out;
  }
  spn_job_params_t params = SPN_JOB_PARAMS_INIT;
  if ((rc = job_bindings(&o, pipe, &job_ov, &n_job_ov)) != 0)
    goto out;
  params.overrides = (const char *const *)job_ov;
  params.n_overrides = n_job_ov;
  struct sigaction sa = {.sa_handler = on_sigint}, old_int, old_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  run_base_t base = {0};
  bool wedged = false;
  for (int32_t run = 1; run <= o.repeat; run++) {
    /* Each run is a new job on the same pipeline: stages, models and
     * device memory stay as the previous run left them. */
    spn_job_free(&job);
    atomic_store(&st.done, 0);
    atomic_store(&st.total, -1);
    atomic_store(&st.finished, false);
    st.status = 0;
    st.msg[0] = 0;
    if (!base_take(pipe, &base)) {
      fprintf(stderr, "spindle run: out of memory\n");
      rc = 1;
      break;
    }
    spn_job_callbacks_t cb = {.struct_size = sizeof cb, .data = &st, .on_progress = on_progress, .on_done = on_done};
    double t0 = now_s();
    int32_t started = spn_job_start(pipe, &params, &cb, &job, &err);
    if (started != SPN_OK) {
      fprintf(stderr, "spindle run: %s\n", err.msg);
      rc = started == SPN_EINVAL ? 2 : 1; /* e.g. the output is the input's file: a usage error */
      break;
    }
    bool cancel_sent = false, timed_out = false, said_waiting = false;
    double cancel_t = 0;
    double last_print = t0;
    long long last_done = 0;
    while (!atomic_load(&st.finished)) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
      double t = now_s();
      if (!cancel_sent && o.timeout_s > 0 && t - t0 >= o.timeout_s) {
        fprintf(stderr, "%sspindle run: the job has run for %.1f s, past --timeout %g s: cancelling it\n",
                tty ? "\r\033[K" : "", t - t0, o.timeout_s);
        timed_out = true;
      }
      if ((interrupted || timed_out) && !cancel_sent) {
        spn_job_cancel(job);
        cancel_sent = true;
        cancel_t = t;
      }
      if (cancel_sent && !said_waiting && t - cancel_t >= 5) {
        fprintf(stderr, "%sspindle run: the job was cancelled %.0f s ago and its stages have not all stopped; "
                "waiting (Ctrl-C again quits at once)\n", tty ? "\r\033[K" : "", t - cancel_t);
        said_waiting = true;
      }
      if (cancel_sent && o.cancel_grace_s > 0 && t - cancel_t >= o.cancel_grace_s) {
        /* A stage's call that does not return: quit without it (the
         * pipeline cannot be freed under a thread still inside it). */
        stuck_report(pipe, t - cancel_t, o.cancel_grace_s);
        wedged = true;
        break;
      }
      if (tty && t - last_print >= 0.5) {
        long long d = atomic_load(&st.done), tot = atomic_load(&st.total);
        double fps = (double)(d - last_done) / (t - last_print);
        if (tot >= 0)
          fprintf(stderr, "\r%s: %lld/%lld frames  %.1f frames/s   ", spn_pipeline_name(pipe), d, tot, fps);
        else
          fprintf(stderr, "\r%s: %lld frames  %.1f frames/s   ", spn_pipeline_name(pipe), d, fps);
        last_print = t;
        last_done = d;
      }
    }
    if (wedged) {
      rc = interrupted && !timed_out ? 130 : 1;
      break;
    }
    status = spn_job_wait(job, &err);
    double elapsed = now_s() - t0;
    if (tty)
      fprintf(stderr, "\r\033[K");
    if (timed_out && status == SPN_ECANCELLED) {
      /* the summary says why, not "cancelled" with no cause */
      snprintf(st.msg, sizeof st.msg, "timed out: cancelled after --timeout %g s", o.timeout_s);
      status = SPN_ETIMEDOUT;
    }
    print_summary(pipe, job, &base, &st, &err, status, elapsed, json, o.repeat > 1 ? run : 0, o.repeat);
    rc = status == SPN_OK ? 0 : (interrupted && !timed_out ? 130 : 1);
    if (rc)
      break;
  }
  base_free(&base);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (wedged) {
    /* A thread is still inside a stage's call: freeing the job, pipeline
     * or runtime would wait for it. The process ends with its memory. */
    spn_cli_opts_free(&o);
    return rc;
  }
out:
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  spn_cli_opts_free(&o);
  for (size_t i = 0; i < n_job_ov; i++)
    free(job_ov[i]);
  free(job_ov);
  return rc;
}
