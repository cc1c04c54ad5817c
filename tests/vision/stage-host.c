/* stage-host.c — a minimal stand-in host that loads libspindle-vision.so
 * through its descriptor, exactly as the runtime's loader will, and drives
 * one of its stage kinds: init, create (config filled from the schema's
 * defaults, then KEY=VALUE overrides), job_open, process in batches,
 * job_close, destroy. Used by test-facedetect-stage.py and
 * test-superres-stage.py.
 *
 *   stage-host PLUGIN.so KIND W H BATCH OUTDIR [KEY=VALUE...] -- JOB:FRAME...
 *
 * FRAME is a raw W*H*3 RGB file, or "bad" (a float tensor where a u8 frame
 * belongs), or "eos" (a message without a frame). Prints one JSON line per
 * emitted message ({"job", "seq", "faces": [[x0,y0,x1,y1,score,track], ...]
 * or null, "frame": [h, w] or null, "file": OUTDIR/JOB-SEQ.rgb holding the
 * emitted frame}) and per failed job ({"failed", "status", "msg"}).
 *
 * Its engine stands in for two ONNX models: "fake-sr-x2" applies a 3x3 box
 * blur (zero padding) to each channel and upsamples x2 (nearest) — a local
 * operator of radius 1, enough to see tiling seams; "fake-retinaface" returns
 * RetinaFace outputs with one confident anchor (see fake_retinaface). Checks the
 * descriptor and the registered kind and exits non-zero if anything is off.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"

#define MAX_ITEMS 4
#define MAX_JOBS 8

struct spn_buffer {
  void *data;
  size_t size;
  int refs;
};

typedef struct fitem {
  char name[32];
  int32_t kind;
  spn_tensor_t t;
  spn_buffer_t *buf;
  void *meta;
  size_t meta_size;
} fitem_t;

struct spn_msg {
  spn_envelope_t env;
  int n;
  fitem_t items[MAX_ITEMS];
};

struct spn_stage {
  spn_stage_head_t head; /* first, as plugin.h says: spn_stage_host reads it */
  void *data;
};

struct spn_plugin {
  const spn_stage_kind_t *kinds[8];
  int nkinds;
  void *data;
};

static int failures;
static const char *outdir = ".";

static int32_t h_register_kind(spn_plugin_t *p, const spn_stage_kind_t *k, spn_error_t *err) {
  if (!k || k->struct_size != sizeof(spn_stage_kind_t) || !k->name || !k->process || !k->create || p->nkinds == 8)
    return spn_error_set(err, SPN_EABI, "bad kind");
  p->kinds[p->nkinds++] = k;
  return SPN_OK;
}
static void h_plugin_set_data(spn_plugin_t *p, void *d) { p->data = d; }
static void *h_stage_get_data(spn_stage_t *s) { return s->data; }
static const char *h_stage_get_name(spn_stage_t *s) { (void)s; return "faces"; }
static int32_t h_stage_get_threads(spn_stage_t *s) { (void)s; return 1; }
static void h_log(spn_stage_t *s, uint64_t job, int32_t level, const char *fmt, ...) {
  (void)s; (void)job; (void)level; (void)fmt;
}
static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      putchar('\\');
    if ((unsigned char)*s >= 0x20)
      putchar(*s);
  }
  putchar('"');
}
static void h_fail_job(spn_stage_t *s, uint64_t job, int32_t status, const char *msg) {
  (void)s;
  printf("{\"failed\": %llu, \"status\": %d, \"msg\": ", (unsigned long long)job, status);
  print_json_string(msg);
  printf("}\n");
}
static bool h_job_cancelled(spn_stage_t *s, uint64_t job) { (void)s; (void)job; return false; }

static void buf_unref(spn_buffer_t **b) {
  if (b && *b && --(*b)->refs == 0) {
    free((*b)->data);
    free(*b);
  }
  if (b)
    *b = NULL;
}

static void h_msg_free(spn_msg_t **m) {
  if (!m || !*m)
    return;
  for (int i = 0; i < (*m)->n; i++) {
    buf_unref(&(*m)->items[i].buf);
    free((*m)->items[i].meta);
  }
  free(*m);
  *m = NULL;
}
static const spn_envelope_t *h_msg_envelope(const spn_msg_t *m) { return &m->env; }
static size_t h_msg_item_count(const spn_msg_t *m) { return (size_t)m->n; }
static int32_t h_msg_item(const spn_msg_t *m, size_t i, spn_item_t *it) {
  if (i >= (size_t)m->n || it->struct_size < sizeof *it)
    return SPN_EINVAL;
  const fitem_t *f = &m->items[i];
  it->kind = f->kind;
  it->name = f->name;
  it->tensor = f->t;
  it->buffer = f->buf;
  it->meta = f->meta;
  it->meta_size = f->meta_size;
  return SPN_OK;
}
static int64_t h_msg_find(const spn_msg_t *m, const char *name) {
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->items[i].name, name))
      return i;
  return -1;
}
static int32_t h_msg_add_meta(spn_msg_t *m, const char *name, const void *data, size_t size, spn_error_t *err) {
  if (m->n == MAX_ITEMS)
    return spn_error_set(err, SPN_ETOOBIG, "too many items");
  fitem_t *f = &m->items[m->n];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->kind = SPN_ITEM_META;
  f->meta = malloc(size ? size : 1);
  if (size)
    memcpy(f->meta, data, size);
  f->meta_size = size;
  m->n++;
  return SPN_OK;
}
static int32_t h_emit(spn_stage_t *s, uint32_t port, spn_msg_t **m, spn_error_t *err) {
  (void)s;
  (void)err;
  if (port != 0) {
    printf("{\"error\": \"emit on port %u\"}\n", port);
    failures++;
  }
  spn_msg_t *msg = *m;
  printf("{\"job\": %llu, \"seq\": %llu, \"faces\": ", (unsigned long long)msg->env.job_id,
         (unsigned long long)msg->env.seq);
  int64_t k = h_msg_find(msg, "faces");
  if (k < 0) {
    printf("null");
  } else {
    const fitem_t *f = &msg->items[k];
    const spn_face_t *faces = f->meta;
    size_t n = f->meta_size / sizeof(spn_face_t);
    if (f->meta_size % sizeof(spn_face_t))
      failures++;
    printf("[");
    for (size_t i = 0; i < n; i++)
      printf("%s[%.4f, %.4f, %.4f, %.4f, %.3f, %d, %.4f, %.4f]", i ? ", " : "", faces[i].x0, faces[i].y0,
             faces[i].x1, faces[i].y1, faces[i].score, faces[i].track_id, faces[i].landmarks[0],
             faces[i].landmarks[9]);
    printf("]");
  }
  int64_t fi = h_msg_find(msg, "frame");
  if (fi >= 0 && msg->items[fi].kind == SPN_ITEM_TENSOR && msg->items[fi].t.dtype == SPN_DTYPE_U8) {
    const fitem_t *f = &msg->items[fi];
    char path[512];
    snprintf(path, sizeof path, "%s/%llu-%llu.rgb", outdir, (unsigned long long)msg->env.job_id,
             (unsigned long long)msg->env.seq);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(f->t.data, 1, spn_tensor_nbytes(&f->t), fp) != spn_tensor_nbytes(&f->t))
      failures++;
    if (fp)
      fclose(fp);
    printf(", \"frame\": [%lld, %lld], \"file\": ", (long long)f->t.shape[0], (long long)f->t.shape[1]);
    print_json_string(path);
  } else {
    printf(", \"frame\": null");
  }
  printf(", \"items\": %d}\n", msg->n);
  h_msg_free(m);
  return SPN_OK;
}

static int32_t h_buffer_new(spn_stage_t *s, size_t size, spn_buffer_t **out, spn_error_t *err) {
  (void)s;
  spn_buffer_t *b = calloc(1, sizeof *b);
  if (!b || !(b->data = malloc(size ? size : 1))) {
    free(b);
    return spn_error_set(err, SPN_ENOMEM, "buffer");
  }
  b->size = size;
  b->refs = 1;
  *out = b;
  return SPN_OK;
}
static void *h_buffer_data(spn_buffer_t *b) { return b->data; }
static size_t h_buffer_size(const spn_buffer_t *b) { return b->size; }
static spn_buffer_t *h_buffer_ref(spn_buffer_t *b) {
  b->refs++;
  return b;
}
static int32_t h_msg_new_from(spn_stage_t *s, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  (void)s;
  spn_msg_t *m = calloc(1, sizeof *m);
  if (!m)
    return spn_error_set(err, SPN_ENOMEM, "msg");
  m->env = from->env;
  *out = m;
  return SPN_OK;
}
static int32_t h_msg_add_tensor(spn_msg_t *m, const char *name, const spn_tensor_t *t, spn_buffer_t *buf,
                                spn_error_t *err) {
  if (m->n == MAX_ITEMS)
    return spn_error_set(err, SPN_ETOOBIG, "too many items");
  if (spn_tensor_nbytes(t) > buf->size)
    return spn_error_set(err, SPN_EINVAL, "tensor larger than its buffer");
  fitem_t *f = &m->items[m->n++];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->kind = SPN_ITEM_TENSOR;
  f->t = *t;
  f->buf = h_buffer_ref(buf);
  f->t.data = buf->data;
  return SPN_OK;
}
static int32_t h_msg_clone(spn_stage_t *s, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  (void)s;
  spn_msg_t *m = calloc(1, sizeof *m);
  if (!m)
    return spn_error_set(err, SPN_ENOMEM, "msg");
  *m = *from;
  for (int i = 0; i < m->n; i++) {
    if (m->items[i].buf)
      h_buffer_ref(m->items[i].buf);
    if (from->items[i].meta) {
      m->items[i].meta = malloc(from->items[i].meta_size ? from->items[i].meta_size : 1);
      memcpy(m->items[i].meta, from->items[i].meta, from->items[i].meta_size);
    }
  }
  *out = m;
  return SPN_OK;
}
static int32_t h_msg_replace_tensor(spn_msg_t *m, size_t i, const spn_tensor_t *t, spn_buffer_t *buf,
                                    spn_error_t *err) {
  if (i >= (size_t)m->n || m->items[i].kind != SPN_ITEM_TENSOR || spn_tensor_nbytes(t) > buf->size)
    return spn_error_set(err, SPN_EINVAL, "replace_tensor");
  spn_buffer_t *old = m->items[i].buf;
  m->items[i].buf = h_buffer_ref(buf);
  buf_unref(&old);
  m->items[i].t = *t;
  m->items[i].t.data = buf->data;
  return SPN_OK;
}
static int32_t h_msg_replace_meta(spn_msg_t *m, size_t i, const void *data, size_t size, spn_error_t *err) {
  if (i >= (size_t)m->n || m->items[i].kind != SPN_ITEM_META)
    return spn_error_set(err, SPN_EINVAL, "replace_meta");
  free(m->items[i].meta);
  m->items[i].meta = malloc(size ? size : 1);
  memcpy(m->items[i].meta, data, size);
  m->items[i].meta_size = size;
  return SPN_OK;
}

struct spn_model {
  int scale;       /* fake-sr-x2 */
  int retinaface;  /* fake-retinaface */
};
static int32_t h_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err) {
  (void)s;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (strcmp(base, "fake-sr-x2") && strcmp(base, "fake-retinaface"))
    return spn_error_set(err, SPN_ENOENT, "%s: no such model", path);
  *out = calloc(1, sizeof **out);
  if (!strcmp(base, "fake-sr-x2"))
    (*out)->scale = 2;
  else
    (*out)->retinaface = 1;
  return SPN_OK;
}
static void h_model_release(spn_stage_t *s, spn_model_t **m) {
  (void)s;
  free(*m);
  *m = NULL;
}
static int model_calls;
static int32_t h_model_io_count(const spn_model_t *m, bool is_output) {
  return is_output ? (m->retinaface ? 3 : 1) : 1;
}
static void h_model_free_outputs(spn_model_t *m, spn_tensor_t *outs, size_t n) {
  (void)m;
  for (size_t i = 0; i < n; i++) {
    free(outs[i].data);
    outs[i].data = NULL;
  }
}
/* fake-retinaface: loc and landms all zero (boxes = priors), every score
 * 0.01 except anchor (row 2, col 3, min_size 256) of stride 32 at 0.99 and its
 * right neighbour at 0.9 (suppressed by NMS: IoU 0.78). The per-channel means
 * of the input go to stderr so the test can check the preprocessing. */
static int32_t fake_retinaface(const spn_tensor_t *in, spn_tensor_t *out, spn_error_t *err) {
  if (in->ndim != 4 || in->shape[1] != 3)
    return spn_error_set(err, SPN_EINVAL, "fake engine: unexpected input");
  int64_t H = in->shape[2], W = in->shape[3], N = 0, target = -1, steps[3] = {8, 16, 32};
  for (int k = 0; k < 3; k++) {
    int64_t fh = (H + steps[k] - 1) / steps[k], fw = (W + steps[k] - 1) / steps[k];
    if (k == 2)
      target = N + (2 * fw + 3) * 2;
    N += fh * fw * 2;
  }
  int64_t widths[3] = {4, 2, 10};
  for (int i = 0; i < 3; i++) {
    out[i] = (spn_tensor_t)SPN_TENSOR_INIT;
    out[i].dtype = SPN_DTYPE_F32;
    out[i].ndim = 3;
    out[i].shape[0] = 1;
    out[i].shape[1] = N;
    out[i].shape[2] = widths[i];
    out[i].data = calloc((size_t)(N * widths[i]), sizeof(float));
  }
  float *conf = out[1].data;
  for (int64_t a = 0; a < N; a++) {
    conf[2 * a] = 0.99f;
    conf[2 * a + 1] = 0.01f;
  }
  conf[2 * target + 1] = 0.99f;
  conf[2 * (target + 2) + 1] = 0.9f;
  const float *x = in->data;
  double mean[3] = {0, 0, 0};
  for (int c = 0; c < 3; c++) {
    for (int64_t i = 0; i < H * W; i++)
      mean[c] += x[c * H * W + i];
    mean[c] /= (double)(H * W);
  }
  fprintf(stderr, "retinaface input %lldx%lld means: %.4f %.4f %.4f\n", (long long)W, (long long)H, mean[0], mean[1],
          mean[2]);
  return SPN_OK;
}
static int32_t h_model_run(spn_stage_t *s, spn_model_t *model, const spn_tensor_t *in, size_t n_in,
                           spn_tensor_t *out, size_t n_out, spn_error_t *err) {
  (void)s;
  model_calls++;
  if (model->retinaface)
    return n_in == 1 && n_out == 3 ? fake_retinaface(in, out, err) : spn_error_set(err, SPN_EINVAL, "fake engine");
  if (n_in != 1 || n_out != 1 || in->dtype != SPN_DTYPE_F32 || in->ndim != 4 || in->shape[0] != 1 ||
      in->shape[1] != 3 || !out->data || out->dtype != SPN_DTYPE_F32 || out->ndim != 4 ||
      out->shape[2] != in->shape[2] * model->scale || out->shape[3] != in->shape[3] * model->scale)
    return spn_error_set(err, SPN_EINVAL, "fake engine: unexpected tensors");
  int64_t h = in->shape[2], w = in->shape[3], sc = model->scale;
  const float *x = in->data;
  float *y = out->data;
  for (int64_t c = 0; c < 3; c++)
    for (int64_t i = 0; i < h * sc; i++)
      for (int64_t j = 0; j < w * sc; j++) {
        int64_t yi = i / sc, xj = j / sc;
        float acc = 0.f;
        for (int dy = -1; dy <= 1; dy++)
          for (int dx = -1; dx <= 1; dx++) {
            int64_t yy = yi + dy, xx = xj + dx;
            if (yy >= 0 && yy < h && xx >= 0 && xx < w)
              acc += x[(c * h + yy) * w + xx];
          }
        y[(c * h * sc + i) * w * sc + j] = acc / 9.f;
      }
  return SPN_OK;
}

static spn_msg_t *make_msg(uint64_t job, uint64_t seq, const char *spec, int32_t w, int32_t h) {
  spn_msg_t *m = calloc(1, sizeof *m);
  /* "FILE+faces": also attach a "faces" item with one known face. */
  char frame[1024];
  snprintf(frame, sizeof frame, "%s", spec);
  char *plus = strstr(frame, "+faces");
  if (plus) {
    *plus = '\0';
    spn_face_t f = {.x0 = 10, .y0 = 20, .x1 = 30, .y1 = 40, .score = 0.9f, .track_id = 7};
    for (int i = 0; i < 10; i++)
      f.landmarks[i] = (float)(i + 1);
    h_msg_add_meta(m, "faces", &f, sizeof f, NULL);
  }
  m->env = (spn_envelope_t){.struct_size = sizeof(spn_envelope_t), .job_id = job, .seq = seq, .total = -1};
  if (!strcmp(frame, "eos")) {
    m->env.flags = SPN_MSG_EOS;
    return m;
  }
  fitem_t *f = &m->items[m->n++];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "frame");
  f->kind = SPN_ITEM_TENSOR;
  f->t = (spn_tensor_t)SPN_TENSOR_INIT;
  f->t.ndim = 3;
  f->t.shape[0] = h;
  f->t.shape[1] = w;
  f->t.shape[2] = 3;
  f->buf = calloc(1, sizeof *f->buf);
  f->buf->refs = 1;
  if (!strcmp(frame, "bad")) {
    f->t.dtype = SPN_DTYPE_F32;
    f->buf->size = (size_t)w * h * 3 * 4;
    f->buf->data = calloc(1, f->buf->size);
  } else {
    f->t.dtype = SPN_DTYPE_U8;
    f->buf->size = (size_t)w * h * 3;
    f->buf->data = malloc(f->buf->size);
    FILE *fp = fopen(frame, "rb");
    if (!fp || fread(f->buf->data, 1, f->buf->size, fp) != f->buf->size) {
      fprintf(stderr, "%s: cannot read %zu bytes\n", frame, f->buf->size);
      exit(2);
    }
    fclose(fp);
  }
  f->t.data = f->buf->data;
  return m;
}

/* What the runtime does with a schema: defaults first (then the TOML). */
static void fill_defaults(const spn_config_field_t *schema, void *cfg) {
  for (const spn_config_field_t *f = schema; f && f->key; f++) {
    char *p = (char *)cfg + f->offset;
    switch (f->type) {
    case SPN_CONFIG_STRING:
    case SPN_CONFIG_PATH: *(const char **)p = f->def_str; break;
    case SPN_CONFIG_INT: *(int64_t *)p = f->def_int; break;
    case SPN_CONFIG_FLOAT: *(double *)p = f->def_float; break;
    case SPN_CONFIG_BOOL: *(bool *)p = f->def_int != 0; break;
    }
  }
}

static int set_config(const spn_config_field_t *schema, void *cfg, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (!eq)
    return -1;
  for (const spn_config_field_t *f = schema; f && f->key; f++) {
    if (strlen(f->key) != (size_t)(eq - kv) || strncmp(f->key, kv, (size_t)(eq - kv)))
      continue;
    char *p = (char *)cfg + f->offset;
    switch (f->type) {
    case SPN_CONFIG_STRING:
    case SPN_CONFIG_PATH: *(const char **)p = eq + 1; return 0;
    case SPN_CONFIG_INT: *(int64_t *)p = atoll(eq + 1); return 0;
    case SPN_CONFIG_FLOAT: *(double *)p = atof(eq + 1); return 0;
    case SPN_CONFIG_BOOL: *(bool *)p = atoi(eq + 1) != 0; return 0;
    }
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc < 9) {
    fprintf(stderr, "usage: see the header of stage-host.c\n");
    return 2;
  }
  void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const spn_plugin_desc_t *(*descf)(void) = (const spn_plugin_desc_t *(*)(void))dlsym(so, "spindle_plugin_vision_desc");
  if (!descf) {
    fprintf(stderr, "no spindle_plugin_vision_desc\n");
    return 1;
  }
  const spn_plugin_desc_t *d = descf();
  if (d->struct_size != sizeof *d || d->abi_major != SPN_PLUGIN_ABI_MAJOR || strcmp(d->name, "vision") ||
      d->sig_pointer_size != sizeof(void *) || !d->init) {
    fprintf(stderr, "bad descriptor\n");
    return 1;
  }
  spn_host_api_t host = {
      .struct_size = sizeof host,
      .abi_major = SPN_PLUGIN_ABI_MAJOR,
      .abi_minor = SPN_PLUGIN_ABI_MINOR,
      .register_kind = h_register_kind,
      .plugin_set_data = h_plugin_set_data,
      .stage_get_data = h_stage_get_data,
      .stage_get_name = h_stage_get_name,
      .stage_get_threads = h_stage_get_threads,
      .log = h_log,
      .fail_job = h_fail_job,
      .job_cancelled = h_job_cancelled,
      .buffer_new = h_buffer_new,
      .buffer_data = h_buffer_data,
      .buffer_size = h_buffer_size,
      .buffer_ref = h_buffer_ref,
      .buffer_unref = buf_unref,
      .msg_new_from = h_msg_new_from,
      .msg_free = h_msg_free,
      .msg_envelope = h_msg_envelope,
      .msg_item_count = h_msg_item_count,
      .msg_item = h_msg_item,
      .msg_find = h_msg_find,
      .msg_add_tensor = h_msg_add_tensor,
      .msg_add_meta = h_msg_add_meta,
      .emit = h_emit,
      .model_load = h_model_load,
      .model_release = h_model_release,
      .model_run = h_model_run,
      .model_io_count = h_model_io_count,
      .model_free_outputs = h_model_free_outputs,
      .msg_clone = h_msg_clone,
      .msg_replace_tensor = h_msg_replace_tensor,
      .msg_replace_meta = h_msg_replace_meta,
  };
  spn_plugin_t plugin = {0};
  spn_error_t err = SPN_ERROR_INIT;
  if (d->init(&host, &plugin, &err) != SPN_OK) {
    fprintf(stderr, "init: %s\n", err.msg);
    return 1;
  }
  const spn_stage_kind_t *k = NULL;
  for (int i = 0; i < plugin.nkinds; i++)
    if (!strcmp(plugin.kinds[i]->name, argv[2]))
      k = plugin.kinds[i];
  if (!k) {
    fprintf(stderr, "no kind %s registered\n", argv[2]);
    return 1;
  }
  int32_t w = atoi(argv[3]), h = atoi(argv[4]);
  int batch = atoi(argv[5]);
  outdir = argv[6];
  void *cfg = calloc(1, k->config_size);
  fill_defaults(k->schema, cfg);
  int a = 7;
  for (; a < argc && strcmp(argv[a], "--"); a++)
    if (set_config(k->schema, cfg, argv[a])) {
      fprintf(stderr, "unknown config %s\n", argv[a]);
      return 2;
    }
  a++;
  spn_stage_t stage = {.head = {.struct_size = sizeof(spn_stage_head_t), .host = &host}};
  if (k->create(&stage, cfg, &stage.data, &err) != SPN_OK) {
    printf("{\"create_error\": ");
    print_json_string(err.msg);
    printf("}\n");
    free(cfg);
    return 0;
  }
  void *jobs[MAX_JOBS] = {0};
  uint64_t seqs[MAX_JOBS] = {0};
  spn_msg_t *msgs[16];
  void *js[16];
  int nb = 0;
  for (int i = a; i <= argc; i++) {
    if (i < argc) {
      char *colon = strchr(argv[i], ':');
      int job = atoi(argv[i]);
      if (!colon || job < 1 || job >= MAX_JOBS)
        return 2;
      if (!jobs[job] && k->job_open) {
        spn_job_info_t info = {.struct_size = sizeof info, .job_id = (uint64_t)job, .config = cfg};
        if (k->job_open(&stage, stage.data, &info, &jobs[job], &err) != SPN_OK) {
          fprintf(stderr, "job_open: %s\n", err.msg);
          return 1;
        }
      }
      msgs[nb] = make_msg((uint64_t)job, seqs[job]++, colon + 1, w, h);
      js[nb] = jobs[job];
      nb++;
    }
    if (nb > 0 && (nb == batch || i == argc)) {
      if (k->process(&stage, stage.data, msgs, js, (size_t)nb, &err) != SPN_OK) {
        fprintf(stderr, "process: %s\n", err.msg);
        return 1;
      }
      for (int b = 0; b < nb; b++)
        if (msgs[b]) {
          fprintf(stderr, "message %d neither emitted nor freed\n", b);
          failures++;
          h_msg_free(&msgs[b]);
        }
      nb = 0;
    }
  }
  for (int j = 0; j < MAX_JOBS; j++)
    if (jobs[j] && k->job_close)
      k->job_close(&stage, stage.data, jobs[j], true);
  if (k->destroy)
    k->destroy(&stage, stage.data);
  if (d->fini)
    d->fini(plugin.data);
  free(cfg);
  dlclose(so);
  fprintf(stderr, "model calls: %d\n", model_calls);
  return failures ? 1 : 0;
}
