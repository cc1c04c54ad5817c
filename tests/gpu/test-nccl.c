/* test-nccl.c — NCCL communicators on real GPUs (suite gpu; exits 77 without
 * one): a one-GPU communicator moves bytes through ncclSend/ncclRecv and keeps
 * them through an in-place broadcast; with two or more GPUs a broadcast from
 * the last rank reaches every other; bad arguments (a CPU device, a root out of
 * range, a host buffer, a size larger than a buffer) are refused naming what
 * is wrong, before NCCL is called. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <nccl.h>

#include "device-internal.h"
#include "gpu-skip.h"
#include "nccl-internal.h"

#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != SPN_OK)                                                        \
      fail_msg("%s: %s", #call, err.msg);                                        \
  } while (0)

#define SIZE (4u << 20) /* 4 MiB: several NCCL chunks */

typedef struct {
  spn_device_t **devs;
  uint32_t n;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  const spn__backend_t *extra[] = {spn__backend_cuda()};
  spn_error_t err = SPN_ERROR_INIT;
  if (!f || spn__devices_open("cuda", extra, 1, &f->devs, &f->n, &err) != SPN_OK) {
    fprintf(stderr, "open cuda: %s\n", err.msg);
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  spn__devices_free(&f->devs, f->n);
  free(f);
  return 0;
}

static void fill(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (uint8_t)(seed >> 24);
  }
}

/* Host bytes -> a new device buffer of dev. */
static spn_buffer_t *upload(spn_device_t *dev, const uint8_t *src, size_t n) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_buffer_t *host = NULL, *d = NULL;
  spn_stream_t *s = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(dev, SPN_MEM_PINNED), n, &host, &err));
  memcpy(spn_buffer_data(host), src, n);
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(dev, SPN_MEM_DEVICE), n, &d, &err));
  CHECK(spn_stream_new(dev, &s, &err));
  CHECK(spn_stream_copy(s, d, 0, host, 0, n, &err));
  CHECK(spn_stream_synchronize(s, &err));
  spn_stream_free(&s);
  spn_buffer_unref(&host);
  return d;
}

static uint8_t *download(spn_buffer_t *d, size_t n) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_device_t *dev = spn_buffer_device(d);
  spn_buffer_t *host = NULL;
  spn_stream_t *s = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(dev, SPN_MEM_PINNED), n, &host, &err));
  CHECK(spn_stream_new(dev, &s, &err));
  CHECK(spn_stream_copy(s, host, 0, d, 0, n, &err));
  CHECK(spn_stream_synchronize(s, &err));
  uint8_t *out = malloc(n);
  assert_non_null(out);
  memcpy(out, spn_buffer_data(host), n);
  spn_stream_free(&s);
  spn_buffer_unref(&host);
  return out;
}

static void version_matches_the_header(void **state) {
  (void)state;
  assert_int_equal(spn__nccl_version(), NCCL_VERSION_CODE);
}

static void one_gpu_communicator_moves_bytes(void **state) {
  fx_t *f = *state;
  spn_error_t err = SPN_ERROR_INIT;
  spn__nccl_t *c = NULL;
  CHECK(spn__nccl_new(f->devs, 1, &c, &err));
  assert_int_equal(spn__nccl_size(c), 1);
  uint8_t *want = malloc(SIZE), *zero = calloc(1, SIZE);
  assert_true(want && zero);
  fill(want, SIZE, 7);
  spn_buffer_t *src = upload(f->devs[0], want, SIZE), *dst = upload(f->devs[0], zero, SIZE);
  /* send to self: dst gets src's bytes */
  CHECK(spn__nccl_sendrecv(c, src, 0, dst, 0, SIZE, &err));
  uint8_t *got = download(dst, SIZE);
  assert_memory_equal(got, want, SIZE);
  free(got);
  /* in-place broadcast on one rank keeps the data */
  spn_buffer_t *bufs[1] = {dst};
  CHECK(spn__nccl_broadcast(c, bufs, 0, SIZE, &err));
  got = download(dst, SIZE);
  assert_memory_equal(got, want, SIZE);
  free(got);
  /* refusals */
  assert_int_equal(spn__nccl_broadcast(c, bufs, 1, SIZE, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "root 1"));
  assert_int_equal(spn__nccl_sendrecv(c, src, 0, dst, 0, SIZE + 1, &err), SPN_EOVERFLOW);
  spn_buffer_t *host = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_PINNED), SIZE, &host, &err));
  assert_int_equal(spn__nccl_sendrecv(c, host, 0, dst, 0, SIZE, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "not device memory"));
  spn_buffer_unref(&host);
  spn_buffer_unref(&src);
  spn_buffer_unref(&dst);
  spn__nccl_free(&c);
  assert_null(c);
  free(want);
  free(zero);
}

static void cpu_devices_are_refused(void **state) {
  (void)state;
  spn_device_t **cpus = NULL;
  uint32_t n = 0;
  spn_error_t err = SPN_ERROR_INIT;
  CHECK(spn__devices_open("cpu:1", NULL, 0, &cpus, &n, &err));
  spn__nccl_t *c = NULL;
  assert_int_equal(spn__nccl_new(cpus, 1, &c, &err), SPN_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err.msg, "not a CUDA device"));
  spn__devices_free(&cpus, n);
}

static void broadcast_reaches_every_gpu(void **state) {
  fx_t *f = *state;
  if (f->n < 2)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  spn__nccl_t *c = NULL;
  CHECK(spn__nccl_new(f->devs, f->n, &c, &err));
  uint8_t *want = malloc(SIZE), *zero = calloc(1, SIZE);
  assert_true(want && zero);
  fill(want, SIZE, 11);
  spn_buffer_t **bufs = calloc(f->n, sizeof *bufs);
  assert_non_null(bufs);
  uint32_t root = f->n - 1;
  for (uint32_t i = 0; i < f->n; i++)
    bufs[i] = upload(f->devs[i], i == root ? want : zero, SIZE);
  CHECK(spn__nccl_broadcast(c, bufs, root, SIZE, &err));
  for (uint32_t i = 0; i < f->n; i++) {
    uint8_t *got = download(bufs[i], SIZE);
    assert_memory_equal(got, want, SIZE);
    free(got);
    spn_buffer_unref(&bufs[i]);
  }
  free(bufs);
  spn__nccl_free(&c);
  free(want);
  free(zero);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(version_matches_the_header),
      cmocka_unit_test(one_gpu_communicator_moves_bytes),
      cmocka_unit_test(cpu_devices_are_refused),
      cmocka_unit_test(broadcast_reaches_every_gpu),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
