/* engine-bench.c — time Spindle's engine on one model and input.
 *
 *   engine-bench MODEL.onnx --input NAME=FILE.npy ... [--threads N]
 *                [--warmup N] [--iters N] [--device D] [--precision P]
 *                [--device-io]
 *
 * --device-io (CUDA builds, device cuda:N): inputs copied to the GPU once,
 * outputs in device buffers, each run spn_model_run_on on a stream of ours
 * followed by a stream synchronise — how a GPU stage runs a model, and what
 * a PyTorch forward on GPU-resident tensors plus torch.cuda.synchronize()
 * measures. Without it the timed call is spn_model_run with host tensors
 * (copies in and out included).
 *
 * Prints one line "spindle: load_ms=... best_ms=... median_ms=... flops=..."
 * that tests/bench/engine-bench.py reads and sets beside ONNX Runtime's
 * figures for the same model, input and thread count. Not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spindle/engine.h"

#ifdef SPN_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* float32 C-order .npy (format 1.x/2.x) into t. */
static int read_npy(const char *path, spn_tensor_t *t) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  unsigned char pre[12];
  int rc = -1;
  char *hdr = NULL;
  size_t hl;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6))
    goto out;
  if (pre[6] == 1) {
    hl = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 10, 1, 2, f) != 2)
      goto out;
    hl = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  hdr = calloc(1, hl + 1);
  if (!hdr || fread(hdr, 1, hl, f) != hl || !strstr(hdr, "'<f4'") || !strstr(hdr, "False"))
    goto out;
  char *p = strchr(strstr(hdr, "'shape'"), '(');
  t->dtype = SPN_DTYPE_F32;
  t->ndim = 0;
  for (p++; *p && *p != ')';) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p) {
      p++;
      continue;
    }
    t->shape[t->ndim++] = v;
    p = end;
  }
  size_t bytes = spn_tensor_nbytes(t);
  t->data = malloc(bytes);
  if (!t->data || fread(t->data, 1, bytes, f) != bytes)
    goto out;
  rc = 0;
out:
  free(hdr);
  fclose(f);
  return rc;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  const char *model = NULL, *names[16], *files[16];
  int n_given = 0, threads = 2, warmup = 2, iters = 10, device_io = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--input") && i + 1 < argc && n_given < 16) {
      char *eq = strchr(argv[++i], '=');
      if (!eq)
        return 2;
      *eq = 0;
      names[n_given] = argv[i];
      files[n_given++] = eq + 1;
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
      warmup = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      mo.device = argv[++i];
    } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
      mo.precision = argv[++i];
    } else if (!strcmp(argv[i], "--device-io")) {
      device_io = 1;
    } else {
      model = argv[i];
    }
  }
  if (!model || iters < 1 || iters > 10000) {
    fprintf(stderr, "usage: engine-bench MODEL.onnx --input NAME=FILE.npy ... [--threads N] [--warmup N] [--iters N] [--device D] [--precision P] [--device-io]\n");
    return 2;
  }
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  o.threads = threads;
  spn_engine_t *eng = NULL;
  spn_model_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  double t0 = now_ms();
  if (spn_engine_new(&o, &eng, &err) || spn_engine_load_opts(eng, model, &mo, &m, &err)) {
    fprintf(stderr, "engine-bench: %s\n", err.msg);
    return 1;
  }
  double load_ms = now_ms() - t0;
  int n_in = spn_model_input_count(m), n_out = spn_model_output_count(m);
  spn_tensor_t in[16], out[16];
  memset(in, 0, sizeof in);
  for (int i = 0; i < n_given; i++) {
    int k = spn_model_input_index(m, names[i]);
    if (k < 0 || k >= 16 || read_npy(files[i], &in[k])) {
      fprintf(stderr, "engine-bench: bad --input %s\n", names[i]);
      return 1;
    }
    in[k].struct_size = sizeof in[k];
  }
  double *t = calloc((size_t)iters, sizeof(double));
  int64_t batch = in[0].ndim ? in[0].shape[0] : 1;
  if (device_io) {
#ifdef SPN_BENCH_CUDA
    int dev = mo.device && !strncmp(mo.device, "cuda:", 5) ? atoi(mo.device + 5) : -1;
    if (dev < 0 || cudaSetDevice(dev) != cudaSuccess) {
      fprintf(stderr, "engine-bench: --device-io needs --device cuda:N and that GPU\n");
      return 1;
    }
    cudaStream_t st;
    spn_tensor_t din[16], dout[16];
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
      return 1;
    for (int k = 0; k < n_in; k++) {
      din[k] = in[k];
      din[k].device_kind = SPN_DEVICE_CUDA;
      din[k].device_index = dev;
      size_t nb = spn_tensor_nbytes(&in[k]);
      if (cudaMalloc(&din[k].data, nb) != cudaSuccess ||
          cudaMemcpy(din[k].data, in[k].data, nb, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "engine-bench: cannot place input %d on the GPU\n", k);
        return 1;
      }
    }
    for (int k = 0; k < n_out; k++)
      dout[k] = (spn_tensor_t)SPN_TENSOR_INIT;
    if (spn_model_output_shapes(m, din, n_in, dout, n_out, &err)) {
      fprintf(stderr, "engine-bench: %s\n", err.msg);
      return 1;
    }
    for (int k = 0; k < n_out; k++) {
      dout[k].device_kind = SPN_DEVICE_CUDA;
      dout[k].device_index = dev;
      if (cudaMalloc(&dout[k].data, spn_tensor_nbytes(&dout[k])) != cudaSuccess) {
        fprintf(stderr, "engine-bench: cannot place output %d on the GPU\n", k);
        return 1;
      }
    }
    for (int it = -warmup; it < iters; it++) {
      double a = now_ms();
      if (spn_model_run_on(m, din, n_in, dout, n_out, st, &err)) {
        fprintf(stderr, "engine-bench: %s\n", err.msg);
        return 1;
      }
      if (cudaStreamSynchronize(st) != cudaSuccess) {
        fprintf(stderr, "engine-bench: the run failed on the GPU\n");
        return 1;
      }
      double b = now_ms();
      if (it >= 0)
        t[it] = b - a;
    }
    for (int k = 0; k < n_in; k++)
      cudaFree(din[k].data);
    for (int k = 0; k < n_out; k++)
      cudaFree(dout[k].data);
    cudaStreamDestroy(st);
#else
    fprintf(stderr, "engine-bench: --device-io needs a CUDA build\n");
    return 1;
#endif
  } else {
    for (int it = -warmup; it < iters; it++) {
      for (int k = 0; k < n_out; k++)
        out[k] = (spn_tensor_t)SPN_TENSOR_INIT;
      double a = now_ms();
      if (spn_model_run(m, in, n_in, out, n_out, &err)) {
        fprintf(stderr, "engine-bench: %s\n", err.msg);
        return 1;
      }
      double b = now_ms();
      if (it >= 0)
        t[it] = b - a;
      for (int k = 0; k < n_out; k++)
        spn_model_output_free(&out[k]);
    }
  }
  qsort(t, (size_t)iters, sizeof *t, cmp);
  printf("spindle: load_ms=%.1f best_ms=%.3f median_ms=%.3f flops_per_sample=%.6g batch=%lld nodes=%d threads=%d\n",
         load_ms, t[0], t[iters / 2], spn_model_flops(m), (long long)batch, spn_model_node_count(m), threads);
  free(t);
  for (int k = 0; k < 16; k++)
    free(in[k].data);
  spn_model_release(&m);
  spn_engine_free(&eng);
  return 0;
}
