/* placement-bench.c — frames/s of the two multi-device placements, chain and
 * batch fan-out, on the same pipeline, devices and jobs in one run.
 *
 *   placement-bench [--devices D] [--jobs J] [--frames F] [--us U] [--config FILE]
 *
 * The pipeline is loaded twice, once with [pipeline] placement = "chain" and
 * once with "fanout" (the line is put right after the config's [pipeline]
 * header), J jobs are started at once on each, and frames/s is the frames all
 * J jobs finished at their sinks over the wall time until the last one ended.
 * Each placement is the other's peer. Load time (instances created and
 * models preloaded on every device) is printed beside.
 *
 * Default pipeline: synth (F frames, 160x120) -> cost (U µs of CPU work per
 * frame, one instance per device) -> check (every frame, in order), which
 * runs on emulated devices (--devices cpu:4, the default) and shows the
 * scheduling difference only. On GPUs, pass a config whose device stages have
 * instances = { devices = "all" } (docs/gpu.md) and --devices cuda. The util
 * stages are found through SPINDLE_PLUGIN_PATH (BUILD/stages/util).
 * Not a test: it prints figures and never fails on speed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spindle/runtime.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct run_job {
  atomic_llong done;
} run_job_t;

static void on_progress(void *data, const spn_job_progress_t *p) { atomic_store(&((run_job_t *)data)->done, p->done); }

static void on_done(void *data, uint64_t id, int32_t status, const char *msg) {
  (void)data;
  if (status != SPN_OK)
    fprintf(stderr, "job %llu: %s\n", (unsigned long long)id, msg);
}

/* The config text with `placement = "<p>"` after its [pipeline] header. */
static char *with_placement(const char *text, const char *p) {
  const char *h = strstr(text, "[pipeline]\n");
  if (!h)
    return NULL;
  size_t at = (size_t)(h - text) + strlen("[pipeline]\n");
  size_t n = strlen(text) + 64;
  char *out = malloc(n);
  if (out)
    snprintf(out, n, "%.*splacement = \"%s\"\n%s", (int)at, text, p, text + at);
  return out;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  if (b)
    b[n] = '\0';
  fclose(f);
  return b;
}

static int run(spn_runtime_t *rt, const char *text, const char *name, const char *placement, int jobs,
               double *fps, double *load_s, double *dev_s) {
  char *cfg = with_placement(text, placement);
  if (!cfg) {
    fprintf(stderr, "%s: no [pipeline] table to put placement in\n", name);
    return 1;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = NULL;
  double t0 = now_s();
  int32_t rc = spn_pipeline_load_string(rt, cfg, strlen(cfg), name, NULL, 0, &pipe, &err);
  *load_s = now_s() - t0;
  free(cfg);
  if (rc != SPN_OK) {
    fprintf(stderr, "%s: %s\n", name, err.msg);
    return 1;
  }
  run_job_t *rj = calloc((size_t)jobs, sizeof *rj);
  spn_job_t **js = calloc((size_t)jobs, sizeof *js);
  if (!rj || !js)
    return 1;
  t0 = now_s();
  for (int i = 0; i < jobs; i++) {
    spn_job_callbacks_t cb = {.struct_size = sizeof cb, .data = &rj[i], .on_progress = on_progress, .on_done = on_done};
    if (spn_job_start(pipe, NULL, &cb, &js[i], &err) != SPN_OK) {
      fprintf(stderr, "%s: %s\n", name, err.msg);
      return 1;
    }
  }
  int bad = 0;
  long long frames = 0;
  *dev_s = 0;
  for (int i = 0; i < jobs; i++) {
    bad |= spn_job_wait(js[i], NULL) != SPN_OK;
    frames += atomic_load(&rj[i].done);
    *dev_s += spn_job_device_seconds(js[i]);
    spn_job_free(&js[i]);
  }
  double dt = now_s() - t0;
  *fps = dt > 0 ? (double)frames / dt : 0;
  free(rj);
  free(js);
  spn_pipeline_free(&pipe);
  return bad;
}

int main(int argc, char **argv) {
  const char *devices = "cpu:4", *config = NULL;
  int jobs = 8;
  long frames = 400, us = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--devices"))
      devices = argv[i + 1];
    else if (!strcmp(argv[i], "--jobs"))
      jobs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--frames"))
      frames = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--us"))
      us = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--config"))
      config = argv[i + 1];
    else {
      fprintf(stderr, "usage: placement-bench [--devices D] [--jobs J] [--frames F] [--us U] [--config FILE]\n");
      return 2;
    }
  }
  if (jobs < 1 || jobs > 1024) {
    fprintf(stderr, "--jobs: 1..1024\n");
    return 2;
  }
  char *text = NULL;
  if (config) {
    if (!(text = read_file(config))) {
      fprintf(stderr, "%s: cannot read\n", config);
      return 1;
    }
  } else {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "[pipeline]\nname = \"placement-bench\"\n\n"
             "[[stage]]\nname = \"source\"\nkind = \"synth\"\nframes = %ld\nwidth = 160\nheight = 120\n\n"
             "[[stage]]\nname = \"work\"\nkind = \"cost\"\ninputs = [\"source\"]\nus = %ld\n"
             "instances = { count = 1, devices = \"all\" }\n\n"
             "[[stage]]\nname = \"sink\"\nkind = \"check\"\ninputs = [\"work\"]\nexpect_frames = %ld\n"
             "verify_pattern = true\n",
             frames, us, frames);
    text = strdup(buf);
  }
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.log_level = SPN_LOG_WARN;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK) {
    fprintf(stderr, "runtime: %s\n", err.msg);
    free(text);
    return 1;
  }
  const char *name = config ? config : "placement-bench";
  printf("devices %s (%u), %d jobs at once, %s\n", devices, spn_runtime_device_count(rt), jobs,
         config ? config : "synth -> cost -> check");
  double fps[2], load[2], dev[2];
  const char *pl[2] = {"chain", "fanout"};
  int bad = 0;
  for (int k = 0; k < 2; k++) {
    bad |= run(rt, text, name, pl[k], jobs, &fps[k], &load[k], &dev[k]);
    printf("%-7s %10.1f frames/s   load %.3f s   device time %.2f s\n", pl[k], fps[k], load[k], dev[k]);
  }
  if (fps[0] > 0)
    printf("fanout / chain: %.2fx\n", fps[1] / fps[0]);
  spn_runtime_free(&rt);
  free(text);
  return bad;
}
