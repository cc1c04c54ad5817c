/* nccl-bench.c — getting model weights onto every GPU, two ways, and moving
 * a fan-out batch between GPUs, two ways; each beside its peer in one run.
 *
 *   nccl-bench [--mb M] [--file PATH] [--runs R]
 *
 * Load (M MiB of weights, a generated file unless --file names one, e.g. an
 * .onnx model):
 *   - per-GPU reads: each GPU reads the file from disk into pinned memory and
 *     copies it to itself (what N independent loads do);
 *   - read once + broadcast: one read, one copy to GPU 0, ncclBroadcast to
 *     the others over NVLink/PCIe.
 *   Before every read the file's pages are dropped from the page cache
 *   (posix_fadvise DONTNEED, no root needed), so each read goes to the disk;
 *   the median of R runs is printed.
 * Batch move (two or more GPUs): one 8x3x720x1280 fp16 batch (42 MiB) from
 * GPU 0 to GPU 1 with ncclSend/ncclRecv on the ranks' own streams, beside
 * cudaMemcpyPeer.
 * Exits 77 without a GPU. Not a test: it prints figures and never fails on
 * speed. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "device-internal.h"
#include "nccl-internal.h"

int spn__cuda_device_ordinal(const spn_device_t *dev);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return v[n / 2];
}

#define DIE(...)                                                                 \
  do {                                                                           \
    fprintf(stderr, __VA_ARGS__);                                                \
    fputc('\n', stderr);                                                         \
    exit(1);                                                                     \
  } while (0)

/* Read the whole file from disk (page cache dropped first) into dst. */
static void read_cold(const char *path, void *dst, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    DIE("%s: cannot open", path);
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)dst + got, n - got);
    if (r <= 0)
      DIE("%s: short read", path);
    got += (size_t)r;
  }
  close(fd);
}

static void upload(spn_device_t *dev, spn_buffer_t *dst, spn_buffer_t *host, size_t n) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_stream_t *s = NULL;
  if (spn_stream_new(dev, &s, &err) != SPN_OK || spn_stream_copy(s, dst, 0, host, 0, n, &err) != SPN_OK ||
      spn_stream_synchronize(s, &err) != SPN_OK)
    DIE("upload to %s: %s", spn_device_name(dev), err.msg);
  spn_stream_free(&s);
}

int main(int argc, char **argv) {
  long mb = 256;
  int runs = 3;
  const char *file = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--mb"))
      mb = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--file"))
      file = argv[i + 1];
    else if (!strcmp(argv[i], "--runs"))
      runs = atoi(argv[i + 1]);
    else
      DIE("usage: nccl-bench [--mb M] [--file PATH] [--runs R]");
  }
  if (runs < 1 || runs > 50 || mb < 1)
    DIE("--runs 1..50, --mb >= 1");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  spn_device_t **devs = NULL;
  uint32_t n = 0;
  spn_error_t err = SPN_ERROR_INIT;
  const spn__backend_t *extra[] = {spn__backend_cuda()};
  if (spn__devices_open("cuda", extra, 1, &devs, &n, &err) != SPN_OK)
    DIE("devices: %s", err.msg);
  char tmpl[] = "/tmp/spindle-nccl-bench-XXXXXX";
  size_t size;
  if (file) {
    FILE *f = fopen(file, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0)
      DIE("%s: cannot read", file);
    size = (size_t)ftell(f);
    fclose(f);
  } else {
    size = (size_t)mb << 20;
    int fd = mkstemp(tmpl);
    if (fd < 0)
      DIE("cannot create a temporary file");
    char *blk = malloc(1 << 20);
    for (size_t i = 0; i < 1 << 20; i++)
      blk[i] = (char)(i * 2654435761u >> 24);
    for (long i = 0; i < mb; i++)
      if (write(fd, blk, 1 << 20) != 1 << 20)
        DIE("cannot write the temporary file");
    free(blk);
    fsync(fd);
    close(fd);
    file = tmpl;
  }
  spn__nccl_t *comm = NULL;
  if (spn__nccl_new(devs, n, &comm, &err) != SPN_OK)
    DIE("NCCL: %s", err.msg);
  spn_buffer_t *host = NULL, **bufs = calloc(n, sizeof *bufs);
  if (spn_buffer_type_alloc(spn_device_buffer_type(devs[0], SPN_MEM_PINNED), size, &host, &err) != SPN_OK)
    DIE("pinned: %s", err.msg);
  for (uint32_t i = 0; i < n; i++)
    if (spn_buffer_type_alloc(spn_device_buffer_type(devs[i], SPN_MEM_DEVICE), size, &bufs[i], &err) != SPN_OK)
      DIE("%s: %s", spn_device_name(devs[i]), err.msg);
  double *per = calloc((size_t)runs, sizeof *per), *bc = calloc((size_t)runs, sizeof *bc);
  for (int r = 0; r < runs; r++) {
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i++) {
      read_cold(file, spn_buffer_data(host), size);
      upload(devs[i], bufs[i], host, size);
    }
    per[r] = now_s() - t0;
    t0 = now_s();
    read_cold(file, spn_buffer_data(host), size);
    upload(devs[0], bufs[0], host, size);
    if (spn__nccl_broadcast(comm, bufs, 0, size, &err) != SPN_OK)
      DIE("broadcast: %s", err.msg);
    bc[r] = now_s() - t0;
  }
  double mp = median(per, runs), mbc = median(bc, runs);
  printf("NCCL %d, %u GPU(s) (%s ...), weights %.1f MiB from %s, median of %d\n", spn__nccl_version(), n,
         spn_device_name(devs[0]), (double)size / (1 << 20), file == tmpl ? "a generated file" : file, runs);
  printf("load  per-GPU reads (peer):      %8.3f s\n", mp);
  printf("load  read once + ncclBroadcast: %8.3f s   (%.2fx faster)\n", mbc, mbc > 0 ? mp / mbc : 0);
  if (n == 1)
    printf("      (one GPU: both are one read and one copy; the difference is noise)\n");
  if (n >= 2) {
    size_t bsz = (size_t)8 * 3 * 720 * 1280 * 2;
    double *nc = calloc((size_t)runs * 4, sizeof *nc), *pc = calloc((size_t)runs * 4, sizeof *pc);
    for (int r = 0; r < runs * 4; r++) {
      double t0 = now_s();
      if (spn__nccl_sendrecv(comm, bufs[0], 0, bufs[1], 1, bsz, &err) != SPN_OK)
        DIE("send/recv: %s", err.msg);
      nc[r] = now_s() - t0;
      t0 = now_s();
      if (cudaMemcpyPeer(spn_buffer_data(bufs[1]), spn__cuda_device_ordinal(devs[1]), spn_buffer_data(bufs[0]),
                         spn__cuda_device_ordinal(devs[0]), bsz) != cudaSuccess ||
          cudaDeviceSynchronize() != cudaSuccess)
        DIE("cudaMemcpyPeer failed");
      pc[r] = now_s() - t0;
    }
    double mn = median(nc, runs * 4), mpc = median(pc, runs * 4);
    printf("batch 42 MiB GPU0->GPU1 cudaMemcpyPeer (peer): %7.3f ms  %6.1f GB/s\n", mpc * 1e3, bsz / mpc / 1e9);
    printf("batch 42 MiB GPU0->GPU1 ncclSend/ncclRecv:     %7.3f ms  %6.1f GB/s  (%.2fx)\n", mn * 1e3,
           bsz / mn / 1e9, mn > 0 ? mpc / mn : 0);
    free(nc);
    free(pc);
  } else {
    printf("batch move: needs two GPUs, skipped\n");
  }
  for (uint32_t i = 0; i < n; i++)
    spn_buffer_unref(&bufs[i]);
  spn_buffer_unref(&host);
  free(bufs);
  free(per);
  free(bc);
  spn__nccl_free(&comm);
  spn__devices_free(&devs, n);
  if (file == tmpl)
    unlink(tmpl);
  return 0;
}
