/* test-harness.c — every built-in stage kind driven by spindle/harness.h on
 * the real runtime, through the public API only (this program links
 * libspindle as a stage author's test would). Each test pushes messages
 * into one stage and checks what it emitted against what it should be, how
 * its jobs ended and that end of stream came through, and gives it one bad
 * input (a malformed item, a missing file, a key out of range) that must be
 * refused with a message naming it; a stage whose plugin is not built (its
 * folder's variable unset) is skipped. The util stages and the example
 * are also held to what the runtime cannot show in their output: zero-copy
 * forwarding (the pushed message and buffer themselves, no reference kept),
 * their progress reports, and a sink's clean-up when its job ends failed.
 * The last test loads every built-in plugin and fails on a kind that none
 * of these tests drives.
 *
 * Plugin folders come from SPINDLE_UTIL_STAGE_DIR, SPINDLE_VISION_STAGE_DIR,
 * SPINDLE_MEDIA_STAGE_DIR, SPINDLE_LIPSYNC_STAGE_DIR; the example from
 * SPINDLE_EXAMPLE_PLUGIN; sample media under SPINDLE_SOURCE_ROOT. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "spindle/harness.h"
#include "spindle/runtime.h"
#include "../../stages/util/pattern.h" /* synth's frames, byte for byte */

/* ---- helpers ------------------------------------------------------------------ */

/* The plugin file libspindle-NAME.so in the folder named by env var ENV, or
 * NULL (the test skips) when the variable is unset. */
static const char *plugin_in(const char *env, const char *name, char *buf, size_t size) {
  const char *dir = getenv(env);
  if (!dir || !*dir)
    return NULL;
  snprintf(buf, size, "%s/libspindle-%s.so", dir, name);
  return buf;
}

static spn_harness_t *open_kind(const char *plugin, const char *kind, const char *config) {
  if (!plugin)
    return NULL;
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = plugin;
  o.kind = kind;
  o.config = config;
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_harness_new(&o, &h, &err);
  if (rc != SPN_OK)
    fail_msg("harness for %s: %s", kind, err.msg);
  return h;
}

/* A (H,W,3) u8 frame whose byte i is (i * 7 + salt) & 255. */
static spn_msg_t *frame_msg(spn_harness_t *h, uint64_t seq, int32_t H, int32_t W, uint8_t salt) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, seq, &m, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8;
  t.ndim = 3;
  t.shape[0] = H, t.shape[1] = W, t.shape[2] = 3;
  size_t n = (size_t)H * W * 3;
  uint8_t *px = malloc(n);
  for (size_t i = 0; i < n; i++)
    px[i] = (uint8_t)(i * 7 + salt);
  assert_int_equal(spn_harness_add_tensor(h, m, "frame", &t, px, &err), SPN_OK);
  free(px);
  return m;
}

static void push(spn_harness_t *h, uint64_t job, uint32_t port, spn_msg_t *m) {
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_push(h, job, port, &m, &err) != SPN_OK)
    fail_msg("push: %s", err.msg);
  assert_null(m);
}

static void run(spn_harness_t *h) {
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_run(h, &err) != SPN_OK)
    fail_msg("run: %s", err.msg);
}

static void expect_ok(spn_harness_t *h, uint64_t job) {
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_job_status(h, job, &err) != SPN_OK)
    fail_msg("job %llu failed: %s", (unsigned long long)job, err.msg);
}

static void expect_failure(spn_harness_t *h, uint64_t job, const char *needle) {
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_not_equal(spn_harness_job_status(h, job, &err), SPN_OK);
  if (!strstr(err.msg, needle))
    fail_msg("job %llu failed with \"%s\", expected it to say \"%s\"", (unsigned long long)job, err.msg, needle);
}

/* The tensor item `name` of an output message, its data in *data. */
static spn_tensor_t out_tensor(spn_harness_t *h, const spn_msg_t *m, const char *name, const uint8_t **data) {
  const spn_host_api_t *host = spn_harness_host(h);
  int64_t i = host->msg_find(m, name);
  assert_true(i >= 0);
  spn_item_t it = {.struct_size = sizeof it};
  assert_int_equal(host->msg_item(m, (size_t)i, &it), SPN_OK);
  assert_int_equal(it.kind, SPN_ITEM_TENSOR);
  if (data)
    *data = host->buffer_data(it.buffer);
  return it.tensor;
}

/* A config the kind refuses: spn_harness_new fails and says `needle`. */
static void expect_refused(const char *plugin, const char *kind, const char *config, const char *needle) {
  if (!plugin)
    return;
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = plugin;
  o.kind = kind;
  o.config = config;
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_not_equal(spn_harness_new(&o, &h, &err), SPN_OK);
  assert_null(h);
  if (!strstr(err.msg, needle))
    fail_msg("%s with \"%s\" refused with \"%s\", expected it to say \"%s\"", kind, config, err.msg, needle);
}

/* A message whose only item is a tensor `name` of dtype/shape, zero-filled. */
static spn_msg_t *tensor_msg(spn_harness_t *h, uint64_t seq, const char *name, int32_t dtype, int32_t ndim,
                             const int64_t *shape) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, seq, &m, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = dtype, t.ndim = ndim;
  for (int32_t d = 0; d < ndim; d++)
    t.shape[d] = shape[d];
  void *z = calloc(1, spn_tensor_nbytes(&t) + 1);
  assert_int_equal(spn_harness_add_tensor(h, m, name, &t, z, &err), SPN_OK);
  free(z);
  return m;
}

/* The bytes of frame_msg(h, seq, H, W, salt), to compare outputs with. */
static void frame_bytes(uint8_t *px, size_t n, uint8_t salt) {
  for (size_t i = 0; i < n; i++)
    px[i] = (uint8_t)(i * 7 + salt);
}

static uint64_t seq_of(spn_harness_t *h, const spn_msg_t *m) { return spn_harness_host(h)->msg_envelope(m)->seq; }

/* The buffer of a message's tensor item `name`. */
static spn_buffer_t *item_buffer(spn_harness_t *h, const spn_msg_t *m, const char *name) {
  const spn_host_api_t *host = spn_harness_host(h);
  int64_t i = host->msg_find(m, name);
  assert_true(i >= 0);
  spn_item_t it = {.struct_size = sizeof it};
  assert_int_equal(host->msg_item(m, (size_t)i, &it), SPN_OK);
  assert_non_null(it.buffer);
  return it.buffer;
}

/* A reference of the test's own on the buffer of m's "frame", taken before
 * m is pushed: the buffer stays alive (its address cannot be reused) to be
 * compared with the outputs' and read after the run. */
static spn_buffer_t *keep_frame_buffer(spn_harness_t *h, const spn_msg_t *m) {
  return spn_harness_host(h)->buffer_ref(item_buffer(h, m, "frame"));
}

static void drop_buffer(spn_harness_t *h, spn_buffer_t *b) { spn_harness_host(h)->buffer_unref(&b); }

/* The stage's last progress report for a job must be done of total. */
static void expect_progress(spn_harness_t *h, uint64_t job, int64_t done, int64_t total) {
  int64_t d = -2, t = -2;
  if (!spn_harness_job_progress(h, job, &d, &t))
    fail_msg("job %llu: the stage reported no progress", (unsigned long long)job);
  if (d != done || t != total)
    fail_msg("job %llu: progress %lld of %lld, expected %lld of %lld", (unsigned long long)job, (long long)d,
             (long long)t, (long long)done, (long long)total);
}

static void tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "/tmp/spn-harness-%d-%s", (int)getpid(), name);
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- the SDK example ------------------------------------------------------------ */

static void invert_maps_every_frame_and_fails_only_the_bad_job(void **state) {
  (void)state;
  spn_harness_t *h = open_kind(getenv("SPINDLE_EXAMPLE_PLUGIN"), "invert", "threshold = 128\nbatching = { max_batch = 4 }");
  if (!h)
    skip();
  assert_int_equal(spn_harness_input_count(h), 1);
  assert_int_equal(spn_harness_output_count(h), 1);
  for (uint64_t s = 0; s < 5; s++)
    push(h, 1, 0, frame_msg(h, s, 4, 6, (uint8_t)s));
  /* Job 2: a float frame where u8 belongs, after a good one. */
  push(h, 2, 0, frame_msg(h, 0, 4, 6, 9));
  spn_msg_t *bad = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, 1, &bad, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32, t.ndim = 1, t.shape[0] = 4;
  float f[4] = {0};
  assert_int_equal(spn_harness_add_tensor(h, bad, "frame", &t, f, &err), SPN_OK);
  push(h, 2, 0, bad);
  run(h);

  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 5);
  for (size_t i = 0; i < 5; i++) {
    const spn_msg_t *m = spn_harness_output(h, 1, 0, i);
    assert_int_equal(seq_of(h, m), i);
    const uint8_t *px;
    spn_tensor_t o = out_tensor(h, m, "frame", &px);
    assert_int_equal(o.shape[0], 4);
    assert_int_equal(o.shape[1], 6);
    for (size_t b = 0; b < 72; b++) {
      uint8_t v = (uint8_t)(b * 7 + i);
      assert_int_equal(px[b], v >= 128 ? 255 - v : v);
    }
  }
  assert_true(spn_harness_output_eos(h, 1, 0));
  expect_failure(h, 2, "must be u8");
  assert_null(spn_harness_output(h, 1, 0, 5));
  /* A second run starts from nothing: no job pushed again, no output. */
  run(h);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 0);
  spn_harness_free(&h);
  assert_null(h);
}

/* invert writes into a new buffer (through spn_frame_filter_process: a
 * copy of the message holding it) and leaves the pushed one as it was:
 * another consumer of the same frame (behind a tee) must not see it change. */
static void invert_writes_a_new_buffer_and_leaves_the_input_untouched(void **state) {
  (void)state;
  spn_harness_t *h = open_kind(getenv("SPINDLE_EXAMPLE_PLUGIN"), "invert", NULL);
  if (!h)
    skip();
  spn_msg_t *m = frame_msg(h, 0, 2, 8, 3);
  uint64_t id = spn_harness_msg_id(h, m);
  assert_int_not_equal(id, 0);
  spn_buffer_t *in = keep_frame_buffer(h, m);
  push(h, 1, 0, m);
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 1);
  const spn_msg_t *out = spn_harness_output(h, 1, 0, 0);
  assert_int_equal(spn_harness_msg_id(h, out), 0); /* a new message, not the input written over */
  spn_buffer_t *ob = item_buffer(h, out, "frame");
  assert_ptr_not_equal(ob, in);
  assert_int_equal(spn_harness_buffer_refs(h, ob), 1);   /* the output's only: the stage kept none */
  assert_int_equal(spn_harness_buffer_refs(h, in), 1);   /* the test's only: the input was released */
  uint8_t want[48];
  frame_bytes(want, sizeof want, 3);
  assert_memory_equal(spn_harness_host(h)->buffer_data(in), want, sizeof want); /* untouched */
  const uint8_t *px = spn_harness_host(h)->buffer_data(ob);
  for (size_t b = 0; b < sizeof want; b++)
    assert_int_equal(px[b], 255 - want[b]);
  drop_buffer(h, in);
  spn_harness_free(&h);
}

static void harness_refuses_an_unknown_kind_and_a_bad_config(void **state) {
  (void)state;
  const char *ex = getenv("SPINDLE_EXAMPLE_PLUGIN");
  if (!ex)
    skip();
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = ex;
  o.kind = "nosuchkind";
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_new(&o, &h, &err), SPN_ENOENT);
  assert_null(h);
  assert_non_null(strstr(err.msg, "nosuchkind"));
  o.kind = "invert";
  o.config = "threshold = 300";
  assert_int_not_equal(spn_harness_new(&o, &h, &err), SPN_OK);
  assert_non_null(strstr(err.msg, "threshold"));
  assert_null(h);
  /* A job can only fail with an error status. */
  o.config = NULL;
  assert_int_equal(spn_harness_new(&o, &h, &err), SPN_OK);
  assert_int_equal(spn_harness_job_fail(h, 1, SPN_OK, "no", &err), SPN_EINVAL);
  assert_int_equal(spn_harness_job_fail(h, 0, SPN_EIO, "no", &err), SPN_EINVAL); /* job 0 is reserved */
  spn_harness_free(&h);
}

/* ---- util stages ----------------------------------------------------------------- */

static void synth_generates_the_frames_a_job_asks_for(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "synth", p, sizeof p), "synth",
                               "width = 8\nheight = 6\nfps = 10");
  if (!h)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_job_set(h, 3, "frames=4", &err), SPN_OK);
  assert_int_equal(spn_harness_job_set(h, 5, "frames=0", &err), SPN_OK);
  run(h);
  expect_ok(h, 3);
  assert_int_equal(spn_harness_output_len(h, 3, 0), 4);
  for (size_t i = 0; i < 4; i++) {
    const spn_msg_t *m = spn_harness_output(h, 3, 0, i);
    assert_int_equal(seq_of(h, m), i);
    const uint8_t *px;
    spn_tensor_t t = out_tensor(h, m, "frame", &px);
    assert_int_equal(t.shape[0], 6);
    assert_int_equal(t.shape[1], 8);
    assert_int_equal(t.shape[2], 3);
    assert_int_equal(spn_synth_verify(px, 3, i, 8, 6, 3), -1); /* the pattern of (job 3, seq i) */
    const spn_envelope_t *env = spn_harness_host(h)->msg_envelope(m);
    assert_int_equal(env->total, 4); /* progress is known from the first frame */
    assert_true(env->pts == (double)i / 10.0);
    assert_int_equal(spn_harness_msg_id(h, m), 0);                                /* made by the stage */
    assert_int_equal(spn_harness_buffer_refs(h, item_buffer(h, m, "frame")), 1); /* synth dropped its own */
    assert_int_equal(spn_harness_host(h)->buffer_size(item_buffer(h, m, "frame")), 6 * 8 * 3);
  }
  assert_true(spn_harness_output_eos(h, 3, 0));
  expect_progress(h, 3, 4, 4);
  expect_ok(h, 5); /* zero frames: end of stream at once */
  assert_int_equal(spn_harness_output_len(h, 5, 0), 0);
  assert_true(spn_harness_output_eos(h, 5, 0));
  /* A source cannot be failed by its (absent) feeders. */
  assert_int_equal(spn_harness_job_fail(h, 3, SPN_EIO, "no", &err), SPN_EUNSUPPORTED);
  /* A job asking for a negative count is refused before it starts, naming the key. */
  assert_int_equal(spn_harness_job_set(h, 4, "frames=-1", &err), SPN_OK);
  assert_int_not_equal(spn_harness_run(h, &err), SPN_OK);
  assert_non_null(strstr(err.msg, "frames"));
  spn_harness_free(&h);
  expect_refused(p, "synth", "format = \"yuv9\"", "yuv9");
}

static void passthrough_forwards_the_same_buffers(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "passthrough", p, sizeof p), "passthrough", NULL);
  if (!h)
    skip();
  uint64_t ids[3];
  spn_buffer_t *bufs[3];
  for (uint64_t s = 0; s < 3; s++) {
    spn_msg_t *m = frame_msg(h, s, 2, 2, (uint8_t)(s + 1));
    ids[s] = spn_harness_msg_id(h, m);
    bufs[s] = keep_frame_buffer(h, m);
    push(h, 1, 0, m);
  }
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 3);
  for (size_t i = 0; i < 3; i++) {
    const uint8_t *px;
    uint8_t want[12];
    const spn_msg_t *m = spn_harness_output(h, 1, 0, i);
    out_tensor(h, m, "frame", &px);
    frame_bytes(want, sizeof want, (uint8_t)(i + 1));
    assert_memory_equal(px, want, sizeof want);
    assert_int_equal(seq_of(h, m), i);
    /* Zero-copy: the pushed message itself, its buffer held by it and the test only. */
    assert_int_equal(spn_harness_msg_id(h, m), ids[i]);
    assert_ptr_equal(item_buffer(h, m, "frame"), bufs[i]);
    assert_int_equal(spn_harness_buffer_refs(h, bufs[i]), 2);
    drop_buffer(h, bufs[i]);
  }
  assert_true(spn_harness_output_eos(h, 1, 0));
  spn_harness_free(&h);
  expect_refused(p, "passthrough", "speed = 2", "speed"); /* it has no config: any key is refused */
}

static void tee_sends_every_message_to_both_ports(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "tee", p, sizeof p), "tee", NULL);
  if (!h)
    skip();
  assert_int_equal(spn_harness_output_count(h), 2);
  uint64_t ids[2];
  spn_buffer_t *bufs[2];
  for (uint64_t s = 0; s < 2; s++) {
    spn_msg_t *m = frame_msg(h, s, 2, 2, 0);
    spn_error_t err = SPN_ERROR_INIT;
    if (s == 0) /* a meta item travels too, to both ports */
      assert_int_equal(spn_harness_host(h)->msg_add_meta(m, "tag", "abc", 3, &err), SPN_OK);
    ids[s] = spn_harness_msg_id(h, m);
    bufs[s] = keep_frame_buffer(h, m);
    push(h, 1, 0, m);
  }
  run(h);
  expect_ok(h, 1);
  for (uint32_t q = 0; q < 2; q++) {
    assert_int_equal(spn_harness_output_len(h, 1, q), 2);
    assert_true(spn_harness_output_eos(h, 1, q));
  }
  /* Zero-copy: the last port gets the pushed message itself, the others a
   * copy (a new message) sharing its buffer: the two messages and the test
   * hold it, nothing else. */
  for (size_t i = 0; i < 2; i++) {
    const spn_msg_t *copy = spn_harness_output(h, 1, 0, i), *orig = spn_harness_output(h, 1, 1, i);
    assert_int_equal(spn_harness_msg_id(h, orig), ids[i]);
    assert_int_equal(spn_harness_msg_id(h, copy), 0);
    assert_ptr_equal(item_buffer(h, orig, "frame"), bufs[i]);
    assert_ptr_equal(item_buffer(h, copy, "frame"), bufs[i]);
    assert_int_equal(spn_harness_buffer_refs(h, bufs[i]), 3);
    drop_buffer(h, bufs[i]);
  }
  const uint8_t *a, *b;
  out_tensor(h, spn_harness_output(h, 1, 0, 1), "frame", &a);
  out_tensor(h, spn_harness_output(h, 1, 1, 1), "frame", &b);
  assert_ptr_equal(a, b); /* one buffer, two references */
  const spn_host_api_t *host = spn_harness_host(h);
  for (uint32_t q = 0; q < 2; q++) {
    const spn_msg_t *m = spn_harness_output(h, 1, q, 0);
    assert_int_equal(seq_of(h, m), 0);
    assert_int_equal(seq_of(h, spn_harness_output(h, 1, q, 1)), 1);
    spn_item_t it = {.struct_size = sizeof it};
    int64_t ti = host->msg_find(m, "tag");
    assert_true(ti >= 0);
    assert_int_equal(host->msg_item(m, (size_t)ti, &it), SPN_OK);
    assert_int_equal(it.meta_size, 3);
    assert_memory_equal(it.meta, "abc", 3);
  }
  uint8_t want[12];
  frame_bytes(want, sizeof want, 0);
  assert_memory_equal(a, want, sizeof want);
  spn_harness_free(&h);
  expect_refused(p, "tee", "copies = 3", "copies");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void cost_forwards_after_its_delay(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "cost", p, sizeof p), "cost", "us = 5000");
  if (!h)
    skip();
  push(h, 1, 0, frame_msg(h, 0, 2, 2, 4));
  push(h, 1, 0, frame_msg(h, 1, 2, 2, 5));
  double t0 = now_s();
  run(h);
  assert_true(now_s() - t0 >= 2 * 5000e-6); /* a floor, never a ceiling */
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 2);
  for (size_t i = 0; i < 2; i++) { /* forwarded unchanged, in order */
    const uint8_t *px;
    uint8_t want[12];
    out_tensor(h, spn_harness_output(h, 1, 0, i), "frame", &px);
    frame_bytes(want, sizeof want, (uint8_t)(4 + i));
    assert_memory_equal(px, want, sizeof want);
  }
  assert_true(spn_harness_output_eos(h, 1, 0));
  spn_harness_free(&h);
  /* Counted work instead of time: forwarded all the same. */
  h = open_kind(p, "cost", "iterations = 1000");
  push(h, 1, 0, frame_msg(h, 0, 2, 2, 6));
  push(h, 1, 0, frame_msg(h, 1, 2, 2, 7));
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 2);
  assert_int_equal(seq_of(h, spn_harness_output(h, 1, 0, 1)), 1);
  spn_harness_free(&h);
  expect_refused(p, "cost", "us = -5", "us");
}

static void check_fails_a_job_that_ends_short(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "check", p, sizeof p), "check", NULL);
  if (!h)
    skip();
  assert_int_equal(spn_harness_output_count(h), 0);
  spn_error_t err = SPN_ERROR_INIT;
  for (uint64_t s = 0; s < 3; s++) {
    push(h, 1, 0, frame_msg(h, s, 2, 2, 0));
    push(h, 2, 0, frame_msg(h, s, 2, 2, 0));
  }
  assert_int_equal(spn_harness_job_set(h, 1, "expect_frames=3", &err), SPN_OK);
  assert_int_equal(spn_harness_job_set(h, 2, "expect_frames=5", &err), SPN_OK);
  run(h);
  expect_ok(h, 1);
  expect_failure(h, 2, "end of stream after 3 frames, expected 5");
  spn_harness_free(&h);
}

/* Without expect_frames, check holds a stream to the envelope's total: a
 * job whose messages say 4 and that ends after 3 fails, one that says 3
 * passes. Its progress is frames of expect_frames, else of the total.
 *
 * check also handles an EOS message reaching process; the runtime never
 * delivers one to a stage (actor.c: deliver() consumes EOS), so that code
 * cannot run under the runtime and is not tested here. SKIPs: see
 * sinks_take_a_dropped_frame_as_no_gap. */
static void check_holds_a_job_to_its_envelope_total(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "check", p, sizeof p), "check", NULL);
  if (!h)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  for (uint64_t s = 0; s < 3; s++) {
    spn_msg_t *m = frame_msg(h, s, 2, 2, 0);
    spn_harness_msg_set_total(h, m, 4);
    push(h, 1, 0, m);
    m = frame_msg(h, s, 2, 2, 0);
    spn_harness_msg_set_total(h, m, 3);
    push(h, 2, 0, m);
  }
  for (uint64_t s = 0; s < 6; s++)
    push(h, 3, 0, frame_msg(h, s, 2, 2, 0));
  assert_int_equal(spn_harness_job_set(h, 3, "expect_frames=6", &err), SPN_OK);
  run(h);
  expect_failure(h, 1, "job 1: end of stream after 3 messages, the envelope's total is 4");
  expect_progress(h, 1, 3, 4); /* the frames it had seen were fine */
  expect_ok(h, 2);
  expect_progress(h, 2, 3, 3);
  expect_ok(h, 3);
  expect_progress(h, 3, 6, 6);
  spn_harness_free(&h);
}

/* A (2,8,3) frame of synth's pattern for (job, seq), one byte flipped if flip >= 0. */
static spn_msg_t *pattern_msg(spn_harness_t *h, uint64_t job, uint64_t seq, int flip) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, seq, &m, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8, t.ndim = 3, t.shape[0] = 2, t.shape[1] = 8, t.shape[2] = 3;
  uint8_t px[48];
  spn_synth_fill(px, job, seq, 8, 2, 3);
  if (flip >= 0)
    px[flip] ^= 1;
  assert_int_equal(spn_harness_add_tensor(h, m, "frame", &t, px, &err), SPN_OK);
  return m;
}

static void check_verifies_the_pattern_and_the_order(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "check", p, sizeof p), "check",
                               "verify_pattern = true");
  if (!h)
    skip();
  for (uint64_t s = 0; s < 3; s++) {
    push(h, 1, 0, pattern_msg(h, 1, s, -1));              /* job 1: whole */
    push(h, 2, 0, pattern_msg(h, 2, s, s == 2 ? 7 : -1)); /* job 2: a byte of its last frame flipped */
    push(h, 3, 0, pattern_msg(h, 3, s == 2 ? 3 : s, -1)); /* job 3: seq 0, 1, 3 */
    push(h, 4, 0, pattern_msg(h, 4, s == 2 ? 1 : s, -1)); /* job 4: seq 0, 1, 1 */
  }
  run(h);
  expect_ok(h, 1);
  expect_failure(h, 2, "seq 2: frame byte 7 differs from the synth pattern");
  expect_failure(h, 3, "job 3: expected seq 2, got 3 (gap)");
  expect_failure(h, 4, "expected seq 2, got 1 (repeated or out of order)");
  spn_harness_free(&h);
}

static void filesink_writes_each_jobs_frames(void **state) {
  (void)state;
  char p[512], out[256], set[300], out3[256], set3[300];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "filesink", p, sizeof p), "filesink", NULL);
  if (!h)
    skip();
  /* Each job its own file: a job named once runs again in every later run
   * (with no messages, writing an empty file at its path). */
  tmp_path(out, sizeof out, "filesink.raw");
  snprintf(set, sizeof set, "path=%s", out);
  tmp_path(out3, sizeof out3, "filesink-3.raw");
  snprintf(set3, sizeof set3, "path=%s", out3);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  for (uint64_t s = 0; s < 3; s++)
    push(h, 1, 0, frame_msg(h, s, 4, 5, (uint8_t)s));
  /* Job 2: an output in a folder that does not exist. */
  assert_int_equal(spn_harness_job_set(h, 2, "path=/nonexistent-dir/out.raw", &err), SPN_OK);
  push(h, 2, 0, frame_msg(h, 0, 4, 5, 0));
  run(h);
  expect_ok(h, 1);
  assert_int_equal(file_size(out), 3 * 4 * 5 * 3);
  FILE *fp = fopen(out, "rb");
  assert_non_null(fp);
  uint8_t got[60], want[60];
  for (uint8_t s = 0; s < 3; s++) { /* the frames' bytes, one after the other */
    assert_int_equal(fread(got, 1, sizeof got, fp), sizeof got);
    frame_bytes(want, sizeof want, s);
    assert_memory_equal(got, want, sizeof want);
  }
  fclose(fp);
  expect_failure(h, 2, "/nonexistent-dir/out.raw");
  unlink(out);
  /* A gap in seq fails the job naming the file, and leaves no file. */
  assert_int_equal(spn_harness_job_set(h, 3, set3, &err), SPN_OK);
  push(h, 3, 0, frame_msg(h, 0, 4, 5, 0));
  push(h, 3, 0, frame_msg(h, 2, 4, 5, 0));
  /* Without a path nothing is written and the job succeeds. */
  push(h, 4, 0, frame_msg(h, 0, 4, 5, 0));
  run(h);
  expect_failure(h, 3, out3);
  assert_int_equal(file_size(out3), -1);
  expect_ok(h, 4);
  /* Progress: frames written of the envelope's total. */
  char out5[256], set5[300];
  tmp_path(out5, sizeof out5, "filesink-5.raw");
  snprintf(set5, sizeof set5, "path=%s", out5);
  assert_int_equal(spn_harness_job_set(h, 5, set5, &err), SPN_OK);
  for (uint64_t s = 0; s < 3; s++) {
    spn_msg_t *m = frame_msg(h, s, 4, 5, (uint8_t)s);
    spn_harness_msg_set_total(h, m, 3);
    push(h, 5, 0, m);
  }
  run(h);
  expect_ok(h, 5);
  expect_progress(h, 5, 3, 3);
  assert_int_equal(file_size(out5), 3 * 4 * 5 * 3);
  /* A job the host ends as failed after every frame was written (another
   * stage failed it, or it was cancelled) leaves no file either. */
  assert_int_equal(spn_harness_job_fail(h, 5, SPN_ECANCELLED, "stopped by the test", &err), SPN_OK);
  for (uint64_t s = 0; s < 3; s++)
    push(h, 5, 0, frame_msg(h, s, 4, 5, (uint8_t)s));
  run(h);
  assert_int_equal(spn_harness_job_status(h, 5, &err), SPN_ECANCELLED);
  assert_non_null(strstr(err.msg, "stopped by the test"));
  expect_progress(h, 5, 3, -1); /* it did write all three */
  assert_int_equal(file_size(out5), -1);
  spn_harness_free(&h);
  unlink(out); /* job 1's, written again (empty) by the later runs */
  unlink(out3);
}

/* A stage upstream that drops a frame sends a SKIP of its seq. The sinks
 * that count seqs (check, filesink, metasink) ask for SKIPs
 * (SPN_KIND_SEES_SKIPS) and take one as no gap; a stage with outputs never
 * sees one (the runtime forwards it past the stage). Before the flag the
 * runtime swallowed every SKIP at a sink, which then failed the job with a
 * gap. */
static spn_msg_t *skip_msg(spn_harness_t *h, uint64_t seq, int64_t total) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, seq, &m, &err), SPN_OK);
  spn_harness_msg_set_skip(h, m);
  spn_harness_msg_set_total(h, m, total);
  return m;
}

static void sinks_take_a_dropped_frame_as_no_gap(void **state) {
  (void)state;
  char p[512], out[256], set[300];
  spn_error_t err = SPN_ERROR_INIT;
  /* check: seq 0, SKIP 1, 2 of a job of 3 passes; 0, 2 without the SKIP is a gap */
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "check", p, sizeof p), "check", NULL);
  if (!h)
    skip();
  for (uint64_t s = 0; s < 3; s++) {
    spn_msg_t *m = s == 1 ? skip_msg(h, s, 3) : frame_msg(h, s, 2, 2, 0);
    spn_harness_msg_set_total(h, m, 3);
    push(h, 1, 0, m);
    if (s != 1)
      push(h, 2, 0, frame_msg(h, s, 2, 2, 0));
  }
  run(h);
  expect_ok(h, 1);
  expect_failure(h, 2, "expected seq 1, got 2 (gap)");
  spn_harness_free(&h);
  /* filesink: the two frames written, back to back */
  h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "filesink", p, sizeof p), "filesink", NULL);
  assert_non_null(h);
  tmp_path(out, sizeof out, "filesink-skip.raw");
  snprintf(set, sizeof set, "path=%s", out);
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  push(h, 1, 0, frame_msg(h, 0, 4, 5, 0));
  push(h, 1, 0, skip_msg(h, 1, -1));
  push(h, 1, 0, frame_msg(h, 2, 4, 5, 2));
  run(h);
  expect_ok(h, 1);
  assert_int_equal(file_size(out), 2 * 4 * 5 * 3);
  spn_harness_free(&h);
  unlink(out);
  /* passthrough (has an output): the SKIP goes past it, the frames through it */
  h = open_kind(plugin_in("SPINDLE_UTIL_STAGE_DIR", "passthrough", p, sizeof p), "passthrough", NULL);
  assert_non_null(h);
  push(h, 1, 0, frame_msg(h, 0, 2, 2, 0));
  push(h, 1, 0, skip_msg(h, 1, -1));
  push(h, 1, 0, frame_msg(h, 2, 2, 2, 2));
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 2);
  spn_harness_free(&h);
}

/* ---- vision ---------------------------------------------------------------------- */

static spn_msg_t *with_faces(spn_harness_t *h, spn_msg_t *m, const spn_face_t *f, size_t n) {
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_host(h)->msg_add_meta(m, "faces", f, n * sizeof *f, &err), SPN_OK);
  return m;
}

static void superres_doubles_the_frame_and_its_face_boxes(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_VISION_STAGE_DIR", "vision", p, sizeof p), "superres", NULL);
  if (!h)
    skip();
  spn_face_t f = {.x0 = 1, .y0 = 2, .x1 = 5, .y1 = 6, .score = 0.9f, .landmarks = {1, 1}};
  push(h, 1, 0, with_faces(h, frame_msg(h, 0, 8, 10, 0), &f, 1));
  /* Job 2: a 2-D tensor where a (H,W,3) frame belongs. */
  spn_msg_t *bad = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, 0, &bad, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8, t.ndim = 2, t.shape[0] = 4, t.shape[1] = 4;
  uint8_t px[16] = {0};
  assert_int_equal(spn_harness_add_tensor(h, bad, "frame", &t, px, &err), SPN_OK);
  push(h, 2, 0, bad);
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 1);
  const spn_msg_t *m = spn_harness_output(h, 1, 0, 0);
  spn_tensor_t o = out_tensor(h, m, "frame", NULL);
  assert_int_equal(o.shape[0], 16);
  assert_int_equal(o.shape[1], 20);
  assert_int_equal(o.shape[2], 3);
  const spn_host_api_t *host = spn_harness_host(h);
  spn_item_t it = {.struct_size = sizeof it};
  assert_int_equal(host->msg_item(m, (size_t)host->msg_find(m, "faces"), &it), SPN_OK);
  assert_int_equal(it.meta_size, sizeof(spn_face_t));
  const spn_face_t *g = it.meta;
  assert_true(g->x0 == 2 && g->y0 == 4 && g->x1 == 10 && g->y1 == 12 && g->landmarks[0] == 2 && g->score == 0.9f);
  expect_failure(h, 2, "must be a (H,W,3) u8 RGB tensor");
  spn_harness_free(&h);
}

static void facedetect_finds_no_face_on_a_flat_frame(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_VISION_STAGE_DIR", "vision", p, sizeof p), "facedetect", NULL);
  if (!h)
    skip();
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, 0, &m, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8, t.ndim = 3, t.shape[0] = 48, t.shape[1] = 64, t.shape[2] = 3;
  static uint8_t grey[48 * 64 * 3];
  memset(grey, 128, sizeof grey);
  assert_int_equal(spn_harness_add_tensor(h, m, "frame", &t, grey, &err), SPN_OK);
  push(h, 1, 0, m);
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 1);
  const spn_msg_t *o = spn_harness_output(h, 1, 0, 0);
  const spn_host_api_t *host = spn_harness_host(h);
  int64_t fi = host->msg_find(o, "faces");
  assert_true(fi >= 0);
  spn_item_t it = {.struct_size = sizeof it};
  assert_int_equal(host->msg_item(o, (size_t)fi, &it), SPN_OK);
  assert_int_equal(it.meta_size, 0);
  assert_true(host->msg_find(o, "frame") >= 0); /* the frame goes on beside its faces */
  /* A 2-D tensor where a (H,W,3) frame belongs fails its job, saying so. */
  const int64_t flat[2] = {8, 8};
  push(h, 2, 0, tensor_msg(h, 0, "frame", SPN_DTYPE_U8, 2, flat));
  run(h);
  expect_failure(h, 2, "(H,W,3) u8");
  assert_int_equal(spn_harness_output_len(h, 2, 0), 0);
  spn_harness_free(&h);
}

static void metasink_writes_the_faces_it_sees(void **state) {
  (void)state;
  char p[512], out[256], set[300];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_VISION_STAGE_DIR", "vision", p, sizeof p), "metasink", NULL);
  if (!h)
    skip();
  tmp_path(out, sizeof out, "faces.jsonl");
  snprintf(set, sizeof set, "path=%s", out);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  spn_face_t f = {.x0 = 1, .y0 = 2, .x1 = 5, .y1 = 6, .score = 0.5f};
  push(h, 1, 0, with_faces(h, frame_msg(h, 0, 8, 8, 0), &f, 1));
  push(h, 1, 0, with_faces(h, frame_msg(h, 1, 8, 8, 0), &f, 0));
  run(h);
  expect_ok(h, 1);
  FILE *fp = fopen(out, "r");
  assert_non_null(fp);
  char line[2][1024];
  int lines = 0;
  while (lines < 2 && fgets(line[lines], sizeof line[0], fp))
    lines++;
  assert_null(fgets(line[0] + 512, 512, fp));
  fclose(fp);
  assert_int_equal(lines, 2); /* one line per frame: the face on the first, none on the second */
  assert_non_null(strstr(line[0], "\"seq\":0"));
  assert_non_null(strstr(line[0], "0.5"));
  assert_non_null(strstr(line[1], "\"seq\":1"));
  assert_null(strstr(line[1], "0.5"));
  unlink(out);
  /* A job whose output cannot be created fails naming it. */
  assert_int_equal(spn_harness_job_set(h, 2, "path=/nonexistent-dir/faces.jsonl", &err), SPN_OK);
  push(h, 2, 0, with_faces(h, frame_msg(h, 0, 8, 8, 0), &f, 1));
  run(h);
  expect_failure(h, 2, "/nonexistent-dir/faces.jsonl");
  spn_harness_free(&h);
}

/* ---- media ----------------------------------------------------------------------- */

static void decode_emits_frames_of_the_sample_clip(void **state) {
  (void)state;
  char p[512], set[600];
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_MEDIA_STAGE_DIR", "decode", p, sizeof p), "decode",
                               "path = \"set-per-job\"");
  if (!h || !root)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  snprintf(set, sizeof set, "path=%s/samples/media/talking-head.mp4", root);
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  assert_int_equal(spn_harness_job_set(h, 1, "duration=0.2", &err), SPN_OK);
  assert_int_equal(spn_harness_job_set(h, 2, "path=/nonexistent/clip.mp4", &err), SPN_OK);
  run(h);
  expect_ok(h, 1);
  size_t n = spn_harness_output_len(h, 1, 0);
  assert_true(n >= 2 && n <= 10);
  for (size_t i = 0; i < n; i++) {
    const spn_msg_t *m = spn_harness_output(h, 1, 0, i);
    assert_int_equal(seq_of(h, m), i);
    spn_tensor_t t = out_tensor(h, m, "frame", NULL);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.shape[2], 3);
  }
  assert_true(spn_harness_output_eos(h, 1, 0));
  expect_failure(h, 2, "/nonexistent/clip.mp4");
  spn_harness_free(&h);
}

static spn_msg_t *timed(spn_harness_t *h, spn_msg_t *m, double pts) {
  spn_harness_msg_set_pts(h, m, pts);
  return m;
}

/* What the decode stage reads back from a file: its frames (each must be
 * W x H) and its audio messages carrying "pcm" of `channels` channels. */
static void decode_back(const char *file, int64_t W, int64_t H, int64_t channels, size_t *frames, size_t *pcm_msgs) {
  char p[512], set[300];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_MEDIA_STAGE_DIR", "decode", p, sizeof p), "decode",
                               "path = \"set-per-job\"");
  spn_error_t err = SPN_ERROR_INIT;
  snprintf(set, sizeof set, "path=%s", file);
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  run(h);
  expect_ok(h, 1);
  *frames = spn_harness_output_len(h, 1, 0);
  for (size_t i = 0; i < *frames; i++) {
    spn_tensor_t t = out_tensor(h, spn_harness_output(h, 1, 0, i), "frame", NULL);
    assert_int_equal(t.shape[0], H);
    assert_int_equal(t.shape[1], W);
  }
  *pcm_msgs = 0;
  const spn_host_api_t *host = spn_harness_host(h);
  for (size_t i = 0; i < spn_harness_output_len(h, 1, 1); i++) {
    const spn_msg_t *m = spn_harness_output(h, 1, 1, i);
    if (host->msg_find(m, "pcm") < 0)
      continue;
    spn_tensor_t t = out_tensor(h, m, "pcm", NULL);
    assert_int_equal(t.dtype, SPN_DTYPE_F32);
    assert_int_equal(t.shape[1], channels);
    (*pcm_msgs)++;
  }
  spn_harness_free(&h);
}

static void encode_writes_a_playable_file(void **state) {
  (void)state;
  char p[512], out[256], set[300];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_MEDIA_STAGE_DIR", "encode", p, sizeof p), "encode",
                               "fps = 25\npath = \"set-per-job\"");
  if (!h)
    skip();
  tmp_path(out, sizeof out, "encode.mp4");
  snprintf(set, sizeof set, "path=%s", out);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  for (uint64_t s = 0; s < 5; s++)
    push(h, 1, 0, timed(h, frame_msg(h, s, 32, 32, (uint8_t)s), s / 25.0));
  /* Job 2: a 2-D tensor is no picture; it fails naming its output and frame, and leaves no file. */
  char out2[256], set2[300];
  tmp_path(out2, sizeof out2, "encode-bad.mp4");
  snprintf(set2, sizeof set2, "path=%s", out2);
  assert_int_equal(spn_harness_job_set(h, 2, set2, &err), SPN_OK);
  const int64_t flat[2] = {32, 32};
  push(h, 2, 0, tensor_msg(h, 0, "frame", SPN_DTYPE_U8, 2, flat));
  run(h);
  expect_ok(h, 1);
  assert_true(file_size(out) > 0);
  expect_failure(h, 2, "encode-bad.mp4: frame 0 is not (H,W,3) u8");
  assert_int_equal(file_size(out2), -1);
  spn_harness_free(&h);
  size_t frames, pcm;
  decode_back(out, 32, 32, 0, &frames, &pcm);
  assert_int_equal(frames, 5); /* every frame is in the file */
  assert_int_equal(pcm, 0);
  unlink(out);
}

/* encode_av: pictures on "video", the soundtrack on "audio" (its format
 * first, as decode.audio sends it). */
static spn_msg_t *audio_msg(spn_harness_t *h, uint64_t seq, int32_t rate, int32_t channels, int64_t samples) {
  spn_msg_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, seq, &m, &err), SPN_OK);
  if (rate) {
    const int32_t fmt[2] = {rate, channels}; /* media-decode.h's spn_media_audio_meta_t: rate, channels */
    assert_int_equal(spn_harness_host(h)->msg_add_meta(m, "audio_format", fmt, sizeof fmt, &err), SPN_OK);
  }
  if (samples) {
    spn_tensor_t t = SPN_TENSOR_INIT;
    t.dtype = SPN_DTYPE_F32, t.ndim = 2, t.shape[0] = samples, t.shape[1] = channels;
    float *pcm = malloc(spn_tensor_nbytes(&t));
    for (int64_t i = 0; i < samples * channels; i++)
      pcm[i] = 0.25f * (float)((i / 20) % 2 ? 1 : -1); /* a 400 Hz square wave at 16 kHz */
    assert_int_equal(spn_harness_add_tensor(h, m, "pcm", &t, pcm, &err), SPN_OK);
    free(pcm);
  }
  return m;
}

static void encode_av_muxes_its_audio_input(void **state) {
  (void)state;
  char p[512], out[256], set[300];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_MEDIA_STAGE_DIR", "encode", p, sizeof p), "encode_av",
                               "fps = 25\npath = \"set-per-job\"");
  if (!h)
    skip();
  assert_int_equal(spn_harness_input_count(h), 2);
  tmp_path(out, sizeof out, "encode-av.mp4");
  snprintf(set, sizeof set, "path=%s", out);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  push(h, 1, 1, audio_msg(h, 0, 16000, 1, 0));
  for (uint64_t s = 0; s < 10; s++) {
    push(h, 1, 0, timed(h, frame_msg(h, s, 32, 32, (uint8_t)s), s / 25.0));
    push(h, 1, 1, timed(h, audio_msg(h, s + 1, 0, 1, 640), s / 25.0)); /* 40 ms per frame */
  }
  /* Job 2: stereo PCM after a mono format fails naming the file and the message. */
  char out2[256], set2[300];
  tmp_path(out2, sizeof out2, "encode-av-bad.mp4");
  snprintf(set2, sizeof set2, "path=%s", out2);
  assert_int_equal(spn_harness_job_set(h, 2, set2, &err), SPN_OK);
  push(h, 2, 1, audio_msg(h, 0, 16000, 1, 0));
  push(h, 2, 1, audio_msg(h, 1, 0, 2, 640));
  push(h, 2, 0, frame_msg(h, 0, 32, 32, 0));
  run(h);
  expect_ok(h, 1);
  expect_failure(h, 2, "encode-av-bad.mp4: audio message 1 is not (samples, 1) f32");
  assert_int_equal(file_size(out2), -1);
  spn_harness_free(&h);
  size_t frames, pcm;
  decode_back(out, 32, 32, 1, &frames, &pcm);
  assert_int_equal(frames, 10);
  assert_true(pcm > 0); /* the soundtrack is in the file */
  unlink(out);
}

static void convert_swaps_rgb_into_bgr(void **state) {
  (void)state;
  char p[512];
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_MEDIA_STAGE_DIR", "convert", p, sizeof p), "convert",
                               "pixel_format = \"bgr24\"");
  if (!h)
    skip();
  push(h, 1, 0, frame_msg(h, 0, 3, 4, 1));
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 1);
  const uint8_t *px;
  spn_tensor_t t = out_tensor(h, spn_harness_output(h, 1, 0, 0), "frame", &px);
  assert_int_equal(t.shape[0], 3);
  assert_int_equal(t.shape[1], 4);
  for (size_t i = 0; i < 12; i++)
    for (size_t c = 0; c < 3; c++)
      assert_int_equal(px[3 * i + c], (uint8_t)((3 * i + (2 - c)) * 7 + 1));
  /* A 2-D float tensor is no picture: its job fails naming the frame. */
  const int64_t flat[2] = {3, 4};
  push(h, 2, 0, tensor_msg(h, 0, "frame", SPN_DTYPE_F32, 2, flat));
  run(h);
  expect_failure(h, 2, "frame 0: not (H,W,3) u8 nor (3,H,W) f32");
  spn_harness_free(&h);
  expect_refused(p, "convert", "pixel_format = \"cmyk\"", "cmyk");
}

/* ---- lipsync --------------------------------------------------------------------- */

static void melspec_cuts_a_wav_into_mel_chunks(void **state) {
  (void)state;
  char p[512], set[600];
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  spn_harness_t *h =
      open_kind(plugin_in("SPINDLE_LIPSYNC_STAGE_DIR", "melspec", p, sizeof p), "melspec", "fps = 25.0");
  if (!h || !root)
    skip();
  spn_error_t err = SPN_ERROR_INIT;
  snprintf(set, sizeof set, "path=%s/samples/media/speech.wav", root);
  assert_int_equal(spn_harness_job_set(h, 1, set, &err), SPN_OK);
  run(h);
  expect_ok(h, 1);
  size_t n = spn_harness_output_len(h, 1, 0);
  assert_true(n > 0);
  spn_tensor_t t = out_tensor(h, spn_harness_output(h, 1, 0, 0), "mel", NULL);
  assert_int_equal(t.dtype, SPN_DTYPE_F32);
  assert_int_equal(t.shape[t.ndim - 2], 80);
  assert_true(spn_harness_output_eos(h, 1, 0));
  assert_int_equal(spn_harness_job_set(h, 2, "path=/nonexistent/speech.wav", &err), SPN_OK);
  run(h);
  expect_failure(h, 2, "/nonexistent/speech.wav");
  spn_harness_free(&h);
}

/* lipsync: a frame without faces passes untouched even with its mel chunk.
 * Needs a Wav2Lip-shaped model, made here by tests/lipsync/make-w2l-model.py
 * (SPINDLE_HARNESS_W2L_SCRIPT, run by SPINDLE_HARNESS_PYTHON); skipped when
 * that cannot run (no onnx package). */
static void lipsync_leaves_a_frame_without_faces_untouched(void **state) {
  (void)state;
  char p[512], cfg[700], model[256], cmd[1200];
  const char *py = getenv("SPINDLE_HARNESS_PYTHON"), *script = getenv("SPINDLE_HARNESS_W2L_SCRIPT");
  if (!py || !script)
    skip();
  tmp_path(model, sizeof model, "w2l.onnx");
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' >/dev/null 2>&1", py, script, model);
  if (system(cmd) != 0 || access(model, R_OK) != 0)
    skip();
  snprintf(cfg, sizeof cfg, "model = \"%s\"", model);
  spn_harness_t *h = open_kind(plugin_in("SPINDLE_LIPSYNC_STAGE_DIR", "lipsync", p, sizeof p), "lipsync", cfg);
  if (!h)
    skip();
  assert_int_equal(spn_harness_input_count(h), 2);
  push(h, 1, 0, with_faces(h, frame_msg(h, 0, 32, 32, 5), NULL, 0));
  spn_msg_t *mel = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_msg_new(h, 0, &mel, &err), SPN_OK);
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32, t.ndim = 3, t.shape[0] = 1, t.shape[1] = 80, t.shape[2] = 16;
  static float m[80 * 16];
  assert_int_equal(spn_harness_add_tensor(h, mel, "mel", &t, m, &err), SPN_OK);
  push(h, 1, 1, mel);
  run(h);
  expect_ok(h, 1);
  assert_int_equal(spn_harness_output_len(h, 1, 0), 1);
  const uint8_t *px;
  out_tensor(h, spn_harness_output(h, 1, 0, 0), "frame", &px);
  for (size_t b = 0; b < 32 * 32 * 3; b++)
    assert_int_equal(px[b], (uint8_t)(b * 7 + 5));
  /* A mel chunk of the wrong shape fails its job, naming the input. */
  push(h, 2, 0, with_faces(h, frame_msg(h, 0, 32, 32, 5), NULL, 0));
  const int64_t bad[2] = {80, 15};
  push(h, 2, 1, tensor_msg(h, 0, "mel", SPN_DTYPE_F32, 2, bad));
  run(h);
  expect_failure(h, 2, "item \"mel\" must be an (80,16) or (1,80,16) f32 tensor");
  spn_harness_free(&h);
  unlink(model);
}

/* ---- coverage -------------------------------------------------------------------- */

/* The kinds the tests above drive. A kind registered by a built-in plugin
 * and missing here fails the next test: a new stage comes with its test. */
static const char *const k_tested_kinds[] = {"synth",   "passthrough", "tee",        "cost",   "check",
                                             "filesink", "superres",   "facedetect", "metasink", "decode",
                                             "encode",  "encode_av",   "convert",    "melspec", "lipsync"};

static void every_built_in_kind_is_driven_here(void **state) {
  (void)state;
  static const char *const envs[] = {"SPINDLE_UTIL_STAGE_DIR", "SPINDLE_VISION_STAGE_DIR", "SPINDLE_MEDIA_STAGE_DIR",
                                     "SPINDLE_LIPSYNC_STAGE_DIR"};
  spn_runtime_opts_t ro = SPN_RUNTIME_OPTS_INIT;
  ro.log_level = SPN_LOG_ERROR;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_runtime_new(&ro, &rt, &err), SPN_OK);
  int plugins = 0;
  for (size_t e = 0; e < sizeof envs / sizeof *envs; e++) {
    const char *dir = getenv(envs[e]);
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
      size_t n = strlen(de->d_name);
      if (strncmp(de->d_name, "libspindle-", 11) || n < 4 || strcmp(de->d_name + n - 3, ".so"))
        continue;
      char path[1024];
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      if (spn_runtime_load_plugin(rt, path, &err) != SPN_OK)
        fail_msg("%s: %s", path, err.msg);
      plugins++;
    }
    if (d)
      closedir(d);
  }
  if (!plugins) {
    spn_runtime_free(&rt);
    skip();
  }
  size_t kinds = 0;
  for (size_t i = 0; i < spn_runtime_kind_count(rt); i++) {
    const char *file = NULL;
    const spn_stage_kind_t *k = spn_runtime_kind_at(rt, i, &file);
    if (!file)
      continue; /* the runtime's own */
    bool found = false;
    for (size_t t = 0; t < sizeof k_tested_kinds / sizeof *k_tested_kinds; t++)
      found |= !strcmp(k->name, k_tested_kinds[t]);
    if (!found)
      fail_msg("kind \"%s\" of %s has no harness test in test-harness.c", k->name, file);
    kinds++;
  }
  assert_true(kinds >= (size_t)plugins);
  spn_runtime_free(&rt);
}

/* ---- transfer accounting (host->buffer_copy) ------------------------------------ */

/* The test stage `upload` (tests/runtime/xfer) on emulated device cpu:1
 * copies each 72-byte frame into device memory (host to device), 16 bytes of
 * it back (device to host) and 8 bytes host to host for no job. The
 * collector sits on cpu:0 and takes device memory, so the runtime adds one
 * peer copy (device to device) per frame on the edge out of the stage. Two
 * jobs batched together must each get exactly their own frames' bytes; the
 * job-less copies count for the stage only. */
static void upload_counts_its_copies_per_stage_and_per_job(void **state) {
  (void)state;
  const char *plugin = getenv("SPINDLE_XFER_PLUGIN");
  if (!plugin || !*plugin)
    skip();
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = plugin;
  o.kind = "upload";
  o.devices = "cpu:2";
  o.config = "device = \"cpu:1\"\nback = 16\nuntagged = 8\nbatching = { max_batch = 4, max_delay_ms = 20 }";
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_new(&o, &h, &err) != SPN_OK)
    fail_msg("harness for upload: %s", err.msg);
  const uint64_t frames[3] = {0, 5, 3}; /* jobs 1 and 2 */
  for (uint64_t s = 0; s < 5; s++) {
    push(h, 1, 0, frame_msg(h, s, 4, 6, (uint8_t)s));
    if (s < frames[2])
      push(h, 2, 0, frame_msg(h, s, 4, 6, (uint8_t)(100 + s)));
  }
  spn_transfer_stats_t st;
  assert_int_equal(spn_harness_job_transfers(h, 1, &st, &err), SPN_ENOENT); /* not run yet */
  run(h);
  for (uint64_t j = 1; j <= 2; j++) {
    expect_ok(h, j);
    assert_int_equal(spn_harness_output_len(h, j, 0), frames[j]);
    assert_int_equal(spn_harness_job_transfers(h, j, &st, &err), SPN_OK);
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.copies[SPN_COPY_H2D], frames[j]);
    assert_int_equal(st.bytes[SPN_COPY_H2D], frames[j] * 72);
    assert_int_equal(st.copies[SPN_COPY_D2H], frames[j]);
    assert_int_equal(st.bytes[SPN_COPY_D2H], frames[j] * 16);
    assert_int_equal(st.copies[SPN_COPY_D2D], frames[j]); /* the edge to the collector on cpu:0 */
    assert_int_equal(st.bytes[SPN_COPY_D2D], frames[j] * 72);
    assert_int_equal(st.copies[SPN_COPY_H2H], 0); /* untagged: not the job's */
    assert_int_equal(st.bytes[SPN_COPY_H2H], 0);
  }
  /* The stage: its own copies only (not the edge's peer copies), with the
   * job-less ones, and the refused over-long copies counted nowhere. */
  assert_int_equal(spn_harness_stage_transfers(h, &st, &err), SPN_OK);
  assert_int_equal(st.copies[SPN_COPY_H2D], 8);
  assert_int_equal(st.bytes[SPN_COPY_H2D], 8 * 72);
  assert_int_equal(st.bytes[SPN_COPY_D2H], 8 * 16);
  assert_int_equal(st.copies[SPN_COPY_D2D], 0);
  assert_int_equal(st.copies[SPN_COPY_H2H], 8);
  assert_int_equal(st.bytes[SPN_COPY_H2H], 8 * 8);
  /* A second run adds to the stage's figures; each job's are that run's. */
  push(h, 2, 0, frame_msg(h, 0, 4, 6, 7));
  run(h);
  assert_int_equal(spn_harness_job_transfers(h, 2, &st, &err), SPN_OK);
  assert_int_equal(st.bytes[SPN_COPY_H2D], 72);
  assert_int_equal(spn_harness_job_transfers(h, 1, &st, &err), SPN_OK); /* ran with nothing pushed */
  assert_int_equal(st.bytes[SPN_COPY_H2D] + st.bytes[SPN_COPY_D2H] + st.bytes[SPN_COPY_D2D], 0);
  assert_int_equal(spn_harness_stage_transfers(h, &st, &err), SPN_OK);
  assert_int_equal(st.bytes[SPN_COPY_H2D], 9 * 72);
  spn_harness_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(invert_maps_every_frame_and_fails_only_the_bad_job),
      cmocka_unit_test(invert_writes_a_new_buffer_and_leaves_the_input_untouched),
      cmocka_unit_test(harness_refuses_an_unknown_kind_and_a_bad_config),
      cmocka_unit_test(synth_generates_the_frames_a_job_asks_for),
      cmocka_unit_test(passthrough_forwards_the_same_buffers),
      cmocka_unit_test(tee_sends_every_message_to_both_ports),
      cmocka_unit_test(cost_forwards_after_its_delay),
      cmocka_unit_test(check_fails_a_job_that_ends_short),
      cmocka_unit_test(check_holds_a_job_to_its_envelope_total),
      cmocka_unit_test(check_verifies_the_pattern_and_the_order),
      cmocka_unit_test(filesink_writes_each_jobs_frames),
      cmocka_unit_test(sinks_take_a_dropped_frame_as_no_gap),
      cmocka_unit_test(superres_doubles_the_frame_and_its_face_boxes),
      cmocka_unit_test(facedetect_finds_no_face_on_a_flat_frame),
      cmocka_unit_test(metasink_writes_the_faces_it_sees),
      cmocka_unit_test(decode_emits_frames_of_the_sample_clip),
      cmocka_unit_test(encode_writes_a_playable_file),
      cmocka_unit_test(encode_av_muxes_its_audio_input),
      cmocka_unit_test(convert_swaps_rgb_into_bgr),
      cmocka_unit_test(melspec_cuts_a_wav_into_mel_chunks),
      cmocka_unit_test(lipsync_leaves_a_frame_without_faces_untouched),
      cmocka_unit_test(upload_counts_its_copies_per_stage_and_per_job),
      cmocka_unit_test(every_built_in_kind_is_driven_here),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
