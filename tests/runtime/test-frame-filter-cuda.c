/* test-frame-filter-cuda.c — the buffer lifetimes of
 * spn_frame_filter_process_cuda (spindle/plugin-cuda.h), without a GPU.
 *
 * The helper runs on a fake host table whose stage is "placed on cuda:0",
 * and tests/gpu/fake-gpu-host.h defines the CUDA runtime calls the header
 * makes (cudaStreamSynchronize, cudaMemcpyAsync, cudaGetErrorString,
 * cudaGetErrorName): the test links no libcudart. Work is "queued" by the
 * fake cuda body and the fake upload and "done" at the next stream
 * synchronisation; a buffer whose last reference goes while queued work
 * touches it is the bug these tests catch: on a GPU the pool hands that
 * memory to another stream at once, which then overwrites what a kernel is
 * still reading (the input frame) or writing (a failed frame's output).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "spindle/plugin-cuda.h"

#include "fake-gpu-host.h"

static struct {
  int fails;
  int emitted;
  spn_msg_t *out[8];
} g;

/* ---- fake host ------------------------------------------------------------- */

struct spn_msg {
  spn_envelope_t env;
  spn_tensor_t t;
  spn_buffer_t *buf;
};

static int32_t h_buffer_new(spn_stage_t *s, size_t n, spn_buffer_t **out, spn_error_t *err) {
  (void)s, (void)err;
  *out = fake_buffer(n, 0, true);
  return SPN_OK;
}

static const char *h_stage_get_name(spn_stage_t *s) {
  (void)s;
  return "sr";
}
static int64_t h_msg_find(const spn_msg_t *m, const char *name) { return m->buf && !strcmp(name, "frame") ? 0 : -1; }
static int32_t h_msg_item(const spn_msg_t *m, size_t i, spn_item_t *it) {
  if (i != 0 || !m->buf)
    return SPN_EINVAL;
  it->kind = SPN_ITEM_TENSOR;
  it->name = "frame";
  it->tensor = m->t;
  it->tensor.data = m->buf->data;
  it->buffer = m->buf;
  return SPN_OK;
}
static const spn_envelope_t *h_msg_envelope(const spn_msg_t *m) { return &m->env; }
static void h_msg_free(spn_msg_t **mp) {
  if (!*mp)
    return;
  h_buffer_unref(&(*mp)->buf);
  free(*mp);
  *mp = NULL;
}
static int32_t h_msg_clone(spn_stage_t *s, const spn_msg_t *m, spn_msg_t **out, spn_error_t *err) {
  (void)s, (void)err;
  *out = malloc(sizeof **out);
  assert_non_null(*out);
  **out = *m;
  if (m->buf)
    h_buffer_ref(m->buf);
  return SPN_OK;
}
static int32_t h_msg_replace_tensor(spn_msg_t *m, size_t i, const spn_tensor_t *t, spn_buffer_t *b,
                                    spn_error_t *err) {
  (void)i, (void)err;
  spn_buffer_t *old = m->buf;
  m->buf = h_buffer_ref(b);
  h_buffer_unref(&old);
  m->t = *t;
  m->t.data = NULL;
  m->t.device_kind = b->device ? SPN_DEVICE_CUDA : SPN_DEVICE_CPU;
  return SPN_OK;
}
static int32_t h_emit(spn_stage_t *s, uint32_t port, spn_msg_t **mp, spn_error_t *err) {
  (void)s, (void)port, (void)err;
  assert_true(g.emitted < 8);
  g.out[g.emitted++] = *mp;
  *mp = NULL;
  return SPN_OK;
}
static void h_fail_job(spn_stage_t *s, uint64_t job, int32_t status, const char *msg) {
  (void)s, (void)job, (void)status;
  assert_non_null(strstr(msg, "frame body failed"));
  g.fails++;
}

static spn_host_api_t g_host;

static struct {
  spn_stage_head_t head;
} g_stage;

/* ---- the filter: a "kernel" that reads in and writes out, failing on
 * frames whose first byte is 0xee after queueing its work ------------------ */

static int32_t body_cuda(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *in,
                         spn_tensor_t *out, void *stream, spn_error_t *err) {
  (void)stage, (void)state, (void)msg, (void)stream;
  touch(in->data);
  touch(out->data);
  memcpy(out->data, in->data, spn_tensor_nbytes(in));
  if (((const unsigned char *)in->data)[0] == 0xee)
    return spn_error_set(err, SPN_ECUDA, "frame body failed after queueing");
  return SPN_OK;
}

static const spn_frame_filter_t k_filter = {.cuda = body_cuda};

static spn_msg_t *frame_msg(uint64_t job, bool on_device, unsigned char first) {
  spn_msg_t *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->env.struct_size = sizeof m->env;
  m->env.job_id = job;
  m->t = (spn_tensor_t)SPN_TENSOR_INIT;
  m->t.dtype = SPN_DTYPE_U8;
  m->t.ndim = 3;
  m->t.shape[0] = 4, m->t.shape[1] = 5, m->t.shape[2] = 3;
  m->t.device_kind = on_device ? SPN_DEVICE_CUDA : SPN_DEVICE_CPU;
  m->buf = fake_buffer(spn_tensor_nbytes(&m->t), 0, on_device);
  memset(m->buf->data, 7, m->buf->size);
  m->buf->data[0] = first;
  return m;
}

static int setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof g);
  fake_reset();
  memset(&g_host, 0, sizeof g_host);
  g_host.struct_size = offsetof(spn_host_api_t, buffer_copy); /* an earlier 1.1 host: the upload is cudaMemcpyAsync */
  g_host.stage_get_device = h_stage_get_device;
  g_host.stage_get_name = h_stage_get_name;
  g_host.stage_get_stream = h_stage_get_stream;
  g_host.buffer_new = h_buffer_new;
  g_host.buffer_data = h_buffer_data;
  g_host.buffer_size = h_buffer_size;
  g_host.buffer_ref = h_buffer_ref;
  g_host.buffer_unref = h_buffer_unref;
  g_host.buffer_set_ready = h_buffer_set_ready;
  g_host.msg_find = h_msg_find;
  g_host.msg_item = h_msg_item;
  g_host.msg_envelope = h_msg_envelope;
  g_host.msg_free = h_msg_free;
  g_host.msg_clone = h_msg_clone;
  g_host.msg_replace_tensor = h_msg_replace_tensor;
  g_host.emit = h_emit;
  g_host.fail_job = h_fail_job;
  g_stage.head.struct_size = sizeof g_stage.head;
  g_stage.head.host = &g_host;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < g.emitted; i++)
    h_msg_free(&g.out[i]);
  assert_true(fake_none_live()); /* nothing leaked */
  return 0;
}

static int32_t run(spn_msg_t **msgs, size_t n, spn_error_t *err) {
  return spn_frame_filter_process_cuda((spn_stage_t *)(void *)&g_stage, NULL, msgs, n, &k_filter, err);
}

static void device_inputs_are_released_only_after_the_stream_passed_them(void **state) {
  (void)state;
  spn_msg_t *msgs[3] = {frame_msg(1, true, 1), frame_msg(2, true, 2), frame_msg(1, true, 3)};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(run(msgs, 3, &err), SPN_OK);
  assert_int_equal(g.emitted, 3);
  assert_int_equal(fake.early_frees, 0);
  assert_true(fake.syncs >= 1);
  for (int i = 0; i < 3; i++) {
    assert_null(msgs[i]);
    assert_int_equal(g.out[i]->t.device_kind, SPN_DEVICE_CUDA);
    assert_int_equal(g.out[i]->buf->data[0], i + 1);
  }
}

static void host_inputs_and_their_uploads_outlive_the_queued_work(void **state) {
  (void)state;
  spn_msg_t *msgs[2] = {frame_msg(1, false, 4), frame_msg(1, false, 5)};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(run(msgs, 2, &err), SPN_OK);
  assert_int_equal(g.emitted, 2);
  assert_int_equal(fake.early_frees, 0);
  assert_int_equal(g.out[1]->buf->data[0], 5);
}

static void a_failed_frames_output_outlives_the_work_its_body_queued(void **state) {
  (void)state;
  spn_msg_t *msgs[3] = {frame_msg(1, true, 1), frame_msg(2, true, 0xee), frame_msg(3, false, 0xee)};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(run(msgs, 3, &err), SPN_OK); /* the frames' jobs fail, not the batch */
  assert_int_equal(g.emitted, 1);
  assert_int_equal(g.fails, 2);
  assert_int_equal(fake.early_frees, 0);
}

static void a_failed_wait_for_the_stream_fails_the_batch_naming_the_stage(void **state) {
  (void)state;
  spn_msg_t *msgs[1] = {frame_msg(1, true, 1)};
  spn_error_t err = SPN_ERROR_INIT;
  fake.sync_result = cudaErrorLaunchFailure;
  assert_int_equal(run(msgs, 1, &err), SPN_ECUDA);
  assert_non_null(strstr(err.msg, "sr: waiting for the stream"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(device_inputs_are_released_only_after_the_stream_passed_them, setup, teardown),
      cmocka_unit_test_setup_teardown(host_inputs_and_their_uploads_outlive_the_queued_work, setup, teardown),
      cmocka_unit_test_setup_teardown(a_failed_frames_output_outlives_the_work_its_body_queued, setup, teardown),
      cmocka_unit_test_setup_teardown(a_failed_wait_for_the_stream_fails_the_batch_naming_the_stage, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
