/* host.c — the spn_host_api_t table handed to plugins.
 *
 * One constant table serves every runtime: each entry finds its runtime
 * through the stage handle it is given, so no entry touches process-wide
 * state, and the pointer a plugin keeps from init stays valid whatever
 * runtime comes and goes; every stage handle carries it too (its public
 * head, spn_stage_host). register_kind/plugin_set_data are the loader's. Entries that act on the calling actor (emit, fail_job) must be
 * called from that actor's executor, inside one of its callbacks; the
 * buffer and message accessors may be called from any thread. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "debug-internal.h"
#include "runtime-internal.h"

int32_t spn__host_emit(spn_stage_t *a, uint32_t port, spn_msg_t **msgp, spn_error_t *err);
void spn__host_fail_job(spn_stage_t *a, uint64_t job_id, int32_t status, const char *msg);
bool spn__host_job_cancelled(spn_stage_t *a, uint64_t job_id);
int32_t spn__host_msg_add_tensor(spn_msg_t *msg, const char *name, const spn_tensor_t *t, spn_buffer_t *buf,
                                 spn_error_t *err);
int32_t spn__host_msg_add_meta(spn_msg_t *msg, const char *name, const void *data, size_t size, spn_error_t *err);
int32_t spn__host_msg_item(const spn_msg_t *msg, size_t i, spn_item_t *item);
int64_t spn__host_msg_find(const spn_msg_t *msg, const char *name);
int32_t spn__host_msg_replace_tensor(spn_msg_t *msg, size_t i, const spn_tensor_t *t, spn_buffer_t *buf,
                                     spn_error_t *err);
int32_t spn__host_msg_replace_meta(spn_msg_t *msg, size_t i, const void *data, size_t size, spn_error_t *err);
/* ABI 1.1: memory kinds and formats (edge-mem.c) */
int32_t spn__host_buffer_new_kind(spn_stage_t *s, size_t size, int32_t mem_kind, spn_buffer_t **out,
                                  spn_error_t *err);
int32_t spn__host_buffer_mem_kind(const spn_buffer_t *buf);
void spn__host_buffer_device(const spn_buffer_t *buf, int32_t *kind, int32_t *index);
int32_t spn__host_buffer_set_ready(spn_stage_t *s, spn_buffer_t *buf, spn_error_t *err);
void *spn__host_buffer_event(const spn_buffer_t *buf);
int32_t spn__host_stage_port_format(spn_stage_t *s, bool is_output, uint32_t port, spn_port_format_t *out,
                                    spn_error_t *err);
/* ABI 1.1: counted copies (edge-mem.c) */
int32_t spn__host_buffer_copy(spn_stage_t *s, uint64_t job_id, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                              size_t src_off, size_t n, spn_error_t *err);

static void *h_stage_get_data(spn_stage_t *s) { return s->state; }
static const char *h_stage_get_name(spn_stage_t *s) { return s->srt->spec->name; }

static void h_stage_get_device(spn_stage_t *s, int32_t *kind, int32_t *index) {
  if (kind)
    *kind = s->device ? s->device->kind : SPN_DEVICE_CPU;
  if (index)
    *index = s->device ? s->device->index : 0;
}

/* The native stream of the executor that owns the instance's device (NULL
 * on the CPU, whose streams run work when it is issued). */
static void *h_stage_get_stream(spn_stage_t *s) { return s->ex->stream ? spn_stream_native(s->ex->stream) : NULL; }

static int32_t h_stage_get_threads(spn_stage_t *s) {
  (void)s;
  return 1;
}

static void h_log(spn_stage_t *s, uint64_t job_id, int32_t level, const char *fmt, ...) SPN_PRINTF(4, 5);
static void h_log(spn_stage_t *s, uint64_t job_id, int32_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (level >= SPN_LOG_WARN) {
    /* kept for the job's status (spn_job_warning), or the pipeline's when
     * the stage names no job (model fallbacks at load) */
    va_list ap2;
    va_copy(ap2, ap);
    spn_job_t *job = job_id ? spn__pipeline_find_job(s->pipe, job_id) : NULL;
    if (job)
      spn__warns_addv(&job->warns, s->srt->spec->name, fmt, ap2);
    else if (!job_id)
      spn__warns_addv(&s->pipe->warns, s->srt->spec->name, fmt, ap2);
    va_end(ap2);
    spn__job_unref(&job);
  }
  spn__logv(s->pipe->rt->log, level, job_id, s->srt->spec->name, s->device_name, fmt, ap);
  va_end(ap);
}

static void h_progress(spn_stage_t *s, uint64_t job_id, int64_t done, int64_t total) {
  /* on_progress reports units finished at the pipeline's sinks (runtime.h).
   * A source or middle stage runs ahead of the sinks by the edges' credit,
   * so forwarding its counts made progress jump ahead and back (a source
   * reported 60/60 while the sink had 5). Only terminal stages report;
   * the stage harness sees every report, to test the stage's own counts. */
  if (s->srt->progress_tap)
    s->srt->progress_tap(s->srt->progress_tap_data, job_id, done, total);
  if (!s->srt->terminal)
    return;
  spn_job_t *job = spn__pipeline_find_job(s->pipe, job_id);
  if (!job)
    return;
  spn__event_t *ev = spn__event_new(SPN__EV_PROGRESS, job, SPN_OK, NULL);
  ev->done = done;
  ev->total = total;
  spn__loop_post(s->pipe->rt, ev);
  spn__job_unref(&job);
}

static int32_t h_buffer_new(spn_stage_t *s, size_t size, spn_buffer_t **out, spn_error_t *err) {
  spn_device_t *d = s->device ? s->device : s->pipe->rt->host_dev;
  /* A CPU device's memory is host memory: say so (ABI 1.1 memory kinds),
   * so edges into host ports pass it without a copy. */
  int32_t kind = d->kind == SPN_DEVICE_CPU ? SPN_MEM_HOST : SPN_MEM_DEVICE;
  return spn_buffer_type_alloc(spn_device_buffer_type(d, kind), size, out, err);
}

static void *h_buffer_data(spn_buffer_t *b) { return spn_buffer_data(b); }
static size_t h_buffer_size(const spn_buffer_t *b) { return spn_buffer_size(b); }
static spn_buffer_t *h_buffer_ref(spn_buffer_t *b) { return spn_buffer_ref(b); }
static void h_buffer_unref(spn_buffer_t **b) { spn_buffer_unref(b); }

static int32_t h_msg_new(spn_stage_t *s, const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err) {
  (void)s;
  if (!env || !out)
    return spn_error_set(err, SPN_EINVAL, "msg_new: NULL envelope or out");
  return spn__msg_new(env, out, err);
}

static int32_t h_msg_new_from(spn_stage_t *s, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  (void)s;
  if (!from || !out)
    return spn_error_set(err, SPN_EINVAL, "msg_new_from: NULL message or out");
  int32_t rc = spn__msg_new(&from->env, out, err);
  if (rc == SPN_OK)
    (*out)->env.flags &= SPN_MSG_KEY; /* a new message is data, never EOS/SKIP */
  return rc;
}

static int32_t h_msg_clone(spn_stage_t *s, const spn_msg_t *msg, spn_msg_t **out, spn_error_t *err) {
  (void)s;
  if (!msg || !out)
    return spn_error_set(err, SPN_EINVAL, "msg_clone: NULL message or out");
  return spn__msg_clone(msg, out, err);
}

static void h_msg_free(spn_msg_t **m) { spn__msg_free(m); }
static const spn_envelope_t *h_msg_envelope(const spn_msg_t *m) { return &m->env; }
static size_t h_msg_item_count(const spn_msg_t *m) { return m->n_items; }

static const spn_host_api_t host_table = {
    .struct_size = sizeof(spn_host_api_t),
    .abi_major = SPN_PLUGIN_ABI_MAJOR,
    .abi_minor = SPN_PLUGIN_ABI_MINOR,
    .register_kind = spn__plugin_register_kind, /* the loader's: act during init */
    .plugin_set_data = spn__plugin_set_data,
    .stage_get_data = h_stage_get_data,
    .stage_get_name = h_stage_get_name,
    .stage_get_device = h_stage_get_device,
    .stage_get_stream = h_stage_get_stream,
    .stage_get_threads = h_stage_get_threads,
    .log = h_log,
    .progress = h_progress,
    .fail_job = spn__host_fail_job,
    .job_cancelled = spn__host_job_cancelled,
    .buffer_new = h_buffer_new,
    .buffer_data = h_buffer_data,
    .buffer_size = h_buffer_size,
    .buffer_ref = h_buffer_ref,
    .buffer_unref = h_buffer_unref,
    .msg_new = h_msg_new,
    .msg_new_from = h_msg_new_from,
    .msg_free = h_msg_free,
    .msg_envelope = h_msg_envelope,
    .msg_item_count = h_msg_item_count,
    .msg_item = spn__host_msg_item,
    .msg_find = spn__host_msg_find,
    .msg_add_tensor = spn__host_msg_add_tensor,
    .msg_add_meta = spn__host_msg_add_meta,
    .emit = spn__host_emit,
    .model_load = spn__host_model_load,
    .model_release = spn__host_model_release,
    .model_io_count = spn__host_model_io_count,
    .model_io = spn__host_model_io,
    .model_run = spn__host_model_run,
    .model_free_outputs = spn__host_model_free_outputs,
    /* ABI 1.1: host access and helpers */
    .msg_clone = h_msg_clone,
    .msg_replace_tensor = spn__host_msg_replace_tensor,
    .msg_replace_meta = spn__host_msg_replace_meta,
    /* ABI 1.1: memory kinds and formats */
    .buffer_new_kind = spn__host_buffer_new_kind,
    .buffer_mem_kind = spn__host_buffer_mem_kind,
    .buffer_device = spn__host_buffer_device,
    .buffer_set_ready = spn__host_buffer_set_ready,
    .buffer_event = spn__host_buffer_event,
    .stage_port_format = spn__host_stage_port_format,
    /* ABI 1.1: counted copies */
    .buffer_copy = spn__host_buffer_copy,
};

const spn_host_api_t *spn__host_api(void) { return &host_table; }

const spn_host_api_t *spn__runtime_host_api(spn_runtime_t *rt) { return rt->host; }
