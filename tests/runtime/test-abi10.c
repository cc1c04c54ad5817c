/* test-abi10.c — a plugin built against the ABI 1.0 header runs on this
 * host unchanged (the promise of a minor bump).
 *
 *   test-abi10 PLUGIN.so [ARCH]
 *
 * PLUGIN is the 1.0 example (invert), either built from tests/runtime/abi-1.0
 * at build time or the prebuilt 1.0 binary committed there; ARCH, when
 * given, is the architecture the binary was built for, and the test skips
 * (77) on any other. Through the stage harness on the real runtime: the
 * plugin loads, its frames come out inverted byte for byte, a frame that is
 * not u8 fails its own job only, and end of stream comes through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "spindle/harness.h"

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
      failures++;                                          \
    }                                                      \
  } while (0)

static spn_msg_t *frame(spn_harness_t *h, uint64_t seq, int32_t dtype, uint8_t salt) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_msg_new(h, seq, &m, &err) != SPN_OK)
    return NULL;
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = dtype;
  t.ndim = 3;
  t.shape[0] = 3, t.shape[1] = 5, t.shape[2] = 3;
  uint8_t px[3 * 5 * 3 * 4];
  for (size_t i = 0; i < sizeof px; i++)
    px[i] = (uint8_t)(i * 11 + salt);
  if (spn_harness_add_tensor(h, m, "frame", &t, px, &err) != SPN_OK)
    spn_harness_host(h)->msg_free(&m);
  return m;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test-abi10 PLUGIN.so [ARCH]\n");
    return 2;
  }
  struct utsname u;
  if (argc > 2 && (uname(&u) != 0 || strcmp(u.machine, argv[2]))) {
    printf("skip: %s is an %s binary\n", argv[1], argv[2]);
    return 77;
  }
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = argv[1];
  o.kind = "invert";
  o.config = "threshold = 100";
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_new(&o, &h, &err) != SPN_OK) {
    fprintf(stderr, "FAIL: the 1.0 plugin did not load: %s\n", err.msg);
    return 1;
  }
  for (uint64_t s = 0; s < 4; s++) {
    spn_msg_t *m = frame(h, s, SPN_DTYPE_U8, (uint8_t)s);
    CHECK(m && spn_harness_push(h, 1, 0, &m, &err) == SPN_OK, "push: %s", err.msg);
  }
  spn_msg_t *ok = frame(h, 0, SPN_DTYPE_U8, 0), *bad = frame(h, 1, SPN_DTYPE_F32, 0);
  CHECK(ok && spn_harness_push(h, 2, 0, &ok, &err) == SPN_OK, "push: %s", err.msg);
  CHECK(bad && spn_harness_push(h, 2, 0, &bad, &err) == SPN_OK, "push: %s", err.msg);
  CHECK(spn_harness_run(h, &err) == SPN_OK, "run: %s", err.msg);

  spn_error_t js = SPN_ERROR_INIT;
  CHECK(spn_harness_job_status(h, 1, &js) == SPN_OK, "job 1 failed: %s", js.msg);
  CHECK(spn_harness_output_len(h, 1, 0) == 4, "job 1: %zu frames out, 4 in", spn_harness_output_len(h, 1, 0));
  CHECK(spn_harness_output_eos(h, 1, 0), "job 1: no end of stream");
  const spn_host_api_t *host = spn_harness_host(h);
  for (size_t i = 0; i < spn_harness_output_len(h, 1, 0); i++) {
    const spn_msg_t *m = spn_harness_output(h, 1, 0, i);
    spn_item_t it = {.struct_size = sizeof it};
    int64_t k = host->msg_find(m, "frame");
    CHECK(k >= 0 && host->msg_item(m, (size_t)k, &it) == SPN_OK, "frame %zu: no \"frame\" item", i);
    if (k < 0)
      continue;
    CHECK(host->msg_envelope(m)->seq == i, "frame %zu has seq %llu", i,
          (unsigned long long)host->msg_envelope(m)->seq);
    const uint8_t *px = host->buffer_data(it.buffer);
    for (size_t b = 0; b < 45; b++) {
      uint8_t v = (uint8_t)(b * 11 + i);
      CHECK(px[b] == (v >= 100 ? 255 - v : v), "frame %zu byte %zu: %u", i, b, px[b]);
    }
  }
  CHECK(spn_harness_job_status(h, 2, &js) != SPN_OK && strstr(js.msg, "u8"),
        "job 2 (a float frame) should fail naming u8, got \"%s\"", js.msg);
  spn_harness_free(&h);
  if (failures)
    return 1;
  printf("ok: the ABI 1.0 plugin %s ran on this %d.%d host\n", argv[1], SPN_PLUGIN_ABI_MAJOR, SPN_PLUGIN_ABI_MINOR);
  return 0;
}
