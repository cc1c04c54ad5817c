/* test-cuda-backend.c — the CUDA device backend on a real GPU (suite gpu;
 * exits 77 without one): every buffer type allocates, data makes a round trip
 * host → pinned → device → device → pinned → host through stream copies with
 * events ordering two streams, device-to-device copies across GPUs when
 * there are two, and the health state's effect (an unusable device refuses
 * work, naming itself). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "device-internal.h"
#include "gpu-skip.h"

/* `err` is the caller's spn_error_t. */
#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != SPN_OK)                                                        \
      fail_msg("%s: %s", #call, err.msg);                                        \
  } while (0)

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

static void names_and_buffer_types(void **state) {
  fx_t *f = *state;
  for (uint32_t i = 0; i < f->n; i++) {
    spn_device_t *d = f->devs[i];
    assert_int_equal(spn_device_kind(d), SPN_DEVICE_CUDA);
    char prefix[24];
    snprintf(prefix, sizeof prefix, "cuda:%u ", i);
    assert_memory_equal(spn_device_name(d), prefix, strlen(prefix));
    assert_true(strlen(spn_device_name(d)) > strlen(prefix)); /* product name follows */
    assert_false(spn_buffer_type_is_host(spn_device_buffer_type(d, SPN_MEM_DEVICE)));
    assert_true(spn_buffer_type_is_host(spn_device_buffer_type(d, SPN_MEM_HOST)));
    assert_true(spn_buffer_type_is_host(spn_device_buffer_type(d, SPN_MEM_PINNED)));
  }
}

static void round_trip_through_two_streams(void **state) {
  fx_t *f = *state;
  spn_device_t *d = f->devs[0];
  spn_error_t err = SPN_ERROR_INIT;
  const size_t n = (4u << 20) + 123; /* not a multiple of anything */
  spn_buffer_t *host = NULL, *pin = NULL, *back = NULL, *d1 = NULL, *d2 = NULL;
  spn_stream_t *s1 = NULL, *s2 = NULL;
  spn_event_t *ev = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_HOST), n, &host, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_PINNED), n, &pin, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_PINNED), n, &back, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &d1, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &d2, &err));
  assert_false(spn_buffer_is_host(d1));
  assert_ptr_equal(spn_buffer_device(d1), d);
  CHECK(spn_stream_new(d, &s1, &err));
  CHECK(spn_stream_new(d, &s2, &err));
  assert_non_null(spn_stream_native(s1));
  CHECK(spn_event_new(d, &ev, &err));
  fill(spn_buffer_data(host), n, 7);
  memset(spn_buffer_data(back), 0, n);
  /* s1: pageable → pinned → device; s2 waits for s1, then device → device
   * (at an offset) → pinned. */
  CHECK(spn_stream_copy(s1, pin, 0, host, 0, n, &err));
  CHECK(spn_stream_copy(s1, d1, 0, pin, 0, n, &err));
  CHECK(spn_event_record(ev, s1, &err));
  CHECK(spn_stream_wait_event(s2, ev, &err));
  CHECK(spn_stream_copy(s2, d2, 0, d1, 100, n - 100, &err));
  CHECK(spn_stream_copy(s2, back, 0, d2, 0, n - 100, &err));
  CHECK(spn_event_record(ev, s2, &err));
  CHECK(spn_event_synchronize(ev, &err));
  assert_memory_equal(spn_buffer_data(back), (uint8_t *)spn_buffer_data(host) + 100, n - 100);
  CHECK(spn_stream_synchronize(s1, &err));
  /* Out-of-range copies are refused before reaching the driver. */
  assert_int_equal(spn_stream_copy(s1, d1, 1, d2, 0, n, &err), SPN_EOVERFLOW);
  spn_event_free(&ev);
  spn_stream_free(&s1);
  spn_stream_free(&s2);
  spn_buffer_unref(&host);
  spn_buffer_unref(&pin);
  spn_buffer_unref(&back);
  spn_buffer_unref(&d1);
  spn_buffer_unref(&d2);
}

static void pool_reuse_keeps_allocations_cheap(void **state) {
  fx_t *f = *state;
  spn_error_t err = SPN_ERROR_INIT;
  /* Many alloc/free cycles of the same size: all must succeed and give
   * usable memory (a pool that leaked would run out long before 20 GB). */
  for (int i = 0; i < 200; i++) {
    spn_buffer_t *b = NULL;
    CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), 100u << 20, &b, &err));
    spn_buffer_unref(&b);
  }
}

static void peer_copy_between_devices(void **state) {
  fx_t *f = *state;
  if (f->n < 2)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  const size_t n = 1u << 20;
  spn_buffer_t *src = NULL, *a = NULL, *b = NULL, *back = NULL;
  spn_stream_t *s = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_PINNED), n, &src, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[1], SPN_MEM_PINNED), n, &back, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), n, &a, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[1], SPN_MEM_DEVICE), n, &b, &err));
  fill(spn_buffer_data(src), n, 99);
  CHECK(spn_stream_new(f->devs[1], &s, &err));
  CHECK(spn_stream_copy(s, a, 0, src, 0, n, &err));
  CHECK(spn_stream_copy(s, b, 0, a, 0, n, &err)); /* cuda:0 → cuda:1 */
  CHECK(spn_stream_copy(s, back, 0, b, 0, n, &err));
  CHECK(spn_stream_synchronize(s, &err));
  assert_memory_equal(spn_buffer_data(back), spn_buffer_data(src), n);
  spn_stream_free(&s);
  spn_buffer_unref(&src);
  spn_buffer_unref(&a);
  spn_buffer_unref(&b);
  spn_buffer_unref(&back);
}

static void unusable_device_refuses_work(void **state) {
  fx_t *f = *state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_buffer_t *b = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), 4096, &b, &err));
  spn__cuda_device_mark_unusable(f->devs[0]);
  assert_false(spn__cuda_device_usable(f->devs[0]));
  spn_stream_t *s = NULL;
  assert_int_equal(spn_stream_new(f->devs[0], &s, &err), SPN_EDEVICE);
  assert_non_null(strstr(err.msg, "cuda:0"));
  assert_non_null(strstr(err.msg, "unusable"));
  spn_buffer_t *c = NULL;
  assert_int_equal(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), 64, &c, &err),
                   SPN_EDEVICE);
  spn_buffer_unref(&b); /* freeing still works (drain) */
}

static void CUDART_CB stall(void *ms) { usleep((useconds_t)(uintptr_t)ms * 1000u); }

/* The last reference to a device buffer dropped while queued work still
 * reads it (as an edge drops a copy's source): the block must not go to a
 * new allocation that is written before that work runs. Stream 1 is held by
 * a host callback, then copies a into b; a is released, a buffer of the same
 * size is allocated and filled on stream 2 at once; b must still get a's
 * bytes. */
static void free_waits_for_queued_work(void **state) {
  fx_t *f = *state;
  spn_device_t *d = f->devs[0];
  spn_error_t err = SPN_ERROR_INIT;
  const size_t n = 8u << 20;
  spn_buffer_t *pin = NULL, *a = NULL, *b = NULL, *c = NULL, *back = NULL;
  spn_stream_t *s1 = NULL, *s2 = NULL;
  CHECK(spn_stream_new(d, &s1, &err));
  CHECK(spn_stream_new(d, &s2, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_PINNED), n, &pin, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_PINNED), n, &back, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &a, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &b, &err));
  fill(spn_buffer_data(pin), n, 7);
  CHECK(spn_stream_copy(s1, a, 0, pin, 0, n, &err));
  CHECK(spn_stream_synchronize(s1, &err));
  void *old = spn_buffer_data(a);
  assert_int_equal(cudaLaunchHostFunc((cudaStream_t)spn_stream_native(s1), stall, (void *)(uintptr_t)300),
                   cudaSuccess);
  CHECK(spn_stream_copy(s1, b, 0, a, 0, n, &err)); /* runs after the stall */
  spn_buffer_unref(&a);
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &c, &err));
  assert_int_equal(cudaMemsetAsync(spn_buffer_data(c), 0xEE, n, (cudaStream_t)spn_stream_native(s2)), cudaSuccess);
  CHECK(spn_stream_synchronize(s2, &err));
  CHECK(spn_stream_synchronize(s1, &err));
  CHECK(spn_stream_copy(s1, back, 0, b, 0, n, &err));
  CHECK(spn_stream_synchronize(s1, &err));
  print_message("the new allocation %s the released block\n", spn_buffer_data(c) == old ? "reused" : "did not reuse");
  assert_memory_equal(spn_buffer_data(back), spn_buffer_data(pin), n);
  /* once the queued work has run, the block is there for the next one */
  spn_buffer_t *again = NULL;
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), n, &again, &err));
  spn_buffer_unref(&again);
  spn_buffer_unref(&c);
  spn_buffer_unref(&b);
  spn_buffer_unref(&pin);
  spn_buffer_unref(&back);
  spn_stream_free(&s1);
  spn_stream_free(&s2);
}

/* A thread on one GPU that allocates, copies and frees on another stays on
 * its own GPU: its stage launches kernels without naming a device. */
static void calls_keep_the_callers_device(void **state) {
  fx_t *f = *state;
  if (f->n < 2)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  spn_stream_t *s0 = NULL;
  spn_buffer_t *a = NULL, *b = NULL;
  CHECK(spn_stream_new(f->devs[0], &s0, &err)); /* (binds this thread to cuda:0, as an executor) */
  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), 4096, &a, &err));
  CHECK(spn_buffer_type_alloc(spn_device_buffer_type(f->devs[0], SPN_MEM_DEVICE), 4096, &b, &err));
  CHECK(spn_stream_copy(s0, b, 0, a, 0, 4096, &err));
  CHECK(spn_stream_synchronize(s0, &err));
  spn_buffer_unref(&a);
  spn_buffer_unref(&b);
  int now = -1;
  assert_int_equal(cudaGetDevice(&now), cudaSuccess);
  assert_int_equal(now, 1);
  spn_stream_free(&s0);
  assert_int_equal(cudaGetDevice(&now), cudaSuccess);
  assert_int_equal(now, 1);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(names_and_buffer_types, setup, teardown),
      cmocka_unit_test_setup_teardown(round_trip_through_two_streams, setup, teardown),
      cmocka_unit_test_setup_teardown(pool_reuse_keeps_allocations_cheap, setup, teardown),
      cmocka_unit_test_setup_teardown(free_waits_for_queued_work, setup, teardown),
      cmocka_unit_test_setup_teardown(peer_copy_between_devices, setup, teardown),
      cmocka_unit_test_setup_teardown(calls_keep_the_callers_device, setup, teardown),
      cmocka_unit_test_setup_teardown(unusable_device_refuses_work, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
