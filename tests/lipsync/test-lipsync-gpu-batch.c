/* test-lipsync-gpu-batch.c — the lipsync stage's GPU batch path
 * (stages/lipsync/stage-lipsync.c built with SPN_LIPSYNC_CUDA) without a GPU:
 * buffer lifetimes and the end-of-batch wait.
 *
 * The stage's source is included here and runs on a fake host whose stage
 * is "placed on cuda:0"; this file defines the CUDA runtime calls the stage
 * makes and the GPU twins it calls (spn_w2l_prepare_cuda, spn_w2l_paste_cuda,
 * spn_w2l_mel_gather_cuda: the last one as the CPU cuts the same chunks),
 * so the test links neither libcudart nor the kernels.
 * Work is "queued" by those fakes (and the fake model run) and "done" at the
 * next wait (stream or event). The host reports where buffers live, as the
 * runtime does: a device buffer may go while queued work touches it (the
 * device layer orders its free after that work), host or pinned memory may
 * not, and pinned staging must not be rewritten while a queued upload may
 * still read it; a batch does not wait for the GPU. A host that cannot say
 * where a buffer lives gets one wait a batch. The runtime closes a failed job
 * (releasing its frames) after process() returns, as the test does. The
 * fake model run keeps the batch's mel input, so the rows cut from a job's
 * spectrogram on the device and the rows uploaded from chunks can be told
 * apart and checked, also in one batch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#ifndef SPN_LIPSYNC_CUDA
#define SPN_LIPSYNC_CUDA 1
#endif
#include "stage-lipsync.c"

/* ---- fake buffers and CUDA runtime (and tests/gpu/fake-gpu-host.h) ------ */

#include "fake-gpu-host.h"

#define MAX_ROWS 8

static struct {
  int fails;
  char last_fail[512];
  spn_msg_t *out[16];
  int emitted;
  int32_t model_rc;
  /* the last model run's mel input */
  float mel[MAX_ROWS * SPN_W2L_MEL_FLOATS];
  int64_t mel_rows;
  /* every model run's mel rows, one after another */
  float all_mel[2 * MAX_ROWS * SPN_W2L_MEL_FLOATS];
  int64_t all_rows;
  int32_t mel_device_kind;
  /* buffer_copy calls and bytes, by job (1..3) */
  int copies[4];
  size_t copy_bytes[4];
  int gathers; /* rows cut from spectrograms */
  int warnings;
  char last_warning[512];
  int bs;              /* run_spec's batch size (0: MAX_ROWS) */
  int waits_in_process; /* stream and event waits during process() */
} g;

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t stream) {
  (void)stream;
  touch(dst);
  memset(dst, v, n);
  return cudaSuccess;
}

/* The twins: queue "kernels" on the frame and the scratch; a frame whose
 * first byte is 0xee fails in prepare after its first kernel was queued. */
int32_t spn_w2l_prepare_cuda(const spn_image_t *frame, const spn_w2l_rect_t *rect, float *face6, uint8_t *small,
                             void *stream, spn_error_t *err) {
  (void)rect, (void)stream;
  touch(frame->data[0]);
  touch(small);
  if (frame->data[0][0] == 0xee)
    return spn_error_set(err, SPN_ECUDA, "wav2lip: to_float launch failed (fake)");
  touch(face6);
  return SPN_OK;
}
int32_t spn_w2l_paste_cuda(spn_image_t *frame, const spn_w2l_rect_t *rect, const float *out3, float feather,
                           uint8_t *small, uint8_t *big, float *mask, void *stream, spn_error_t *err) {
  (void)rect, (void)feather, (void)stream, (void)err;
  touch(frame->data[0]);
  touch(out3);
  touch(small);
  touch(big);
  touch(mask);
  frame->data[0][1] = 0x5a; /* the pasted mouth */
  return SPN_OK;
}
/* Queued "kernels" reading the spectrograms and writing the rows: the
 * chunks spn_w2l_mel_chunk cuts on the CPU. */
int32_t spn_w2l_mel_gather_cuda(float *batch, int32_t n_rows, const spn_w2l_mel_src_t *src, size_t n, void *stream,
                                spn_error_t *err) {
  (void)stream;
  for (size_t k = 0; k < n; k++) {
    assert_true(src[k].row >= 0 && src[k].row < n_rows);
    touch(src[k].mel);
    touch(batch + (size_t)src[k].row * SPN_W2L_MEL_FLOATS);
    int32_t rc = spn_w2l_mel_chunk(src[k].mel, src[k].n_frames, src[k].i, src[k].fps,
                                   batch + (size_t)src[k].row * SPN_W2L_MEL_FLOATS, err);
    if (rc != SPN_OK)
      return rc;
    g.gathers++;
  }
  return SPN_OK;
}

/* ---- fake host ------------------------------------------------------------- */

#define MAX_ITEMS 3

struct spn_msg {
  spn_envelope_t env;
  int n;
  struct {
    char name[16];
    int32_t kind;
    spn_tensor_t t;
    spn_buffer_t *buf;
    void *meta;
    size_t meta_size;
  } it[MAX_ITEMS];
};

static int32_t h_buffer_new(spn_stage_t *s, size_t n, spn_buffer_t **out, spn_error_t *err) {
  (void)s, (void)err;
  *out = fake_buffer(n, 0, true);
  return SPN_OK;
}
static int32_t h_buffer_new_kind(spn_stage_t *s, size_t n, int32_t kind, spn_buffer_t **out, spn_error_t *err) {
  (void)s, (void)err;
  *out = fake_buffer(n, 0, kind == SPN_MEM_DEVICE);
  return SPN_OK;
}
static int32_t h_buffer_copy(spn_stage_t *s, uint64_t job, spn_buffer_t *dst, size_t doff, spn_buffer_t *src,
                             size_t soff, size_t n, spn_error_t *err) {
  (void)s, (void)err;
  assert_true(job >= 1 && job <= 3);
  assert_true(doff + n <= dst->size && soff + n <= src->size);
  if (!src->device && dst->device) { /* an upload */
    g.copies[job]++;
    g.copy_bytes[job] += n;
    fake_host_read(src->data + soff, n);
  }
  return cudaMemcpyAsync(dst->data + doff, src->data + soff, n, cudaMemcpyDeviceToDevice, NULL) == cudaSuccess
             ? SPN_OK
             : SPN_ECUDA;
}
static const char *h_stage_get_name(spn_stage_t *s) {
  (void)s;
  return "lips";
}
static void h_fail_job(spn_stage_t *s, uint64_t job, int32_t status, const char *msg) {
  (void)s, (void)job, (void)status;
  g.fails++;
  snprintf(g.last_fail, sizeof g.last_fail, "%s", msg);
}

static int32_t h_msg_new(spn_stage_t *s, const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err) {
  (void)s, (void)err;
  *out = calloc(1, sizeof **out);
  assert_non_null(*out);
  (*out)->env = *env;
  return SPN_OK;
}
static void h_msg_free(spn_msg_t **mp) {
  spn_msg_t *m = *mp;
  if (!m)
    return;
  for (int i = 0; i < m->n; i++) {
    h_buffer_unref(&m->it[i].buf);
    free(m->it[i].meta);
  }
  free(m);
  *mp = NULL;
}
static const spn_envelope_t *h_msg_envelope(const spn_msg_t *m) { return &m->env; }
static int64_t h_msg_find(const spn_msg_t *m, const char *name) {
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->it[i].name, name))
      return i;
  return -1;
}
static int32_t h_msg_item(const spn_msg_t *m, size_t i, spn_item_t *it) {
  if ((int)i >= m->n)
    return SPN_EINVAL;
  it->kind = m->it[i].kind;
  it->name = m->it[i].name;
  it->tensor = m->it[i].t;
  it->buffer = m->it[i].buf;
  if (it->buffer)
    it->tensor.data = it->buffer->data;
  it->meta = m->it[i].meta;
  it->meta_size = m->it[i].meta_size;
  return SPN_OK;
}
static int32_t h_msg_add_tensor(spn_msg_t *m, const char *name, const spn_tensor_t *t, spn_buffer_t *b,
                                spn_error_t *err) {
  (void)err;
  assert_true(m->n < MAX_ITEMS);
  snprintf(m->it[m->n].name, sizeof m->it[m->n].name, "%s", name);
  m->it[m->n].kind = SPN_ITEM_TENSOR;
  m->it[m->n].t = *t;
  m->it[m->n].t.data = NULL;
  m->it[m->n].buf = h_buffer_ref(b);
  m->n++;
  return SPN_OK;
}
static int32_t h_msg_add_meta(spn_msg_t *m, const char *name, const void *data, size_t size, spn_error_t *err) {
  (void)err;
  assert_true(m->n < MAX_ITEMS);
  snprintf(m->it[m->n].name, sizeof m->it[m->n].name, "%s", name);
  m->it[m->n].kind = SPN_ITEM_META;
  m->it[m->n].meta = malloc(size ? size : 1);
  memcpy(m->it[m->n].meta, data, size);
  m->it[m->n].meta_size = size;
  m->n++;
  return SPN_OK;
}
static int32_t h_emit(spn_stage_t *s, uint32_t port, spn_msg_t **mp, spn_error_t *err) {
  (void)s, (void)port, (void)err;
  assert_true(g.emitted < 16);
  g.out[g.emitted++] = *mp;
  *mp = NULL;
  return SPN_OK;
}

static int g_model;
static int32_t h_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err) {
  (void)s, (void)path, (void)err;
  *out = (spn_model_t *)(void *)&g_model;
  return SPN_OK;
}
static void h_model_release(spn_stage_t *s, spn_model_t **m) {
  (void)s;
  *m = NULL;
}
static int32_t h_model_io_count(const spn_model_t *m, bool is_output) {
  (void)m;
  return is_output ? 1 : 2;
}
static int32_t h_model_io(const spn_model_t *m, bool is_output, int32_t i, const char **name, spn_tensor_t *d) {
  (void)m;
  d->ndim = 4;
  d->shape[0] = -1;
  if (is_output) {
    *name = "out";
    d->shape[1] = 3, d->shape[2] = d->shape[3] = SPN_W2L_SIZE;
  } else if (i == 0) {
    *name = "mel";
    d->shape[1] = 1, d->shape[2] = SPN_W2L_MEL_BINS, d->shape[3] = SPN_W2L_MEL_STEPS;
  } else {
    *name = "face";
    d->shape[1] = 6, d->shape[2] = d->shape[3] = SPN_W2L_SIZE;
  }
  return SPN_OK;
}
static int32_t h_model_run(spn_stage_t *s, spn_model_t *m, const spn_tensor_t *in, size_t n_in, spn_tensor_t *out,
                           size_t n_out, spn_error_t *err) {
  (void)s, (void)m;
  for (size_t i = 0; i < n_in; i++)
    if (in[i].device_kind == SPN_DEVICE_CUDA)
      touch(in[i].data);
  /* input 0 is the mel (h_model_io) */
  assert_true(in[0].shape[0] <= MAX_ROWS);
  g.mel_rows = in[0].shape[0];
  g.mel_device_kind = in[0].device_kind;
  memcpy(g.mel, in[0].data, (size_t)in[0].shape[0] * SPN_W2L_MEL_FLOATS * sizeof(float));
  assert_true(g.all_rows + in[0].shape[0] <= 2 * MAX_ROWS);
  memcpy(g.all_mel + g.all_rows * SPN_W2L_MEL_FLOATS, in[0].data,
         (size_t)in[0].shape[0] * SPN_W2L_MEL_FLOATS * sizeof(float));
  g.all_rows += in[0].shape[0];
  for (size_t i = 0; i < n_out; i++)
    touch(out[i].data);
  return g.model_rc ? spn_error_set(err, g.model_rc, "model run failed (fake)") : SPN_OK;
}

static void h_log_kept(spn_stage_t *s, uint64_t job, int32_t level, const char *fmt, ...) {
  (void)s, (void)job;
  if (level < SPN_LOG_WARN)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g.last_warning, sizeof g.last_warning, fmt, ap);
  va_end(ap);
  g.warnings++;
}

static spn_host_api_t g_host;
static struct {
  spn_stage_head_t head;
} g_stage;
#define STAGE ((spn_stage_t *)(void *)&g_stage)

#define FW 64
#define FH 48

static int setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof g);
  fake_reset();
  memset(&g_host, 0, sizeof g_host);
  g_host.struct_size = sizeof g_host;
  g_host.stage_get_device = h_stage_get_device;
  g_host.stage_get_name = h_stage_get_name;
  g_host.stage_get_stream = h_stage_get_stream;
  g_host.log = h_log_kept;
  g_host.fail_job = h_fail_job;
  g_host.buffer_new = h_buffer_new;
  g_host.buffer_new_kind = h_buffer_new_kind;
  g_host.buffer_data = h_buffer_data;
  g_host.buffer_size = h_buffer_size;
  g_host.buffer_ref = h_buffer_ref;
  g_host.buffer_unref = h_buffer_unref;
  g_host.buffer_set_ready = h_buffer_set_ready;
  g_host.buffer_copy = h_buffer_copy;
  fake.kinds = true; /* without_buffer_device() clears them */
  g_host.buffer_mem_kind = h_buffer_mem_kind;
  g_host.buffer_device = h_buffer_device;
  g_host.msg_new = h_msg_new;
  g_host.msg_free = h_msg_free;
  g_host.msg_envelope = h_msg_envelope;
  g_host.msg_find = h_msg_find;
  g_host.msg_item = h_msg_item;
  g_host.msg_add_tensor = h_msg_add_tensor;
  g_host.msg_add_meta = h_msg_add_meta;
  g_host.emit = h_emit;
  g_host.model_load = h_model_load;
  g_host.model_release = h_model_release;
  g_host.model_io_count = h_model_io_count;
  g_host.model_io = h_model_io;
  g_host.model_run = h_model_run;
  g_stage.head.struct_size = sizeof g_stage.head;
  g_stage.head.host = &g_host;
  return 0;
}

/* A frame of job `job` already in this GPU's memory (kept by reference),
 * with one face; `first` is its first byte. */
static spn_msg_t *frame_msg(uint64_t job, uint64_t seq, unsigned char first) {
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = job, .seq = seq, .total = -1};
  spn_msg_t *m = NULL;
  h_msg_new(STAGE, &env, &m, NULL);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8;
  t.ndim = 3;
  t.shape[0] = FH, t.shape[1] = FW, t.shape[2] = 3;
  t.device_kind = SPN_DEVICE_CUDA;
  spn_buffer_t *b = fake_buffer(spn_tensor_nbytes(&t), 0, true);
  memset(b->data, 9, b->size);
  b->data[0] = first;
  h_msg_add_tensor(m, "frame", &t, b, NULL);
  h_buffer_unref(&b);
  spn_face_t f = {.x0 = 10, .y0 = 8, .x1 = 40, .y1 = 36, .score = 0.9f};
  h_msg_add_meta(m, "faces", &f, sizeof f, NULL);
  return m;
}

static spn_msg_t *mel_msg(uint64_t job, uint64_t seq, int64_t total) {
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = job, .seq = seq, .total = total};
  spn_msg_t *m = NULL;
  h_msg_new(STAGE, &env, &m, NULL);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = SPN_W2L_MEL_BINS, t.shape[1] = SPN_W2L_MEL_STEPS;
  spn_buffer_t *b = fake_buffer(spn_tensor_nbytes(&t), 0, true);
  h_msg_add_tensor(m, "mel", &t, b, NULL);
  h_buffer_unref(&b);
  return m;
}

/* A spectrogram of `cols` columns whose values say where they are, and the
 * mel message of seq 0 carrying it, as melspec sends it, with a chunk of
 * `fill` values (not the spectrogram's: the rows of the batch tell which of
 * the two they were made from). shape1 != cols claims another width. */
static float *spectrogram(int64_t cols, int job) {
  float *m = malloc((size_t)SPN_W2L_MEL_BINS * (size_t)cols * sizeof *m);
  assert_non_null(m);
  for (int64_t k = 0; k < SPN_W2L_MEL_BINS * cols; k++)
    m[k] = (float)job * 1000.0f + (float)k;
  return m;
}
static spn_msg_t *mel_msg_filled(uint64_t job, uint64_t seq, int64_t total, float fill) {
  spn_msg_t *m = mel_msg(job, seq, total);
  float *c = (float *)(void *)m->it[0].buf->data;
  for (int k = 0; k < SPN_W2L_MEL_FLOATS; k++)
    c[k] = fill;
  return m;
}
static void attach_spectrogram(spn_msg_t *m, const float *spec, int64_t cols, int64_t shape1, double fps) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = SPN_W2L_MEL_BINS, t.shape[1] = shape1;
  spn_buffer_t *b = fake_buffer((size_t)SPN_W2L_MEL_BINS * (size_t)cols * sizeof(float), 0, false);
  memcpy(b->data, spec, b->size);
  h_msg_add_tensor(m, SPN_W2L_SPEC_ITEM, &t, b, NULL);
  h_buffer_unref(&b);
  h_msg_add_meta(m, SPN_W2L_SPEC_FPS_ITEM, &fps, sizeof fps, NULL);
}

/* The stage's process() over msgs, which must succeed; the stream and
 * event waits it made into g.waits_in_process. */
static void process_counting_waits(void *state, spn_msg_t **msgs, void **mjs, size_t n) {
  spn_error_t err = SPN_ERROR_INIT;
  int before = fake.syncs + fake.event_syncs;
  assert_int_equal(ls_process(STAGE, state, msgs, mjs, n, &err), SPN_OK);
  g.waits_in_process = fake.syncs + fake.event_syncs - before;
}

/* Two jobs of 3 frames in one process() call, one batch: job 1's mel
 * stream carries a spectrogram of cols1 columns claiming shape1 (0: none),
 * job 2's of cols2/shape2; every chunk is filled with 100 * job + seq. */
static void run_spec(int64_t cols1, int64_t shape1, int64_t cols2, int64_t shape2, float *spec1, float *spec2) {
  ls_config_t cfg = {.model = "/dev/null", .pad_bottom = 0, .batch_size = g.bs ? g.bs : MAX_ROWS, .feather = 2.0};
  void *state = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(ls_create(STAGE, &cfg, &state, &err), SPN_OK);
  assert_int_equal(ls_preload(STAGE, state, &err), SPN_OK);
  void *js[2] = {0};
  spn_msg_t *msgs[12];
  void *mjs[12];
  int k = 0;
  for (int j = 0; j < 2; j++) {
    spn_job_info_t info = {.struct_size = sizeof info, .job_id = (uint64_t)j + 1};
    assert_int_equal(ls_job_open(STAGE, state, &info, &js[j], &err), SPN_OK);
    for (int i = 0; i < 3; i++) {
      mjs[k] = js[j];
      msgs[k++] = frame_msg((uint64_t)j + 1, (uint64_t)i, 1);
      mjs[k] = js[j];
      msgs[k] = mel_msg_filled((uint64_t)j + 1, (uint64_t)i, 3, 100.0f * (float)(j + 1) + (float)i);
      if (i == 0 && (j == 0 ? shape1 : shape2))
        attach_spectrogram(msgs[k], j == 0 ? spec1 : spec2, j == 0 ? cols1 : cols2, j == 0 ? shape1 : shape2, 25.0);
      k++;
    }
  }
  process_counting_waits(state, msgs, mjs, (size_t)k);
  for (int i = 0; i < k; i++)
    h_msg_free(&msgs[i]);
  for (int j = 0; j < 2; j++)
    ls_job_close(STAGE, state, js[j], true);
  ls_destroy(STAGE, state);
}

/* How many rows of the last batch hold exactly `want`. */
static int rows_in(const float *rows, int64_t n_rows, const float *want) {
  int n = 0;
  for (int64_t r = 0; r < n_rows; r++)
    n += !memcmp(rows + r * SPN_W2L_MEL_FLOATS, want, SPN_W2L_MEL_FLOATS * sizeof(float));
  return n;
}
static int rows_holding(const float *want) { return rows_in(g.mel, g.mel_rows, want); }
/* How many rows of the last batch (all: of every run) hold job's chunk seq. */
static int chunk_rows(uint64_t job, uint64_t seq, bool all) {
  float want[SPN_W2L_MEL_FLOATS];
  for (int k = 0; k < SPN_W2L_MEL_FLOATS; k++)
    want[k] = 100.0f * (float)job + (float)seq;
  return all ? rows_in(g.all_mel, g.all_rows, want) : rows_holding(want);
}
static int rows_holding_chunk_of(uint64_t job, uint64_t seq) { return chunk_rows(job, seq, false); }
static int rows_holding_window_of(const float *spec, int64_t cols, int64_t i) {
  float want[SPN_W2L_MEL_FLOATS];
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_w2l_mel_chunk(spec, cols, i, 25.0, want, &err), SPN_OK);
  return rows_holding(want);
}

/* One process() call with n frames and their mel chunks for each job in
 * jobs[0..nj) (frames' first bytes from firsts), then what the runtime
 * does after it: the inputs go, the jobs close; then the instance goes. */
static void run(int nj, const unsigned char firsts[][3], int n) {
  ls_config_t cfg = {.model = "/dev/null", .pad_bottom = 0, .batch_size = 8, .feather = 2.0};
  void *state = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(ls_create(STAGE, &cfg, &state, &err), SPN_OK);
  assert_int_equal(ls_preload(STAGE, state, &err), SPN_OK);
  void *js[4] = {0};
  spn_msg_t *msgs[24];
  void *mjs[24];
  int k = 0;
  for (int j = 0; j < nj; j++) {
    spn_job_info_t info = {.struct_size = sizeof info, .job_id = (uint64_t)j + 1};
    assert_int_equal(ls_job_open(STAGE, state, &info, &js[j], &err), SPN_OK);
    for (int i = 0; i < n; i++) {
      mjs[k] = js[j];
      msgs[k++] = frame_msg((uint64_t)j + 1, (uint64_t)i, firsts[j][i]);
      mjs[k] = js[j];
      msgs[k++] = mel_msg((uint64_t)j + 1, (uint64_t)i, n);
    }
  }
  process_counting_waits(state, msgs, mjs, (size_t)k);
  for (int i = 0; i < k; i++)
    h_msg_free(&msgs[i]);
  for (int j = 0; j < nj; j++)
    ls_job_close(STAGE, state, js[j], true);
  ls_destroy(STAGE, state);
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < g.emitted; i++)
    h_msg_free(&g.out[i]);
  assert_true(fake_none_live()); /* nothing leaked */
  return 0;
}

static void a_good_batch_emits_pasted_copies_without_waiting_for_the_gpu(void **state) {
  (void)state;
  const unsigned char firsts[2][3] = {{1, 2, 3}, {4, 5, 6}};
  run(2, firsts, 3);
  assert_int_equal(g.fails, 0);
  assert_int_equal(g.emitted, 6);
  assert_int_equal(g.waits_in_process, 0);
  assert_true(fake.queries >= 1); /* an error already reported would fail the batch */
  assert_int_equal(fake.early_frees, 0);
  assert_int_equal(fake.ordered_frees, 6); /* the input frames, while the pastes still read them */
  for (int i = 0; i < 6; i++) {
    spn_item_t it = {.struct_size = sizeof it};
    assert_int_equal(h_msg_item(g.out[i], 0, &it), SPN_OK);
    assert_int_equal(it.buffer->data[1], 0x5a); /* a pasted copy, not the input */
  }
}

static void a_failed_model_run_releases_the_frames_only_after_the_stream_passed_them(void **state) {
  (void)state;
  const unsigned char firsts[1][3] = {{1, 2, 3}};
  g.model_rc = SPN_EINTERNAL;
  run(1, firsts, 3);
  assert_true(g.fails >= 1);
  assert_int_equal(g.emitted, 0);
  assert_int_equal(fake.early_frees, 0);
}

static void a_batch_whose_jobs_all_failed_releases_their_frames_in_order(void **state) {
  (void)state;
  /* seq 1 fails in prepare after seq 0's kernels (and its own first one)
   * were queued: the job fails, nothing of the batch is retired; its frames
   * go when it closes, their frees ordered after the queued work. */
  const unsigned char firsts[1][3] = {{1, 0xee, 3}};
  run(1, firsts, 3);
  assert_int_equal(g.fails, 1);
  assert_int_equal(g.emitted, 0);
  assert_int_equal(fake.early_frees, 0);
}

static void a_job_failing_mid_batch_leaves_the_other_jobs_frames_good(void **state) {
  (void)state;
  const unsigned char firsts[2][3] = {{1, 0xee, 3}, {4, 5, 6}};
  run(2, firsts, 3);
  assert_int_equal(g.fails, 1);
  assert_int_equal(g.emitted, 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(g.out[i]->env.job_id, 2);
  assert_int_equal(fake.early_frees, 0);
}

static void an_error_the_gpu_reported_fails_the_jobs_instead_of_emitting_their_frames(void **state) {
  (void)state;
  const unsigned char firsts[1][3] = {{1, 2, 3}};
  fake.query_result = cudaErrorLaunchFailure;
  run(1, firsts, 3);
  assert_int_equal(g.emitted, 0);
  assert_int_equal(g.fails, 1);
  assert_non_null(strstr(g.last_fail, "lipsync: the GPU failed a batch of 3 faces"));
  assert_non_null(strstr(g.last_fail, "cudaErrorFake"));
  assert_int_equal(fake.early_frees, 0);
}

/* A host that leaves buffer_device out cannot say the frames are device
 * memory: one wait a batch before they go, and a failed wait fails them. */
static void without_buffer_device(void) {
  fake.kinds = false;
  g_host.buffer_mem_kind = NULL;
  g_host.buffer_device = NULL;
}
static void a_host_without_buffer_device_waits_once_a_batch(void **state) {
  (void)state;
  const unsigned char firsts[2][3] = {{1, 2, 3}, {4, 5, 6}};
  without_buffer_device();
  run(2, firsts, 3);
  assert_int_equal(g.fails, 0);
  assert_int_equal(g.emitted, 6);
  assert_int_equal(g.waits_in_process, 1);
  assert_int_equal(fake.early_frees, 0);
}
static void a_host_without_buffer_device_fails_the_jobs_on_a_failed_wait(void **state) {
  (void)state;
  const unsigned char firsts[1][3] = {{1, 2, 3}};
  without_buffer_device();
  fake.sync_result = cudaErrorLaunchFailure;
  run(1, firsts, 3);
  assert_int_equal(g.emitted, 0);
  assert_int_equal(g.fails, 1);
  assert_non_null(strstr(g.last_fail, "lipsync: the GPU failed a batch"));
  assert_int_equal(fake.early_frees, 0);
}

/* 3 chunks at 25 fps: windows at 0 and 3, the last clamped to 5 (not 6). */
#define SPEC_COLS 21

static void a_batch_mixing_a_job_with_its_spectrogram_on_the_gpu_and_one_without_gets_both_right(void **state) {
  (void)state;
  assert_int_equal(spn_w2l_mel_chunks(25.0, SPEC_COLS), 3);
  float *spec = spectrogram(SPEC_COLS, 1);
  run_spec(SPEC_COLS, SPEC_COLS, 0, 0, spec, NULL);
  assert_int_equal(g.fails, 0);
  assert_int_equal(g.emitted, 6);
  assert_int_equal(g.warnings, 0);
  /* one batch of six rows, on the device */
  assert_int_equal(g.mel_rows, 6);
  assert_int_equal(g.mel_device_kind, SPN_DEVICE_CUDA);
  /* job 1: its spectrogram went up once, its rows are its windows (the
   * clamped one included), cut on the device; its chunks went nowhere */
  assert_int_equal(g.copies[1], 1);
  assert_int_equal(g.copy_bytes[1], (size_t)SPN_W2L_MEL_BINS * SPEC_COLS * sizeof(float));
  assert_int_equal(g.gathers, 3);
  for (int64_t i = 0; i < 3; i++) {
    assert_int_equal(rows_holding_window_of(spec, SPEC_COLS, i), 1);
    assert_int_equal(rows_holding_chunk_of(1, (uint64_t)i), 0);
  }
  /* job 2: its three chunks in one upload into their rows */
  assert_int_equal(g.copies[2], 1);
  assert_int_equal(g.copy_bytes[2], 3 * SPN_W2L_MEL_FLOATS * sizeof(float));
  for (uint64_t i = 0; i < 3; i++)
    assert_int_equal(rows_holding_chunk_of(2, i), 1);
  /* the spectrogram's device copy went at job close, not before the wait */
  assert_int_equal(fake.early_frees, 0);
  free(spec);
}

static void a_spectrogram_that_does_not_fit_the_chunks_is_left_aside_and_the_chunks_go_up(void **state) {
  (void)state;
  /* job 1: 30 columns make 6 chunks at 25 fps, its stream has 3; job 2
   * claims 16 MiB and a column (its buffer is never read) */
  float *spec1 = spectrogram(30, 1), *spec2 = spectrogram(SPEC_COLS, 2);
  run_spec(30, 30, SPEC_COLS, (int64_t)(SPN_W2L_SPEC_MAX_BYTES / (SPN_W2L_MEL_BINS * sizeof(float))) + 1, spec1,
           spec2);
  assert_int_equal(g.fails, 0);
  assert_int_equal(g.emitted, 6);
  assert_int_equal(g.warnings, 2);
  assert_non_null(strstr(g.last_warning, "left aside"));
  assert_int_equal(g.gathers, 0);
  for (uint64_t j = 1; j <= 2; j++) {
    assert_int_equal(g.copies[j], 1);
    assert_int_equal(g.copy_bytes[j], 3 * SPN_W2L_MEL_FLOATS * sizeof(float));
    for (uint64_t i = 0; i < 3; i++)
      assert_int_equal(rows_holding_chunk_of(j, i), 1);
  }
  free(spec1);
  free(spec2);
}

/* Jobs without a spectrogram on the device, in batches of 2 over 6 rows:
 * each batch writes the pinned staging's first rows again, which the last
 * batch's upload may still read; it waits for that upload first (and only
 * then), and every batch's rows are its own chunks. */
static void batches_reusing_the_mel_staging_wait_for_the_last_upload_first(void **state) {
  (void)state;
  g.bs = 2;
  run_spec(0, 0, 0, 0, NULL, NULL);
  assert_int_equal(g.fails, 0);
  assert_int_equal(g.emitted, 6);
  assert_int_equal(fake.staging_rewrites, 0);
  assert_int_equal(g.waits_in_process, 2); /* batches 2 and 3, one each */
  /* three runs of two rows: each chunk of each job in exactly one row */
  assert_int_equal(g.mel_rows, 2);
  assert_int_equal(g.all_rows, 6);
  for (uint64_t j = 1; j <= 2; j++)
    for (uint64_t i = 0; i < 3; i++)
      assert_int_equal(chunk_rows(j, i, true), 1);
  assert_int_equal(fake.early_frees, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_good_batch_emits_pasted_copies_without_waiting_for_the_gpu, setup, teardown),
      cmocka_unit_test_setup_teardown(a_failed_model_run_releases_the_frames_only_after_the_stream_passed_them,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_batch_whose_jobs_all_failed_releases_their_frames_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(a_job_failing_mid_batch_leaves_the_other_jobs_frames_good, setup, teardown),
      cmocka_unit_test_setup_teardown(an_error_the_gpu_reported_fails_the_jobs_instead_of_emitting_their_frames,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_host_without_buffer_device_waits_once_a_batch, setup, teardown),
      cmocka_unit_test_setup_teardown(a_host_without_buffer_device_fails_the_jobs_on_a_failed_wait, setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_batch_mixing_a_job_with_its_spectrogram_on_the_gpu_and_one_without_gets_both_right, setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_spectrogram_that_does_not_fit_the_chunks_is_left_aside_and_the_chunks_go_up, setup, teardown),
      cmocka_unit_test_setup_teardown(batches_reusing_the_mel_staging_wait_for_the_last_upload_first, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
