/* test-stages.c — the utility stages (and the SDK example) driven through a
 * small fake host: real plugin files loaded by the real loader, callbacks
 * called the way the runtime calls them, every emitted message captured and
 * checked. This tests the stages' own logic independently of the runtime's
 * scheduling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "spec-internal.h"

/* ---- the fake host ------------------------------------------------------- */

struct spn_buffer {
  int refs;
  size_t size;
  unsigned char *data;
};

typedef struct fake_item {
  int32_t kind;
  char name[32];
  spn_tensor_t t;
  spn_buffer_t *buf;
  void *meta;
  size_t meta_size;
} fake_item_t;

struct spn_msg {
  spn_envelope_t env;
  size_t n;
  fake_item_t items[4];
};

#define MAX_OUT 256
struct spn_stage {
  spn_stage_head_t head; /* first, as plugin.h says: spn_stage_host reads it */
  const char *name;
  spn_msg_t *out[MAX_OUT];
  uint32_t out_port[MAX_OUT];
  size_t n_out;
  int fails;
  uint64_t fail_job;
  int32_t fail_status;
  char fail_msg[512];
  int64_t progress_done, progress_total;
};

static void buf_unref(spn_buffer_t **b) {
  if (!b || !*b)
    return;
  if (--(*b)->refs == 0) {
    free((*b)->data);
    free(*b);
  }
  *b = NULL;
}

static void f_msg_free(spn_msg_t **m) {
  if (!m || !*m)
    return;
  for (size_t i = 0; i < (*m)->n; i++) {
    buf_unref(&(*m)->items[i].buf);
    free((*m)->items[i].meta);
  }
  free(*m);
  *m = NULL;
}

static const char *f_stage_get_name(spn_stage_t *s) { return s->name; }
static bool f_job_cancelled(spn_stage_t *s, uint64_t job) { return false; }
static void f_log(spn_stage_t *s, uint64_t job, int32_t level, const char *fmt, ...) {}
static void f_progress(spn_stage_t *s, uint64_t job, int64_t done, int64_t total) {
  s->progress_done = done;
  s->progress_total = total;
}
static void f_fail_job(spn_stage_t *s, uint64_t job, int32_t status, const char *msg) {
  s->fails++;
  s->fail_job = job;
  s->fail_status = status;
  snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
}
static int32_t f_buffer_new(spn_stage_t *s, size_t size, spn_buffer_t **out, spn_error_t *err) {
  spn_buffer_t *b = calloc(1, sizeof *b);
  b->refs = 1;
  b->size = size;
  b->data = malloc(size ? size : 1);
  *out = b;
  return SPN_OK;
}
static void *f_buffer_data(spn_buffer_t *b) { return b->data; }
static size_t f_buffer_size(const spn_buffer_t *b) { return b->size; }
static spn_buffer_t *f_buffer_ref(spn_buffer_t *b) {
  b->refs++;
  return b;
}
static int32_t f_msg_new(spn_stage_t *s, const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err) {
  spn_msg_t *m = calloc(1, sizeof *m);
  m->env = *env;
  *out = m;
  return SPN_OK;
}
static int32_t f_msg_new_from(spn_stage_t *s, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  return f_msg_new(s, &from->env, out, err);
}
static const spn_envelope_t *f_msg_envelope(const spn_msg_t *m) { return &m->env; }
static size_t f_msg_item_count(const spn_msg_t *m) { return m->n; }
static int32_t f_msg_item(const spn_msg_t *m, size_t i, spn_item_t *it) {
  if (i >= m->n)
    return SPN_EINVAL;
  it->kind = m->items[i].kind;
  it->name = m->items[i].name;
  it->tensor = m->items[i].t;
  it->buffer = m->items[i].buf;
  it->meta = m->items[i].meta;
  it->meta_size = m->items[i].meta_size;
  return SPN_OK;
}
static int64_t f_msg_find(const spn_msg_t *m, const char *name) {
  for (size_t i = 0; i < m->n; i++)
    if (!strcmp(m->items[i].name, name))
      return (int64_t)i;
  return -1;
}
static int32_t f_msg_add_tensor(spn_msg_t *m, const char *name, const spn_tensor_t *t, spn_buffer_t *b,
                                spn_error_t *err) {
  assert_true(m->n < 4);
  fake_item_t *it = &m->items[m->n++];
  it->kind = SPN_ITEM_TENSOR;
  snprintf(it->name, sizeof it->name, "%s", name);
  it->t = *t;
  it->buf = f_buffer_ref(b);
  return SPN_OK;
}
static int32_t f_msg_add_meta(spn_msg_t *m, const char *name, const void *data, size_t size, spn_error_t *err) {
  assert_true(m->n < 4);
  fake_item_t *it = &m->items[m->n++];
  it->kind = SPN_ITEM_META;
  snprintf(it->name, sizeof it->name, "%s", name);
  it->meta = malloc(size ? size : 1);
  memcpy(it->meta, data, size);
  it->meta_size = size;
  return SPN_OK;
}
static int32_t f_msg_clone(spn_stage_t *s, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  spn_msg_t *m = calloc(1, sizeof *m);
  *m = *from;
  for (size_t i = 0; i < m->n; i++) {
    if (m->items[i].buf)
      f_buffer_ref(m->items[i].buf);
    if (m->items[i].meta) {
      m->items[i].meta = malloc(from->items[i].meta_size ? from->items[i].meta_size : 1);
      memcpy(m->items[i].meta, from->items[i].meta, from->items[i].meta_size);
    }
  }
  *out = m;
  return SPN_OK;
}
static int32_t f_msg_replace_tensor(spn_msg_t *m, size_t i, const spn_tensor_t *t, spn_buffer_t *b,
                                    spn_error_t *err) {
  assert_true(i < m->n && m->items[i].kind == SPN_ITEM_TENSOR);
  spn_buffer_t *old = m->items[i].buf;
  m->items[i].buf = f_buffer_ref(b);
  buf_unref(&old);
  m->items[i].t = *t;
  m->items[i].t.data = NULL;
  return SPN_OK;
}
static int32_t f_emit(spn_stage_t *s, uint32_t port, spn_msg_t **m, spn_error_t *err) {
  assert_true(s->n_out < MAX_OUT);
  s->out_port[s->n_out] = port;
  s->out[s->n_out++] = *m;
  *m = NULL;
  return SPN_OK;
}

static const spn_host_api_t fake_host = {
    .struct_size = sizeof(spn_host_api_t),
    .abi_major = SPN_PLUGIN_ABI_MAJOR,
    .abi_minor = SPN_PLUGIN_ABI_MINOR,
    .register_kind = spn__plugin_register_kind,
    .plugin_set_data = spn__plugin_set_data,
    .stage_get_name = f_stage_get_name,
    .log = f_log,
    .progress = f_progress,
    .fail_job = f_fail_job,
    .job_cancelled = f_job_cancelled,
    .buffer_new = f_buffer_new,
    .buffer_data = f_buffer_data,
    .buffer_size = f_buffer_size,
    .buffer_ref = f_buffer_ref,
    .buffer_unref = buf_unref,
    .msg_new = f_msg_new,
    .msg_new_from = f_msg_new_from,
    .msg_free = f_msg_free,
    .msg_envelope = f_msg_envelope,
    .msg_item_count = f_msg_item_count,
    .msg_item = f_msg_item,
    .msg_find = f_msg_find,
    .msg_add_tensor = f_msg_add_tensor,
    .msg_add_meta = f_msg_add_meta,
    .emit = f_emit,
    .msg_clone = f_msg_clone,
    .msg_replace_tensor = f_msg_replace_tensor,
};
#define FAKE_STAGE(...) {.head = {.struct_size = sizeof(spn_stage_head_t), .host = &fake_host}, __VA_ARGS__}

static void stage_reset(spn_stage_t *s) {
  for (size_t i = 0; i < s->n_out; i++)
    f_msg_free(&s->out[i]);
  const char *name = s->name;
  spn_stage_head_t head = s->head;
  memset(s, 0, sizeof *s);
  s->name = name;
  s->head = head;
}

/* ---- fixtures -------------------------------------------------------------- */

typedef struct fixture {
  spn__registry_t *reg;
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  if (spn__registry_new(&f->reg, NULL) != SPN_OK)
    return -1;
  const char *dir = getenv("SPINDLE_UTIL_STAGE_DIR");
  const char *example = getenv("SPINDLE_EXAMPLE_PLUGIN");
  if (!dir || !example)
    return -1;
  const char *names[] = {"synth", "passthrough", "tee", "check", "cost", "filesink"};
  for (size_t i = 0; i < 6; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/libspindle-%s.so", dir, names[i]);
    spn_error_t err = SPN_ERROR_INIT;
    if (spn__registry_load_file(f->reg, &fake_host, path, &err) != SPN_OK) {
      print_error("%s\n", err.msg);
      return -1;
    }
  }
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__registry_load_file(f->reg, &fake_host, example, &err) != SPN_OK) {
    print_error("%s\n", err.msg);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  spn__registry_free(&f->reg);
  free(f);
  return 0;
}

typedef struct built {
  spn__pipeline_spec_t *spec;
  const spn__stage_spec_t *x; /* the stage under test */
} built_t;

/* Stage "x" of `kind` (fed by a synth when it has inputs) with --set style
 * overrides for x. */
static built_t build_stage(fixture_t *f, const char *kind, const char *const *sets, size_t n) {
  char toml[512];
  const spn_stage_kind_t *k = spn__registry_find(f->reg, kind, NULL);
  assert_non_null(k);
  snprintf(toml, sizeof toml, "[[stage]]\nname = \"x\"\nkind = \"%s\"\n%s", kind,
           k->n_inputs ? "inputs = [\"feed\"]\n[[stage]]\nname = \"feed\"\nkind = \"synth\"\n" : "");
  spn_toml_doc_t *doc = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_toml_parse(toml, strlen(toml), "t.toml", &doc, &err), SPN_OK);
  built_t b = {0};
  if (spn__spec_from_toml(f->reg, doc, sets, n, &b.spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  spn_toml_doc_free(&doc);
  for (size_t i = 0; i < b.spec->n_stages; i++)
    if (!strcmp(b.spec->stages[i].name, "x"))
      b.x = &b.spec->stages[i];
  return b;
}

/* Run a source for one job until EOS; messages land in stage->out. */
static void run_source(const spn__stage_spec_t *x, spn_stage_t *stage, uint64_t job_id) {
  const spn_stage_kind_t *k = x->kind;
  void *st = NULL, *js = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(k->create ? k->create(stage, x->config, &st, &err) : SPN_OK, SPN_OK);
  spn_job_info_t job = {.struct_size = sizeof job, .job_id = job_id, .config = x->config};
  assert_int_equal(k->job_open ? k->job_open(stage, st, &job, &js, &err) : SPN_OK, SPN_OK);
  int32_t rc;
  int guard = 0;
  while ((rc = k->generate(stage, st, js, &err)) == SPN_OK)
    assert_true(++guard < 100000);
  assert_int_equal(rc, SPN_EOS);
  if (k->job_close)
    k->job_close(stage, st, js, true);
  if (k->destroy)
    k->destroy(stage, st);
}

/* ---- synth --------------------------------------------------------------- */

static void synth_emits_dense_frames_with_the_pattern(void **state) {
  fixture_t *f = *state;
  const char *sets[] = {"x.frames=5", "x.width=4", "x.height=3", "x.fps=10"};
  built_t b = build_stage(f, "synth", sets, 4);
  spn_stage_t stage = FAKE_STAGE(.name = "x");
  run_source(b.x, &stage, 5);
  assert_int_equal(stage.n_out, 5);
  for (size_t i = 0; i < 5; i++) {
    spn_msg_t *m = stage.out[i];
    assert_int_equal(stage.out_port[i], 0);
    assert_int_equal(m->env.job_id, 5);
    assert_int_equal(m->env.seq, i);
    assert_int_equal(m->env.total, 5);
    assert_true(m->env.pts == (double)i / 10.0);
    assert_int_equal(m->n, 1);
    assert_string_equal(m->items[0].name, "frame");
    assert_int_equal(m->items[0].t.dtype, SPN_DTYPE_U8);
    assert_int_equal(m->items[0].t.ndim, 3);
    assert_int_equal(m->items[0].t.shape[0], 3);
    assert_int_equal(m->items[0].t.shape[1], 4);
    assert_int_equal(m->items[0].t.shape[2], 3);
    assert_int_equal(m->items[0].buf->size, 36);
    assert_int_equal(m->items[0].buf->refs, 1); /* synth dropped its own reference */
  }
  /* job 5, seq 2, pixel (x=1, y=0), channel 2: v = 5*131 + 2*7 + 0*3 + 1 +
   * 2*85 = 840; 840 ^ (840 >> 8) = 843; low byte 75. Index (0*4 + 1)*3 + 2. */
  assert_int_equal(stage.out[2]->items[0].buf->data[5], 75);
  /* job 5, seq 0, pixel (0,0), channel 0: v = 655; 655 ^ 2 = 653; low byte 141. */
  assert_int_equal(stage.out[0]->items[0].buf->data[0], 141);
  assert_int_equal(stage.progress_done, 5);
  assert_int_equal(stage.progress_total, 5);
  /* another job gives other bytes */
  spn_stage_t other = FAKE_STAGE(.name = "x");
  run_source(b.x, &other, 6);
  assert_memory_not_equal(other.out[0]->items[0].buf->data, stage.out[0]->items[0].buf->data, 36);
  stage_reset(&stage);
  stage_reset(&other);
  spn__spec_free(&b.spec);
}

static void synth_with_zero_frames_ends_at_once(void **state) {
  const char *sets[] = {"x.frames=0"};
  built_t b = build_stage(*state, "synth", sets, 1);
  spn_stage_t stage = FAKE_STAGE(.name = "x");
  run_source(b.x, &stage, 1);
  assert_int_equal(stage.n_out, 0);
  spn__spec_free(&b.spec);
}

static void synth_refuses_an_unknown_format(void **state) {
  const char *sets[] = {"x.format=yuv9"};
  built_t b = build_stage(*state, "synth", sets, 1);
  spn_stage_t stage = FAKE_STAGE(.name = "x");
  void *st = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(b.x->kind->create(&stage, b.x->config, &st, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "stage \"x\": format \"yuv9\""));
  spn__spec_free(&b.spec);
}

/* ---- check ----------------------------------------------------------------- */

typedef struct sink_run {
  const spn__stage_spec_t *x;
  spn_stage_t stage;
  void *st, *js;
} sink_run_t;

static void sink_open(sink_run_t *r, const spn__stage_spec_t *x, uint64_t job_id) {
  memset(r, 0, sizeof *r);
  r->x = x;
  r->stage = (spn_stage_t)FAKE_STAGE(.name = "x");
  spn_error_t err = SPN_ERROR_INIT;
  if (x->kind->create)
    assert_int_equal(x->kind->create(&r->stage, x->config, &r->st, &err), SPN_OK);
  spn_job_info_t job = {.struct_size = sizeof job, .job_id = job_id, .config = x->config};
  if (x->kind->job_open)
    assert_int_equal(x->kind->job_open(&r->stage, r->st, &job, &r->js, &err), SPN_OK);
}

static void sink_feed(sink_run_t *r, spn_msg_t *m) {
  spn_error_t err = SPN_ERROR_INIT;
  void *js[1] = {r->js};
  spn_msg_t *batch[1] = {m};
  assert_int_equal(r->x->kind->process(&r->stage, r->st, batch, js, 1, &err), SPN_OK);
  f_msg_free(&batch[0]); /* the host frees what the stage did not forward */
}

static void sink_flush(sink_run_t *r) {
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(r->x->kind->flush ? r->x->kind->flush(&r->stage, r->st, r->js, &err) : SPN_OK, SPN_OK);
}

static void sink_close(sink_run_t *r) {
  if (r->x->kind->job_close)
    r->x->kind->job_close(&r->stage, r->st, r->js, r->stage.fails == 0);
  if (r->x->kind->destroy)
    r->x->kind->destroy(&r->stage, r->st);
  stage_reset(&r->stage);
}

/* n synth frames for job `job`, in stage->out. */
static void make_frames(fixture_t *f, spn_stage_t *src, uint64_t job, int n) {
  char frames[32];
  snprintf(frames, sizeof frames, "x.frames=%d", n);
  const char *sets[] = {frames, "x.width=8", "x.height=2"};
  built_t b = build_stage(f, "synth", sets, 3);
  src->name = "x";
  run_source(b.x, src, job);
  spn__spec_free(&b.spec);
}

static void check_accepts_a_good_stream(void **state) {
  const char *sets[] = {"x.verify_pattern=true", "x.expect_frames=6"};
  built_t b = build_stage(*state, "check", sets, 2);
  spn_stage_t src = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 9, 6);
  sink_run_t r;
  sink_open(&r, b.x, 9);
  for (size_t i = 0; i < src.n_out; i++) {
    sink_feed(&r, src.out[i]);
    src.out[i] = NULL;
  }
  assert_int_equal(r.stage.progress_done, 6);
  sink_flush(&r);
  assert_int_equal(r.stage.fails, 0);
  sink_close(&r);
  src.n_out = 0;
  spn__spec_free(&b.spec);
}

/* Feed frames in `order` (indexes into 0..n-1), then flush; returns the
 * failure message ("" when none). */
static void check_case(fixture_t *f, const char *const *sets, size_t n_sets, int n, const int *order, size_t n_order,
                       void (*tamper)(spn_msg_t *), char *msg, size_t size) {
  built_t b = build_stage(f, "check", sets, n_sets);
  spn_stage_t src = FAKE_STAGE(.name = NULL);
  make_frames(f, &src, 3, n);
  sink_run_t r;
  sink_open(&r, b.x, 3);
  for (size_t i = 0; i < n_order; i++) {
    /* A copy sharing the buffer, so a seq can be fed twice. */
    spn_msg_t *orig = src.out[order[i]], *m = NULL;
    f_msg_new(&r.stage, &orig->env, &m, NULL);
    f_msg_add_tensor(m, orig->items[0].name, &orig->items[0].t, orig->items[0].buf, NULL);
    if (tamper && i == n_order - 1)
      tamper(m);
    sink_feed(&r, m);
  }
  sink_flush(&r);
  snprintf(msg, size, "%s", r.stage.fails ? r.stage.fail_msg : "");
  assert_true(r.stage.fails <= 1); /* one failure per job, not one per message */
  if (r.stage.fails)
    assert_int_equal(r.stage.fail_job, 3);
  sink_close(&r);
  stage_reset(&src);
  spn__spec_free(&b.spec);
}

/* ---- filesink -------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return NULL;
  char *d = malloc(1 << 16);
  *len = fread(d, 1, 1 << 16, fp);
  fclose(fp);
  return d;
}

/* Feed n synth frames in `order` to a filesink writing to dir/out.raw;
 * returns its failure count. */
static int filesink_case(fixture_t *f, const char *dir, int n, const int *order, size_t n_order, bool ok_close,
                         char *expect, size_t *expect_len) {
  char set[600];
  snprintf(set, sizeof set, "x.path=\"%s/out.raw\"", dir);
  const char *sets[] = {set};
  built_t b = build_stage(f, "filesink", sets, 1);
  spn_stage_t src = FAKE_STAGE(.name = NULL);
  make_frames(f, &src, 5, n);
  sink_run_t r;
  sink_open(&r, b.x, 5);
  *expect_len = 0;
  for (size_t i = 0; i < n_order; i++) {
    spn_msg_t *m = src.out[order[i]];
    size_t nb = spn_tensor_nbytes(&m->items[0].t);
    memcpy(expect + *expect_len, m->items[0].buf->data, nb);
    *expect_len += nb;
    sink_feed(&r, m);
    src.out[order[i]] = NULL;
  }
  assert_int_equal(r.stage.progress_done, r.stage.fails ? r.stage.progress_done : (int64_t)n_order);
  sink_flush(&r);
  int fails = r.stage.fails;
  if (fails)
    assert_non_null(strstr(r.stage.fail_msg, "out.raw"));
  if (r.x->kind->job_close)
    r.x->kind->job_close(&r.stage, r.st, r.js, ok_close && fails == 0);
  stage_reset(&r.stage);
  stage_reset(&src);
  spn__spec_free(&b.spec);
  return fails;
}

static void filesink_writes_frames_in_order_and_removes_failures(void **state) {
  char dir[] = "/tmp/spn-filesink-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[600], expect[1 << 16];
  snprintf(path, sizeof path, "%s/out.raw", dir);
  size_t elen = 0, len = 0;
  const int in_order[] = {0, 1, 2, 3};
  assert_int_equal(filesink_case(*state, dir, 4, in_order, 4, true, expect, &elen), 0);
  char *got = read_all(path, &len);
  assert_non_null(got);
  assert_int_equal(len, 4 * 8 * 2 * 3);
  assert_int_equal(len, elen);
  assert_memory_equal(got, expect, len);
  free(got);
  /* a gap fails the job (naming the file) and leaves no file */
  const int gap[] = {0, 2};
  assert_int_equal(filesink_case(*state, dir, 4, gap, 2, true, expect, &elen), 1);
  assert_null(read_all(path, &len));
  /* a job the host ends as failed or cancelled leaves no file either */
  assert_int_equal(filesink_case(*state, dir, 4, in_order, 4, false, expect, &elen), 0);
  assert_null(read_all(path, &len));
  /* without a path nothing is written and the job succeeds */
  built_t b = build_stage(*state, "filesink", NULL, 0);
  spn_stage_t src = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 5, 2);
  sink_run_t r;
  sink_open(&r, b.x, 5);
  for (size_t i = 0; i < src.n_out; i++) {
    sink_feed(&r, src.out[i]);
    src.out[i] = NULL;
  }
  sink_flush(&r);
  assert_int_equal(r.stage.fails, 0);
  sink_close(&r);
  src.n_out = 0;
  spn__spec_free(&b.spec);
  assert_int_equal(rmdir(dir), 0); /* empty: nothing else was left */
}

static void flip_a_byte(spn_msg_t *m) { m->items[0].buf->data[7] ^= 1; }
static void add_skip(spn_msg_t *m) { m->env.flags |= SPN_MSG_SKIP; }

static void check_catches_every_violation(void **state) {
  char msg[512];
  const char *none[] = {"x.expect_frames=-1"};
  /* a gap */
  check_case(*state, none, 1, 4, (int[]){0, 1, 3}, 3, NULL, msg, sizeof msg);
  assert_non_null(strstr(msg, "job 3: expected seq 2, got 3 (gap)"));
  /* a repeat */
  check_case(*state, none, 1, 4, (int[]){0, 1, 1}, 3, NULL, msg, sizeof msg);
  assert_non_null(strstr(msg, "expected seq 2, got 1 (repeated or out of order)"));
  /* stream ends early: the envelope said 4 */
  check_case(*state, none, 1, 4, (int[]){0, 1, 2}, 3, NULL, msg, sizeof msg);
  assert_non_null(strstr(msg, "end of stream after 3 messages, the envelope's total is 4"));
  /* expected count from the config */
  const char *five[] = {"x.expect_frames=5"};
  check_case(*state, five, 1, 4, (int[]){0, 1, 2, 3}, 4, NULL, msg, sizeof msg);
  assert_non_null(strstr(msg, "end of stream after 4 frames, expected 5"));
  /* a skipped frame keeps seq dense but is not a frame */
  const char *four[] = {"x.expect_frames=4"};
  check_case(*state, four, 1, 4, (int[]){0, 1, 2, 3}, 4, add_skip, msg, sizeof msg);
  assert_non_null(strstr(msg, "after 3 frames, expected 4"));
  /* a corrupted byte */
  const char *verify[] = {"x.verify_pattern=true"};
  check_case(*state, verify, 1, 3, (int[]){0, 1, 2}, 3, flip_a_byte, msg, sizeof msg);
  assert_non_null(strstr(msg, "seq 2: frame byte 7 differs from the synth pattern"));
  /* all good */
  check_case(*state, verify, 1, 3, (int[]){0, 1, 2}, 3, NULL, msg, sizeof msg);
  assert_string_equal(msg, "");
}

static void check_eos_as_a_message(void **state) {
  /* End of stream may also arrive as an EOS message; a frame after it is a
   * violation. */
  built_t b = build_stage(*state, "check", NULL, 0);
  sink_run_t r;
  sink_open(&r, b.x, 1);
  spn_msg_t *eos = NULL;
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_EOS, .job_id = 1, .total = -1};
  f_msg_new(&r.stage, &env, &eos, NULL);
  sink_feed(&r, eos); /* EOS as a message: an empty stream is fine */
  assert_int_equal(r.stage.fails, 0);
  spn_msg_t *late = NULL;
  env.flags = 0;
  f_msg_new(&r.stage, &env, &late, NULL);
  sink_feed(&r, late);
  assert_int_equal(r.stage.fails, 1);
  assert_non_null(strstr(r.stage.fail_msg, "seq 0 arrived after end of stream"));
  sink_close(&r);
  spn__spec_free(&b.spec);
}

/* ---- filters ------------------------------------------------------------- */

static void run_filter(fixture_t *f, const char *kind, const char *const *sets, size_t n_sets, spn_stage_t *src,
                       spn_stage_t *out) {
  built_t b = build_stage(f, kind, sets, n_sets);
  sink_run_t r;
  sink_open(&r, b.x, 3);
  for (size_t i = 0; i < src->n_out; i++) {
    void *js[1] = {r.js};
    spn_msg_t *batch[1] = {src->out[i]};
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(b.x->kind->process(&r.stage, r.st, batch, js, 1, &err), SPN_OK);
    f_msg_free(&batch[0]);
    src->out[i] = NULL;
  }
  src->n_out = 0;
  *out = r.stage;
  r.stage.n_out = 0; /* moved to *out */
  sink_close(&r);
  spn__spec_free(&b.spec);
}

static void passthrough_forwards_the_same_message(void **state) {
  spn_stage_t src = FAKE_STAGE(.name = NULL), out = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 3, 3);
  spn_msg_t *first = src.out[0];
  run_filter(*state, "passthrough", NULL, 0, &src, &out);
  assert_int_equal(out.n_out, 3);
  assert_ptr_equal(out.out[0], first);
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(out.out[i]->env.seq, i);
  stage_reset(&out);
}

static void tee_sends_to_both_ports_sharing_buffers(void **state) {
  spn_stage_t src = FAKE_STAGE(.name = NULL), out = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 3, 2);
  spn_msg_t *orig0 = src.out[0];
  spn_buffer_t *buf0 = orig0->items[0].buf;
  /* a meta item travels too (copied) */
  f_msg_add_meta(orig0, "faces", "abc", 3, NULL);
  run_filter(*state, "tee", NULL, 0, &src, &out);
  assert_int_equal(out.n_out, 4);
  assert_int_equal(out.out_port[0], 0);
  assert_int_equal(out.out_port[1], 1);
  assert_ptr_equal(out.out[1], orig0); /* original on the last port */
  spn_msg_t *copy = out.out[0];
  assert_ptr_not_equal(copy, orig0);
  assert_int_equal(copy->env.seq, 0);
  assert_int_equal(copy->n, 2);
  assert_ptr_equal(copy->items[0].buf, buf0); /* shared, not copied */
  assert_int_equal(buf0->refs, 2);
  assert_int_equal(copy->items[1].kind, SPN_ITEM_META);
  assert_memory_equal(copy->items[1].meta, "abc", 3);
  assert_int_equal(out.out[2]->env.seq, 1);
  stage_reset(&out);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void cost_burns_at_least_what_it_is_told(void **state) {
  spn_stage_t src = FAKE_STAGE(.name = NULL), out = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 3, 4);
  const char *sets[] = {"x.us=5000"};
  double t0 = now_s();
  run_filter(*state, "cost", sets, 1, &src, &out);
  double dt = now_s() - t0;
  assert_int_equal(out.n_out, 4);
  assert_true(dt >= 4 * 5000e-6); /* a floor, never a ceiling */
  stage_reset(&out);
  make_frames(*state, &src, 3, 2);
  const char *iters[] = {"x.iterations=1000"};
  run_filter(*state, "cost", iters, 1, &src, &out);
  assert_int_equal(out.n_out, 2);
  stage_reset(&out);
}

static void example_invert_inverts_into_a_new_buffer(void **state) {
  spn_stage_t src = FAKE_STAGE(.name = NULL), out = FAKE_STAGE(.name = NULL);
  make_frames(*state, &src, 3, 2);
  spn_buffer_t *in_buf = src.out[1]->items[0].buf;
  f_buffer_ref(in_buf);
  unsigned char before[48];
  memcpy(before, in_buf->data, 48);
  run_filter(*state, "invert", NULL, 0, &src, &out);
  assert_int_equal(out.n_out, 2);
  spn_buffer_t *ob = out.out[1]->items[0].buf;
  assert_ptr_not_equal(ob, in_buf);
  for (size_t i = 0; i < 48; i++)
    assert_int_equal(ob->data[i], 255 - before[i]);
  assert_memory_equal(in_buf->data, before, 48); /* input untouched */
  buf_unref(&in_buf);
  stage_reset(&out);
  /* threshold: bytes below it pass unchanged */
  make_frames(*state, &src, 3, 1);
  memcpy(before, src.out[0]->items[0].buf->data, 48);
  const char *sets[] = {"x.threshold=128"};
  run_filter(*state, "invert", sets, 1, &src, &out);
  for (size_t i = 0; i < 48; i++)
    assert_int_equal(out.out[0]->items[0].buf->data[i], before[i] >= 128 ? 255 - before[i] : before[i]);
  stage_reset(&out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(synth_emits_dense_frames_with_the_pattern),
      cmocka_unit_test(synth_with_zero_frames_ends_at_once),
      cmocka_unit_test(synth_refuses_an_unknown_format),
      cmocka_unit_test(check_accepts_a_good_stream),
      cmocka_unit_test(check_catches_every_violation),
      cmocka_unit_test(check_eos_as_a_message),
      cmocka_unit_test(filesink_writes_frames_in_order_and_removes_failures),
      cmocka_unit_test(passthrough_forwards_the_same_message),
      cmocka_unit_test(tee_sends_to_both_ports_sharing_buffers),
      cmocka_unit_test(cost_burns_at_least_what_it_is_told),
      cmocka_unit_test(example_invert_inverts_into_a_new_buffer),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
