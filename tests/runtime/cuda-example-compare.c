/* cuda-example-compare.c — plugins/cuda-example's levels stage on a GPU
 * against its CPU twin, through the stage harness (built out of tree by
 * test-cuda-example.sh against the installed spindle-harness.pc).
 *
 *   cuda-example-compare libspindle-levels.so
 *
 * The same frames (odd sizes, so the kernel's tail and grid-stride loop are
 * exercised) go through the kind placed on "cuda:0" and on "cpu"; every
 * output byte must be equal, and the GPU output must be in device memory.
 * Exits 77 when there is no CUDA device. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spindle/harness.h>

enum { JOBS = 2, FRAMES = 3 };
static const int32_t dims[JOBS][2] = {{37, 53}, {480, 641}};

static int run(const char *plugin, const char *devices, uint8_t **out, size_t *sizes, int32_t *kinds) {
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = plugin;
  o.kind = "levels";
  o.devices = devices;
  o.config = "gain = 333\noffset = -20";
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_new(&o, &h, &err) != SPN_OK) {
    fprintf(stderr, "FAIL %s: %s\n", devices, err.msg);
    return 1;
  }
  for (int j = 0; j < JOBS; j++)
    for (int s = 0; s < FRAMES; s++) {
      spn_tensor_t t = SPN_TENSOR_INIT;
      t.dtype = SPN_DTYPE_U8, t.ndim = 3, t.shape[0] = dims[j][0], t.shape[1] = dims[j][1], t.shape[2] = 3;
      size_t n = spn_tensor_nbytes(&t);
      uint8_t *px = malloc(n);
      for (size_t i = 0; i < n; i++)
        px[i] = (uint8_t)((i * 2654435761u + (unsigned)(j * 7 + s)) >> 24);
      spn_msg_t *m = NULL;
      if (spn_harness_msg_new(h, (uint64_t)s, &m, &err) != SPN_OK ||
          spn_harness_add_tensor(h, m, "frame", &t, px, &err) != SPN_OK ||
          spn_harness_push(h, (uint64_t)j + 1, 0, &m, &err) != SPN_OK) {
        fprintf(stderr, "FAIL push: %s\n", err.msg);
        return 1;
      }
      free(px);
    }
  if (spn_harness_run(h, &err) != SPN_OK) {
    fprintf(stderr, "FAIL run on %s: %s\n", devices, err.msg);
    return 1;
  }
  const spn_host_api_t *host = spn_harness_host(h);
  for (int j = 0; j < JOBS; j++) {
    spn_error_t js = SPN_ERROR_INIT;
    if (spn_harness_job_status(h, (uint64_t)j + 1, &js) != SPN_OK || spn_harness_output_len(h, (uint64_t)j + 1, 0) != FRAMES) {
      fprintf(stderr, "FAIL %s job %d: %s\n", devices, j + 1, js.msg);
      return 1;
    }
    for (int s = 0; s < FRAMES; s++) {
      const spn_msg_t *m = spn_harness_output(h, (uint64_t)j + 1, 0, (size_t)s);
      spn_item_t it;
      memset(&it, 0, sizeof it);
      it.struct_size = sizeof it;
      host->msg_item(m, (size_t)host->msg_find(m, "frame"), &it);
      size_t k = (size_t)(j * FRAMES + s), n = spn_tensor_nbytes(&it.tensor);
      out[k] = malloc(n);
      sizes[k] = n;
      kinds[k] = it.tensor.device_kind;
      if (it.tensor.device_kind == SPN_DEVICE_CUDA)
        cudaMemcpy(out[k], host->buffer_data(it.buffer), n, cudaMemcpyDeviceToHost);
      else
        memcpy(out[k], host->buffer_data(it.buffer), n);
    }
  }
  spn_harness_free(&h);
  return 0;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (argc < 2)
    return 2;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("skip: no CUDA device\n");
    return 77;
  }
  uint8_t *gpu[JOBS * FRAMES], *cpu[JOBS * FRAMES];
  size_t gs[JOBS * FRAMES], cs[JOBS * FRAMES];
  int32_t gk[JOBS * FRAMES], ck[JOBS * FRAMES];
  if (run(argv[1], "cuda:0", gpu, gs, gk) || run(argv[1], "cpu", cpu, cs, ck))
    return 1;
  int bad = 0;
  for (int k = 0; k < JOBS * FRAMES; k++) {
    if (gk[k] != SPN_DEVICE_CUDA || ck[k] != SPN_DEVICE_CPU) {
      fprintf(stderr, "FAIL frame %d: output on device kind %d (gpu run) / %d (cpu run)\n", k, gk[k], ck[k]);
      bad++;
    }
    if (gs[k] != cs[k] || memcmp(gpu[k], cpu[k], gs[k])) {
      fprintf(stderr, "FAIL frame %d: the GPU output differs from the CPU twin\n", k);
      bad++;
    }
    free(gpu[k]);
    free(cpu[k]);
  }
  if (bad)
    return 1;
  printf("ok: levels on cuda:0 matches its CPU twin byte for byte (%d frames)\n", JOBS * FRAMES);
  return 0;
}
