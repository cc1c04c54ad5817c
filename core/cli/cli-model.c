/* cli-model.c — `spindle model inspect|run|bench`: look inside an ONNX
 * model, run it on NumPy .npy inputs, and time it.
 *
 *   spindle model inspect FILE.onnx [DEVICE OPTIONS]
 *   spindle model run FILE.onnx --input NAME=in.npy ... --output-dir DIR
 *                     [--threads N] [--repeat N] [--no-fusion] [DEVICE OPTIONS]
 *   spindle model bench FILE.onnx [--batch 1,32,128] [--size N] [--iters N]
 *                     [--warmup N] [--threads N] [DEVICE OPTIONS]
 *
 * DEVICE OPTIONS: --device cpu|cpu:N|cuda:N, --precision fp32|tf32|fp16,
 * --fallback cpu|error, --no-graphs (see spn_model_opts_t in
 * spindle/engine.h).
 *
 *   spindle model load FILE.onnx --devices D0,D1,... [--repeat N] [DEVICE OPTIONS]
 *
 * `load` times loading the model on every listed device three ways: each
 * device reading the file, one read with the peers uploading their own
 * weights, one read with the weights broadcast (spn_model_opts_t.peers).
 *
 * `bench` feeds uniform random inputs in [0, 1) with the batch dimension set
 * to each --batch value (other dynamic dimensions to --size, default 64) and
 * prints the median and best latency and the throughput (samples/s at the
 * median) per batch size.
 *
 * `run` writes one DIR/<output name>.npy per model output (characters other
 * than letters, digits, '-', '_' and '.' in the name become '_'). The .npy
 * reader accepts little-endian C-order arrays of float32, int64, int32,
 * uint8, int8 and bool (format versions 1.0 to 3.0).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "spindle/engine.h"

static const struct { const char *descr; int32_t dtype; } npy_types[] = {
    {"<f4", SPN_DTYPE_F32}, {"<i8", SPN_DTYPE_I64}, {"<i4", SPN_DTYPE_I32},
    {"|u1", SPN_DTYPE_U8},  {"|i1", SPN_DTYPE_I8},  {"|b1", SPN_DTYPE_BOOL},
};

static const char *dtype_name(int32_t dt) {
  switch (dt) {
  case SPN_DTYPE_F32: return "float32";
  case SPN_DTYPE_I64: return "int64";
  case SPN_DTYPE_I32: return "int32";
  case SPN_DTYPE_U8: return "uint8";
  case SPN_DTYPE_I8: return "int8";
  case SPN_DTYPE_BOOL: return "bool";
  default: return "?";
  }
}

/* Read an .npy file into t (data malloc'd). */
static int npy_read(const char *path, spn_tensor_t *t, char *msg, size_t msz) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(msg, msz, "%s: %s", path, strerror(errno));
    return -1;
  }
  unsigned char pre[12];
  char *hdr = NULL;
  int rc = -1;
  size_t hl;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6)) {
    snprintf(msg, msz, "%s: not a .npy file", path);
    goto out;
  }
  if (pre[6] == 1) {
    hl = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 10, 1, 2, f) != 2) {
      snprintf(msg, msz, "%s: truncated header", path);
      goto out;
    }
    hl = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  if (hl > 1 << 20 || !(hdr = calloc(1, hl + 1)) || fread(hdr, 1, hl, f) != hl) {
    snprintf(msg, msz, "%s: bad header", path);
    goto out;
  }
  char *d = strstr(hdr, "'descr':");
  char *fo = strstr(hdr, "'fortran_order':");
  char *sh = strstr(hdr, "'shape':");
  if (!d || !fo || !sh) {
    snprintf(msg, msz, "%s: header lacks descr/fortran_order/shape", path);
    goto out;
  }
  char *q = strchr(d + 8, '\'');
  t->dtype = SPN_DTYPE_INVALID;
  for (size_t i = 0; q && i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (!strncmp(q + 1, npy_types[i].descr, 3) && q[4] == '\'')
      t->dtype = npy_types[i].dtype;
  if (t->dtype == SPN_DTYPE_INVALID) {
    snprintf(msg, msz, "%s: unsupported dtype in header '%s'", path, hdr);
    goto out;
  }
  if (strncmp(fo + 16 + strspn(fo + 16, " "), "False", 5)) {
    snprintf(msg, msz, "%s: Fortran-order arrays are not supported", path);
    goto out;
  }
  char *p = strchr(sh, '(');
  t->ndim = 0;
  if (!p) {
    snprintf(msg, msz, "%s: bad shape", path);
    goto out;
  }
  p++;
  while (*p && *p != ')') {
    while (*p == ' ' || *p == ',')
      p++;
    if (*p == ')')
      break;
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || t->ndim >= SPN_TENSOR_MAX_DIMS) {
      snprintf(msg, msz, "%s: bad shape", path);
      goto out;
    }
    t->shape[t->ndim++] = v;
    p = end;
  }
  size_t bytes = spn_tensor_nbytes(t);
  t->data = malloc(bytes ? bytes : 1);
  if (!t->data || fread(t->data, 1, bytes, f) != bytes) {
    snprintf(msg, msz, "%s: truncated data (%zu bytes expected)", path, bytes);
    free(t->data);
    t->data = NULL;
    goto out;
  }
  rc = 0;
out:
  free(hdr);
  fclose(f);
  return rc;
}

static int npy_write(const char *path, const spn_tensor_t *t) {
  const char *descr = NULL;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (npy_types[i].dtype == t->dtype)
      descr = npy_types[i].descr;
  if (!descr)
    return -1;
  char shape[256] = "";
  size_t pos = 0;
  for (int i = 0; i < t->ndim; i++)
    pos += (size_t)snprintf(shape + pos, sizeof shape - pos, "%lld,%s", (long long)t->shape[i], i + 1 < t->ndim ? " " : "");
  if (t->ndim > 1 && pos)
    shape[pos - 1] = 0; /* "(a, b)" not "(a, b,)" */
  char hdr[512];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  unsigned short hl = (unsigned short)(n + pad + 1);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
  fwrite(pre, 1, 10, f);
  fwrite(hdr, 1, (size_t)n, f);
  for (int i = 0; i < pad; i++)
    fputc(' ', f);
  fputc('\n', f);
  size_t bytes = spn_tensor_nbytes(t);
  int rc = fwrite(t->data, 1, bytes, f) == bytes ? 0 : -1;
  if (fclose(f))
    rc = -1;
  return rc;
}

static void print_shape(int ndim, const int64_t *s) {
  printf("[");
  for (int i = 0; i < ndim; i++) {
    if (s[i] < 0)
      printf("%s?", i ? ", " : "");
    else
      printf("%s%lld", i ? ", " : "", (long long)s[i]);
  }
  printf("]");
}

enum { O_DEVICE = 256, O_PRECISION, O_FALLBACK, O_NO_GRAPHS, O_INPUT, O_OUTPUT_DIR, O_THREADS, O_REPEAT,
       O_NO_FUSION, O_BATCH, O_ITERS, O_WARMUP, O_SIZE, O_DEVICES, O_PROFILE };
#define DEVICE_OPTS                                                                                           \
  {"device", required_argument, NULL, O_DEVICE}, {"precision", required_argument, NULL, O_PRECISION},         \
      {"fallback", required_argument, NULL, O_FALLBACK}, {"no-graphs", no_argument, NULL, O_NO_GRAPHS}

/* Take a DEVICE_OPTS option: true if c is one. */
static bool device_opt(int c, const char *v, spn_model_opts_t *mo) {
  switch (c) {
  case O_DEVICE: mo->device = v; return true;
  case O_PRECISION: mo->precision = v; return true;
  case O_FALLBACK: mo->fallback = v; return true;
  case O_NO_GRAPHS: mo->no_graphs = 1; return true;
  default: return false;
  }
}

/* A whole decimal integer in [lo, hi], or a usage message naming the option. */
static bool int_opt(const spn_cli_getopt_t *g, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(g->arg, &end, 10);
  if (*end || end == g->arg || errno || v < lo || v > hi) {
    fprintf(stderr, "spindle %s: --%s wants an integer in %lld..%lld, got '%s'\n", g->cmd, g->name, lo, hi, g->arg);
    return false;
  }
  *out = v;
  return true;
}

static const char inspect_usage[] =
    "usage: spindle model inspect FILE.onnx [--device D] [--precision P] [--fallback cpu|error] [--no-graphs]\n";

static int cmd_inspect(int argc, char **argv) {
  static const struct option opts[] = {DEVICE_OPTS, SPN_CLI_HELP_OPT, {0}};
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  const char *file = NULL;
  spn_cli_getopt_t g = {.cmd = "model inspect"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      fputs(inspect_usage, stdout);
      return 0;
    }
    if (c == SPN_CLI_BAD)
      return 2;
    if (device_opt(c, g.arg, &mo))
      continue;
    if (c != SPN_CLI_ARG || file) {
      fprintf(stderr, "spindle model inspect: one model file only (also got '%s')\n", g.arg);
      return 2;
    }
    file = g.arg;
  }
  if (!file) {
    fputs(inspect_usage, stderr);
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_engine_t *eng = NULL;
  spn_model_t *m = NULL;
  if (spn_engine_new(NULL, &eng, &err) || spn_engine_load_opts(eng, file, &mo, &m, &err)) {
    fprintf(stderr, "spindle model: %s\n", err.msg);
    spn_engine_free(&eng);
    return 1;
  }
  printf("model: %s\n", file);
  printf("device: %s (%d node%s on the CPU fallback)\n", spn_model_device(m), spn_model_fallback_count(m),
         spn_model_fallback_count(m) == 1 ? "" : "s");
  for (int io = 0; io < 2; io++) {
    int cnt = io ? spn_model_output_count(m) : spn_model_input_count(m);
    printf("%s:\n", io ? "outputs" : "inputs");
    for (int i = 0; i < cnt; i++) {
      const char *name;
      int32_t dt, nd;
      int64_t sh[SPN_TENSOR_MAX_DIMS];
      if (io)
        spn_model_output_info(m, i, &name, &dt, &nd, sh);
      else
        spn_model_input_info(m, i, &name, &dt, &nd, sh);
      printf("  %-24s %-8s ", name, dtype_name(dt));
      print_shape(nd, sh);
      printf("\n");
    }
  }
  printf("operators:\n");
  int nh = spn_model_op_histogram(m, 0, NULL, NULL);
  for (int i = 0; i < nh; i++) {
    const char *op = NULL;
    int32_t c = 0;
    spn_model_op_histogram(m, i, &op, &c);
    printf("  %-24s %d\n", op, c);
  }
  printf("nodes after passes: %d\n", spn_model_node_count(m));
  printf("parameters: %lld\n", (long long)spn_model_param_count(m));
  bool dyn_spatial = false;
  for (int i = 0; i < spn_model_input_count(m); i++) {
    int32_t nd;
    int64_t sh[SPN_TENSOR_MAX_DIMS];
    spn_model_input_info(m, i, NULL, NULL, &nd, sh);
    for (int d = 1; d < nd; d++)
      dyn_spatial = dyn_spatial || sh[d] < 0;
  }
  printf("FLOPs per sample: %.4g (%.3f GFLOP)%s\n", spn_model_flops(m), spn_model_flops(m) / 1e9,
         dyn_spatial ? " with dynamic dims other than the batch taken as 64" : "");
  spn_model_release(&m);
  spn_engine_free(&eng);
  return 0;
}

static void safe_name(char *dst, size_t n, const char *src) {
  size_t i = 0;
  for (; src[i] && i + 1 < n; i++) {
    char c = src[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    dst[i] = ok ? c : '_';
  }
  dst[i] = 0;
  if (!strcmp(dst, ".") || !strcmp(dst, ".."))
    dst[0] = '_';
}

static const char run_usage[] =
    "usage: spindle model run FILE.onnx --input NAME=in.npy ... --output-dir DIR [--threads N] [--repeat N] "
    "[--no-fusion] [--device D] [--precision P] [--fallback cpu|error] [--no-graphs]\n";

static int cmd_run(int argc, char **argv) {
  static const struct option cli_opts[] = {DEVICE_OPTS,
                                       {"input", required_argument, NULL, O_INPUT},
                                       {"output-dir", required_argument, NULL, O_OUTPUT_DIR},
                                       {"threads", required_argument, NULL, O_THREADS},
                                       {"repeat", required_argument, NULL, O_REPEAT},
                                       {"no-fusion", no_argument, NULL, O_NO_FUSION},
                                       SPN_CLI_HELP_OPT,
                                       {0}};
  const char *file = NULL, *outdir = NULL;
  const char *in_names[64], *in_paths[64];
  int n_given = 0, threads = 0, repeat = 1, no_fusion = 0;
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  spn_cli_getopt_t g = {.cmd = "model run"};
  for (int c; (c = spn_cli_next(&g, argc, argv, cli_opts)) != SPN_CLI_END;) {
    long long n;
    if (device_opt(c, g.arg, &mo))
      continue;
    switch (c) {
    case 'h':
      fputs(run_usage, stdout);
      return 0;
    case O_INPUT: {
      char *eq = strchr(g.arg, '=');
      if (!eq || eq == g.arg || n_given == 64) {
        fprintf(stderr, "spindle model run: --input wants NAME=FILE.npy (at most 64), got '%s'\n", g.arg);
        return 2;
      }
      *eq = 0; /* g.arg points into argv */
      in_names[n_given] = g.arg;
      in_paths[n_given++] = eq + 1;
      break;
    }
    case O_OUTPUT_DIR: outdir = g.arg; break;
    case O_THREADS:
      if (!int_opt(&g, 0, 4096, &n))
        return 2;
      threads = (int)n;
      break;
    case O_REPEAT:
      if (!int_opt(&g, 1, 1000000, &n))
        return 2;
      repeat = (int)n;
      break;
    case O_NO_FUSION: no_fusion = 1; break;
    case SPN_CLI_ARG:
      if (file) {
        fprintf(stderr, "spindle model run: one model file only (also got '%s')\n", g.arg);
        return 2;
      }
      file = g.arg;
      break;
    default: return 2;
    }
  }
  if (!file || !outdir) {
    fputs(run_usage, stderr);
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_engine_opts_t opts = SPN_ENGINE_OPTS_INIT;
  opts.threads = threads;
  opts.no_fusion = no_fusion;
  spn_engine_t *eng = NULL;
  spn_model_t *m = NULL;
  spn_tensor_t ins[64], outs[64];
  int n_in = 0, n_out = 0, rc = 1;
  memset(ins, 0, sizeof ins);
  memset(outs, 0, sizeof outs);
  if (spn_engine_new(&opts, &eng, &err) || spn_engine_load_opts(eng, file, &mo, &m, &err)) {
    fprintf(stderr, "spindle model: %s\n", err.msg);
    goto out;
  }
  n_in = spn_model_input_count(m);
  n_out = spn_model_output_count(m);
  if (n_in > 64 || n_out > 64) {
    fprintf(stderr, "spindle model: too many inputs/outputs\n");
    goto out;
  }
  for (int i = 0; i < n_given; i++) {
    int k = spn_model_input_index(m, in_names[i]);
    if (k < 0) {
      fprintf(stderr, "spindle model: %s has no input '%s'\n", file, in_names[i]);
      goto out;
    }
    char msg[512];
    if (ins[k].data) {
      fprintf(stderr, "spindle model: input '%s' given twice\n", in_names[i]);
      goto out;
    }
    ins[k] = (spn_tensor_t)SPN_TENSOR_INIT;
    if (npy_read(in_paths[i], &ins[k], msg, sizeof msg)) {
      fprintf(stderr, "spindle model: %s\n", msg);
      goto out;
    }
  }
  for (int k = 0; k < n_in; k++)
    if (!ins[k].data) {
      const char *nm;
      spn_model_input_info(m, k, &nm, NULL, NULL, NULL);
      fprintf(stderr, "spindle model: missing --input %s=FILE.npy\n", nm);
      goto out;
    }
  double best = 1e30;
  for (int it = 0; it < repeat; it++) {
    for (int k = 0; k < n_out; k++) {
      spn_model_output_free(&outs[k]);
      outs[k] = (spn_tensor_t)SPN_TENSOR_INIT;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (spn_model_run(m, ins, n_in, outs, n_out, &err)) {
      fprintf(stderr, "spindle model: %s\n", err.msg);
      goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    best = ms < best ? ms : best;
  }
  if (repeat > 1)
    fprintf(stderr, "best of %d runs: %.3f ms\n", repeat, best);
  if (mkdir(outdir, 0755) && errno != EEXIST) {
    fprintf(stderr, "spindle model: %s: %s\n", outdir, strerror(errno));
    goto out;
  }
  for (int k = 0; k < n_out; k++) {
    const char *nm;
    spn_model_output_info(m, k, &nm, NULL, NULL, NULL);
    char safe[256], path[4096];
    safe_name(safe, sizeof safe, nm);
    snprintf(path, sizeof path, "%s/%s.npy", outdir, safe);
    if (npy_write(path, &outs[k])) {
      fprintf(stderr, "spindle model: cannot write %s\n", path);
      goto out;
    }
  }
  rc = 0;
out:
  for (int k = 0; k < 64; k++) {
    free(ins[k].data);
    spn_model_output_free(&outs[k]);
  }
  spn_model_release(&m);
  spn_engine_free(&eng);
  return rc;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Parse "1,32,128" into b[] (at most max); returns the count, -1 if bad. */
static int parse_batches(const char *s, int64_t *b, int max) {
  int n = 0;
  while (*s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 1 || v > 1 << 20 || n == max || (*end && *end != ','))
      return -1;
    b[n++] = v;
    s = *end ? end + 1 : end;
  }
  return n;
}

static const char bench_usage[] =
    "usage: spindle model bench FILE.onnx [--batch 1,32,128] [--size N] [--iters N] [--warmup N] [--threads N] "
    "[--device D] [--precision P] [--fallback cpu|error] [--no-graphs] [--profile TOP]\n";

/* Node times, slowest first. */
static int cmp_row(const void *a, const void *b) {
  double x = ((const spn_node_time_t *)a)->ms, y = ((const spn_node_time_t *)b)->ms;
  return x > y ? -1 : x < y;
}

/* --profile: `runs` profiled runs (spn_model_profile) after the timed ones;
 * prints the `top` slowest nodes (mean ms, share of the profiled total)
 * and the total per operator. Returns 0, or 1 after printing the error. */
static int bench_profile(spn_model_t *m, const spn_tensor_t *ins, int n_in, spn_tensor_t *outs, int n_out,
                         int64_t batch, int runs, int top, double normal_ms) {
  int cap = spn_model_node_count(m) + 1;
  spn_node_time_t *t = calloc((size_t)cap, sizeof *t);
  spn_node_time_t *rows = calloc((size_t)cap, sizeof *rows); /* ms: the sum over the runs */
  int rc = 1, n = 0;
  spn_error_t err = SPN_ERROR_INIT;
  if (!t || !rows) {
    fprintf(stderr, "spindle model: out of memory for the profile\n");
    goto out;
  }
  for (int it = 0; it < runs; it++) {
    for (int k = 0; k < n_out; k++) {
      spn_model_output_free(&outs[k]);
      outs[k] = (spn_tensor_t)SPN_TENSOR_INIT;
    }
    int32_t got = 0;
    if (spn_model_profile(m, ins, n_in, outs, n_out, t, cap, &got, &err)) {
      fprintf(stderr, "spindle model: batch %lld: profile: %s\n", (long long)batch, err.msg);
      goto out;
    }
    if (got > cap)
      got = cap;
    if (it == 0) {
      n = got;
      for (int i = 0; i < n; i++) {
        rows[i] = t[i];
        rows[i].ms = 0;
      }
    }
    for (int i = 0; i < n && i < got; i++)
      rows[i].ms += t[i].ms;
  }
  double total = 0;
  for (int i = 0; i < n; i++)
    total += rows[i].ms / runs;
  printf("profile, batch %lld: %d nodes, each run and waited for on its own (%d runs, mean): %.3f ms in all, "
         "a timed run %.3f ms\n", (long long)batch, n, runs, total, normal_ms);
  /* per operator, in order of first appearance, before sorting the nodes */
  const char *ops[64];
  double op_ms[64];
  int op_cnt[64], n_ops = 0;
  for (int i = 0; i < n; i++) {
    int o = 0;
    while (o < n_ops && strcmp(ops[o], rows[i].op))
      o++;
    if (o == n_ops) {
      if (n_ops == 64)
        continue;
      ops[n_ops] = rows[i].op;
      op_ms[n_ops] = 0;
      op_cnt[n_ops++] = 0;
    }
    op_ms[o] += rows[i].ms / runs;
    op_cnt[o]++;
  }
  qsort(rows, (size_t)n, sizeof *rows, cmp_row);
  printf("%10s %7s  %s\n", "ms", "share", "node (operator, fused operators, device)");
  for (int i = 0; i < n && i < top; i++) {
    double ms = rows[i].ms / runs;
    char fused[32] = "";
    if (rows[i].fused)
      snprintf(fused, sizeof fused, " with %d fused", (int)rows[i].fused);
    printf("%10.4f %6.1f%%  #%d %s (%s%s, %s)\n", ms, total > 0 ? 100 * ms / total : 0.0, (int)rows[i].index,
           rows[i].name, rows[i].op, fused, rows[i].device);
  }
  printf("by operator:");
  for (int o = 0; o < n_ops; o++)
    printf("%s %s x%d %.3f ms (%.1f%%)", o ? "," : "", ops[o], op_cnt[o], op_ms[o], total > 0 ? 100 * op_ms[o] / total : 0.0);
  printf("\n");
  fflush(stdout);
  rc = 0;
out:
  free(t);
  free(rows);
  return rc;
}

static int cmd_bench(int argc, char **argv) {
  static const struct option cli_opts[] = {DEVICE_OPTS,
                                       {"batch", required_argument, NULL, O_BATCH},
                                       {"iters", required_argument, NULL, O_ITERS},
                                       {"warmup", required_argument, NULL, O_WARMUP},
                                       {"threads", required_argument, NULL, O_THREADS},
                                       {"size", required_argument, NULL, O_SIZE},
                                       {"profile", required_argument, NULL, O_PROFILE},
                                       SPN_CLI_HELP_OPT,
                                       {0}};
  const char *file = NULL;
  int64_t batches[16] = {1};
  int nb = 1, iters = 20, warmup = 3, threads = 0, top = 0;
  int64_t size = 64;
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  spn_cli_getopt_t g = {.cmd = "model bench"};
  for (int c; (c = spn_cli_next(&g, argc, argv, cli_opts)) != SPN_CLI_END;) {
    long long n;
    if (device_opt(c, g.arg, &mo))
      continue;
    switch (c) {
    case 'h':
      fputs(bench_usage, stdout);
      return 0;
    case O_BATCH:
      if ((nb = parse_batches(g.arg, batches, 16)) < 1) {
        fprintf(stderr, "spindle model bench: --batch wants sizes like 1,32,128, got '%s'\n", g.arg);
        return 2;
      }
      break;
    case O_ITERS:
      if (!int_opt(&g, 1, 100000, &n))
        return 2;
      iters = (int)n;
      break;
    case O_WARMUP:
      if (!int_opt(&g, 0, 100000, &n))
        return 2;
      warmup = (int)n;
      break;
    case O_THREADS:
      if (!int_opt(&g, 0, 4096, &n))
        return 2;
      threads = (int)n;
      break;
    case O_SIZE:
      if (!int_opt(&g, 1, 1 << 16, &n))
        return 2;
      size = n;
      break;
    case O_PROFILE:
      if (!int_opt(&g, 1, 100000, &n))
        return 2;
      top = (int)n;
      break;
    case SPN_CLI_ARG:
      if (file) {
        fprintf(stderr, "spindle model bench: one model file only (also got '%s')\n", g.arg);
        return 2;
      }
      file = g.arg;
      break;
    default: return 2;
    }
  }
  if (!file) {
    fputs(bench_usage, stderr);
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_engine_opts_t opts = SPN_ENGINE_OPTS_INIT;
  opts.threads = threads;
  spn_engine_t *eng = NULL;
  spn_model_t *m = NULL;
  spn_tensor_t ins[64], outs[64];
  double *ts = calloc((size_t)iters, sizeof(double));
  int rc = 1, n_in = 0, n_out = 0;
  memset(ins, 0, sizeof ins);
  memset(outs, 0, sizeof outs);
  if (!ts || spn_engine_new(&opts, &eng, &err) || spn_engine_load_opts(eng, file, &mo, &m, &err)) {
    fprintf(stderr, "spindle model: %s\n", ts ? err.msg : "out of memory");
    goto out;
  }
  n_in = spn_model_input_count(m);
  n_out = spn_model_output_count(m);
  if (n_in > 64 || n_out > 64) {
    fprintf(stderr, "spindle model: too many inputs/outputs\n");
    goto out;
  }
  printf("model: %s on %s, precision %s, %d iterations after %d warm-up\n", file, spn_model_device(m),
         mo.precision ? mo.precision : "fp32", iters, warmup);
  printf("%8s %12s %12s %14s\n", "batch", "median ms", "best ms", "samples/s");
  uint32_t seed = 1;
  for (int bi = 0; bi < nb; bi++) {
    for (int k = 0; k < n_in; k++) {
      int32_t dt, nd;
      int64_t sh[SPN_TENSOR_MAX_DIMS];
      spn_model_input_info(m, k, NULL, &dt, &nd, sh);
      free(ins[k].data);
      ins[k] = (spn_tensor_t)SPN_TENSOR_INIT;
      ins[k].dtype = dt;
      ins[k].ndim = nd;
      size_t cnt = 1;
      for (int d = 0; d < nd; d++) {
        ins[k].shape[d] = sh[d] >= 0 ? sh[d] : d == 0 ? batches[bi] : size;
        cnt *= (size_t)ins[k].shape[d];
      }
      ins[k].data = calloc(cnt ? cnt : 1, spn_dtype_size(dt));
      if (!ins[k].data) {
        fprintf(stderr, "spindle model: out of memory for input %d\n", k);
        goto out;
      }
      if (dt == SPN_DTYPE_F32)
        for (size_t e = 0; e < cnt; e++) {
          seed = seed * 1664525u + 1013904223u;
          ((float *)ins[k].data)[e] = (float)(seed >> 8) / 16777216.f;
        }
    }
    for (int it = -warmup; it < iters; it++) {
      for (int k = 0; k < n_out; k++) {
        spn_model_output_free(&outs[k]);
        outs[k] = (spn_tensor_t)SPN_TENSOR_INIT;
      }
      double t0 = now_ms();
      if (spn_model_run(m, ins, n_in, outs, n_out, &err)) {
        fprintf(stderr, "spindle model: batch %lld: %s\n", (long long)batches[bi], err.msg);
        goto out;
      }
      if (it >= 0)
        ts[it] = now_ms() - t0;
    }
    qsort(ts, (size_t)iters, sizeof *ts, cmp_double);
    double med = ts[iters / 2];
    printf("%8lld %12.3f %12.3f %14.1f\n", (long long)batches[bi], med, ts[0], med > 0 ? (double)batches[bi] * 1e3 / med : 0.0);
    fflush(stdout);
    if (top && bench_profile(m, ins, n_in, outs, n_out, batches[bi], iters, top, med))
      goto out;
  }
  rc = 0;
out:
  for (int k = 0; k < 64; k++) {
    free(ins[k].data);
    spn_model_output_free(&outs[k]);
  }
  free(ts);
  spn_model_release(&m);
  spn_engine_free(&eng);
  return rc;
}

static const char load_usage[] =
    "usage: spindle model load FILE.onnx --devices cuda:0,cuda:1,... [--repeat N] [--precision P] "
    "[--fallback cpu|error] [--no-graphs]\n";

/* `load`: the time to load one model on every listed device, three ways,
 * each from a fresh engine (the file in the page cache after the first):
 * every device reading the file on its own; the first reading it and
 * naming the others as peers that prepare and upload their own weights;
 * and the same with the weights broadcast from the first (NCCL on GPUs). */
static int cmd_load(int argc, char **argv) {
  static const struct option cli_opts[] = {DEVICE_OPTS,
                                           {"devices", required_argument, NULL, O_DEVICES},
                                           {"repeat", required_argument, NULL, O_REPEAT},
                                           SPN_CLI_HELP_OPT,
                                           {0}};
  const char *file = NULL;
  char list[512] = "";
  int repeat = 3;
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  spn_cli_getopt_t g = {.cmd = "model load"};
  for (int c; (c = spn_cli_next(&g, argc, argv, cli_opts)) != SPN_CLI_END;) {
    long long n;
    if (c != O_DEVICE && device_opt(c, g.arg, &mo))
      continue;
    switch (c) {
    case 'h':
      fputs(load_usage, stdout);
      return 0;
    case O_DEVICE:
    case O_DEVICES:
      if (strlen(g.arg) >= sizeof list) {
        fprintf(stderr, "spindle model load: --devices: list too long\n");
        return 2;
      }
      snprintf(list, sizeof list, "%s", g.arg);
      break;
    case O_REPEAT:
      if (!int_opt(&g, 1, 1000, &n))
        return 2;
      repeat = (int)n;
      break;
    case SPN_CLI_ARG:
      if (file) {
        fprintf(stderr, "spindle model load: one model file only (also got '%s')\n", g.arg);
        return 2;
      }
      file = g.arg;
      break;
    default: return 2;
    }
  }
  const char *devs[8];
  int nd = 0;
  for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (nd == 8) {
      fprintf(stderr, "spindle model load: --devices: at most 8\n");
      return 2;
    }
    devs[nd++] = t;
  }
  if (!file || !nd) {
    fputs(load_usage, stderr);
    return 2;
  }
  static const char *const modes[] = {"each device reads the file", "read once, peers upload their own",
                                      "read once, weights broadcast"};
  printf("model: %s on %d device%s, precision %s, median of %d\n", file, nd, nd > 1 ? "s" : "",
         mo.precision ? mo.precision : "fp32", repeat);
  printf("%-36s %12s  %s\n", "how", "load ms", "first device's weights");
  double ts[1000];
  for (int mode = 0; mode < 3; mode++) {
    char origin[256] = "";
    for (int r = 0; r < repeat; r++) {
      spn_error_t err = SPN_ERROR_INIT;
      spn_engine_t *eng = NULL;
      spn_model_t *ms[8] = {0};
      int rc = spn_engine_new(NULL, &eng, &err);
      double t0 = now_ms();
      for (int i = 0; i < nd && !rc; i++) {
        spn_model_opts_t o = mo;
        o.device = devs[i];
        if (mode && i == 0) {
          o.peers = devs;
          o.n_peers = nd;
          o.peer_uploads = mode == 1;
        }
        rc = spn_engine_load_opts(eng, file, &o, &ms[i], &err);
      }
      ts[r] = now_ms() - t0;
      if (!rc)
        snprintf(origin, sizeof origin, "%s", spn_model_origin(ms[0]));
      for (int i = 0; i < nd; i++)
        spn_model_release(&ms[i]);
      spn_engine_free(&eng);
      if (rc) {
        fprintf(stderr, "spindle model load: %s\n", err.msg);
        return 1;
      }
    }
    qsort(ts, (size_t)repeat, sizeof *ts, cmp_double);
    printf("%-36s %12.1f  %s\n", modes[mode], ts[repeat / 2], origin);
    fflush(stdout);
  }
  return 0;
}

int spn_cli_model(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fprintf(argc < 2 ? stderr : stdout,
            "usage: spindle model inspect FILE.onnx [DEVICE OPTIONS]\n"
            "       spindle model run FILE.onnx --input NAME=in.npy ... --output-dir DIR\n"
            "                         [--threads N] [--repeat N] [--no-fusion] [DEVICE OPTIONS]\n"
            "       spindle model bench FILE.onnx [--batch 1,32,128] [--size N] [--iters N]\n"
            "                         [--warmup N] [--threads N] [DEVICE OPTIONS]\n"
            "       spindle model load FILE.onnx --devices cuda:0,cuda:1,... [--repeat N] [DEVICE OPTIONS]\n"
            "       spindle model list | fetch NAME... [--force] | verify [NAME...] | path NAME\n"
            "       spindle model convert-ncnn MODEL.param MODEL.bin OUT.onnx\n"
            "DEVICE OPTIONS: --device cpu|cpu:N|cuda:N  --precision fp32|tf32|fp16  --fallback cpu|error\n");
    return argc < 2 ? 2 : 0;
  }
  /* argv[0] of each is its verb */
  if (!strcmp(argv[1], "inspect"))
    return cmd_inspect(argc - 1, argv + 1);
  if (!strcmp(argv[1], "run"))
    return cmd_run(argc - 1, argv + 1);
  if (!strcmp(argv[1], "bench"))
    return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(argv[1], "load"))
    return cmd_load(argc - 1, argv + 1);
  /* models by name (cli-model-fetch.c) */
  static const char *const by_name[] = {"list", "fetch", "verify", "path", "convert-ncnn"};
  for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++)
    if (!strcmp(argv[1], by_name[i]))
      return spn__cli_model_names(argc - 1, argv + 1);
  fprintf(stderr, "spindle model: unknown subcommand '%s'\n", argv[1]);
  return 2;
}
