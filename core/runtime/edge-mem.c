/* edge-mem.c — buffers where the consumer wants them (ABI 1.1).
 *
 * A buffer knows its device and memory kind (device, host, pinned) and may
 * carry a readiness event (spn_buffer_set_ready). Each input port declares
 * the memory kinds it takes (spn_port_caps_t.mem_kinds; ABI 1.0 ports take
 * host memory). When a message arrives on a link, every tensor item whose
 * buffer the port takes as it is (spn__mem_plan) is handed over untouched —
 * the zero-copy path; any other is copied once into a new buffer of the
 * kind the port wants on the consumer's device: on the consumer executor's
 * stream, after the producer's readiness event, and synchronised before a
 * CPU consumer reads it. Copies between two GPUs are peer copies where the
 * pair supports it (the CUDA backend's copy picks cudaMemcpyPeerAsync).
 * Every copy is counted on the link by direction, with bytes and time,
 * and for the message's job.
 *
 * Also here: the host API entries of ABI 1.1 for buffers and formats, and
 * buffer_copy, the copy a stage makes itself: counted the same way for the
 * stage and for the job the stage names, so a job's transfers are its
 * edges' plus its stages' (the runtime never guesses which job of a batch
 * a stage's copy served).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime-internal.h"

static int dir_of(int32_t from_kind, int32_t to_kind) {
  bool hf = from_kind != SPN_MEM_DEVICE, ht = to_kind != SPN_MEM_DEVICE;
  return hf ? (ht ? SPN__COPY_H2H : SPN__COPY_H2D) : (ht ? SPN__COPY_D2H : SPN__COPY_D2D);
}

/* A stream this actor's executor may use for a copy involving `dev`: its
 * own executor's stream when that runs on dev or on the consumer's device,
 * else one kept per actor (re-made when the device changes). */
static int32_t copy_stream(spn_stage_t *a, spn_device_t *dev, spn_stream_t **out, spn_error_t *err) {
  if (a->ex->stream && a->ex->stream->dev == dev) {
    *out = a->ex->stream;
    return SPN_OK;
  }
  if (a->copy_stream && a->copy_stream->dev != dev) {
    int32_t rc = spn_stream_synchronize(a->copy_stream, err);
    spn_stream_free(&a->copy_stream);
    if (rc != SPN_OK)
      return rc;
  }
  if (!a->copy_stream) {
    int32_t rc = spn_stream_new(dev, &a->copy_stream, err);
    if (rc != SPN_OK)
      return rc;
  }
  *out = a->copy_stream;
  return SPN_OK;
}

void spn__xfer_read(const spn__xfer_t *x, spn_transfer_stats_t *out) {
  for (int d = 0; d < SPN__COPY_DIRS; d++) {
    out->copies[d] += atomic_load_explicit(&x->copies[d], memory_order_relaxed);
    out->bytes[d] += atomic_load_explicit(&x->bytes[d], memory_order_relaxed);
    out->ns[d] += atomic_load_explicit(&x->ns[d], memory_order_relaxed);
  }
}

int32_t spn__edge_place(spn_stage_t *a, spn__link_t *l, spn_msg_t *m, spn_job_t *job, spn_error_t *err) {
  spn_device_t *home = a->device ? a->device : a->pipe->rt->host_dev;
  atomic_fetch_add_explicit(&l->stats.messages, 1, memory_order_relaxed);
  for (uint32_t i = 0; i < m->n_items; i++) {
    spn__item_t *it = &m->items[i];
    if (it->kind != SPN_ITEM_TENSOR || !it->buffer)
      continue;
    spn_buffer_t *src = it->buffer;
    int32_t have = src->bt->mem_kind;
    int32_t want = spn__mem_plan(l->accept_mem, have, src->bt->device == home, a->device != NULL);
    int32_t rc;
    if (want < 0) {
      /* Taken as it is; a consumer on another stream still waits for the
       * producer's work on it. */
      if (src->ready) {
        spn_stream_t *s = a->ex->stream && a->ex->stream->dev == src->ready->dev ? a->ex->stream : NULL;
        if ((rc = spn_buffer_wait_ready(src, s, err)) != SPN_OK)
          return rc;
      }
      atomic_fetch_add_explicit(&l->stats.items_passed, 1, memory_order_relaxed);
      continue;
    }
    uint64_t t0 = spn__now_ns();
    spn_device_t *dst_dev = home;
    spn_buffer_t *dst = NULL;
    spn_error_t e = SPN_ERROR_INIT;
    if ((rc = spn_buffer_type_alloc(spn_device_buffer_type(dst_dev, want), src->size, &dst, &e)) != SPN_OK)
      return spn_error_set(err, rc, "edge copy of \"%s\" to %s: %.800s", it->name, dst_dev->name, e.msg);
    /* The copy runs on a stream of the device that is not plain host
     * memory: the consumer's if it has one, else the source's. */
    spn_device_t *sdev = (!dst->bt->iface->is_host || !src->bt->device || src->bt->iface->is_host) ? dst_dev
                                                                                                    : src->bt->device;
    spn_stream_t *s = NULL;
    if ((rc = copy_stream(a, sdev, &s, &e)) == SPN_OK && (rc = spn_buffer_wait_ready(src, s, &e)) == SPN_OK &&
        (rc = spn_stream_copy(s, dst, 0, src, 0, src->size, &e)) == SPN_OK) {
      if (dst->bt->iface->is_host || !a->device)
        rc = spn_stream_synchronize(s, &e); /* the CPU reads it next */
      else if ((rc = spn_buffer_set_ready(dst, s, &e)) == SPN_OK && have == SPN_MEM_PINNED)
        /* The source goes below: a device source's free is ordered after
         * the copy by its device, a pageable one was staged before the copy
         * call returned, a pinned one is read by the DMA itself. */
        rc = spn_stream_synchronize(s, &e);
    }
    if (rc != SPN_OK) {
      spn_buffer_unref(&dst);
      return spn_error_set(err, rc, "edge copy of \"%s\" (%zu bytes) from %s to %s: %.800s", it->name, src->size,
                           src->bt->device ? src->bt->device->name : "host", dst_dev->name, e.msg);
    }
    int d = dir_of(have, want);
    uint64_t dt = spn__now_ns() - t0;
    atomic_fetch_add_explicit(&l->stats.copies[d], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats.bytes[d], src->size, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats.ns[d], dt, memory_order_relaxed);
    if (job)
      spn__xfer_add(&job->xfer, d, src->size, dt);
    atomic_fetch_add_explicit(&sdev->copied[d], src->size, memory_order_relaxed);
    spn_buffer_unref(&it->buffer);
    it->buffer = dst;
    bool on_dev = dst->bt->device && (!dst->bt->iface->is_host || dst->bt->device->kind == SPN_DEVICE_CPU);
    it->tensor.device_kind = on_dev ? dst->bt->device->kind : SPN_DEVICE_CPU;
    it->tensor.device_index = on_dev ? dst->bt->device->index : 0;
  }
  return SPN_OK;
}

void spn__edge_place_done(spn_stage_t *a) {
  if (a->copy_stream) {
    spn_error_t err = SPN_ERROR_INIT;
    (void)spn_stream_synchronize(a->copy_stream, &err);
    spn_stream_free(&a->copy_stream);
  }
}

/* ---- host API entries (ABI 1.1) -------------------------------------------- */

int32_t spn__host_buffer_new_kind(spn_stage_t *s, size_t size, int32_t mem_kind, spn_buffer_t **out,
                                  spn_error_t *err) {
  if (!s || !out)
    return spn_error_set(err, SPN_EINVAL, "buffer_new_kind: NULL stage or out");
  if (mem_kind < SPN_MEM_DEVICE || mem_kind > SPN_MEM_PINNED)
    return spn_error_set(err, SPN_EINVAL, "buffer_new_kind: memory kind %d is not device (0), host (1) or pinned (2)",
                         mem_kind);
  spn_device_t *d = s->device ? s->device : s->pipe->rt->host_dev;
  return spn_buffer_type_alloc(spn_device_buffer_type(d, mem_kind), size, out, err);
}

int32_t spn__host_buffer_mem_kind(const spn_buffer_t *buf) { return buf ? buf->bt->mem_kind : SPN_MEM_HOST; }

void spn__host_buffer_device(const spn_buffer_t *buf, int32_t *kind, int32_t *index) {
  const spn_device_t *d = buf ? buf->bt->device : NULL;
  if (kind)
    *kind = d ? d->kind : SPN_DEVICE_CPU;
  if (index)
    *index = d ? d->index : 0;
}

int32_t spn__host_buffer_set_ready(spn_stage_t *s, spn_buffer_t *buf, spn_error_t *err) {
  if (!s || !buf)
    return spn_error_set(err, SPN_EINVAL, "buffer_set_ready: NULL stage or buffer");
  return spn_buffer_set_ready(buf, s->ex->stream, err);
}

void *spn__host_buffer_event(const spn_buffer_t *buf) {
  /* The native handle sits first in a backend's event context (a
   * cudaEvent_t is the context itself). */
  return buf && buf->ready ? buf->ready->ctx : NULL;
}

int32_t spn__host_stage_port_format(spn_stage_t *s, bool is_output, uint32_t port, spn_port_format_t *out,
                                    spn_error_t *err) {
  if (!s || !out)
    return spn_error_set(err, SPN_EINVAL, "stage_port_format: NULL stage or out");
  const spn__pipeline_spec_t *spec = s->pipe->spec;
  const spn_stage_kind_t *k = s->srt->kind;
  if (port >= (is_output ? k->n_outputs : k->n_inputs))
    return spn_error_set(err, SPN_EINVAL, "stage_port_format: stage \"%s\" has no %s port %u", s->srt->spec->name,
                         is_output ? "output" : "input", port);
  for (size_t e = 0; e < spec->n_edges; e++) {
    const spn__edge_spec_t *es = &spec->edges[e];
    bool hit = is_output ? (es->from_stage == s->srt->index && es->from_port == port)
                         : (es->to_stage == s->srt->index && es->to_port == port);
    if (hit && es->format.struct_size) {
      *out = es->format;
      out->mem_kind = spn__edge_mem_kind(s->pipe, es); /* by placement, as the run summary says */
      return SPN_OK;
    }
  }
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->mem_kind = SPN_MEM_HOST;
  return SPN_OK;
}

/* The job a stage names in buffer_copy: among the jobs this actor holds
 * (its executor's list, so no lock), else among the pipeline's live jobs
 * (a new reference, dropped by the caller). NULL for 0 or an id no live job
 * has: the copy is then counted for the stage only. */
static spn_job_t *copy_job(spn_stage_t *s, uint64_t job_id, bool *owned) {
  *owned = false;
  if (!job_id)
    return NULL;
  for (spn__ajob_t *aj = s->jobs; aj; aj = aj->next)
    if (aj->id == job_id)
      return aj->job;
  *owned = true;
  return spn__pipeline_find_job(s->pipe, job_id);
}

int32_t spn__host_buffer_copy(spn_stage_t *s, uint64_t job_id, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                              size_t src_off, size_t n, spn_error_t *err) {
  if (!s || !dst || !src)
    return spn_error_set(err, SPN_EINVAL, "buffer_copy: NULL stage or buffer");
  const char *name = s->srt->spec->name;
  if (dst_off > dst->size || n > dst->size - dst_off || src_off > src->size || n > src->size - src_off)
    return spn_error_set(err, SPN_EINVAL,
                         "buffer_copy: stage \"%s\": %zu bytes from offset %zu of a %zu-byte buffer to offset %zu "
                         "of a %zu-byte buffer do not fit",
                         name, n, src_off, src->size, dst_off, dst->size);
  spn_device_t *host = s->pipe->rt->host_dev;
  spn_device_t *ddev = dst->bt->device ? dst->bt->device : host, *sdev = src->bt->device ? src->bt->device : host;
  uint64_t t0 = spn__now_ns();
  spn_stream_t *st = s->ex->stream;
  int32_t rc = SPN_OK;
  spn_error_t e = SPN_ERROR_INIT;
  if (!st) {
    /* A CPU-pool instance: a stream of the side that is not plain host
     * memory (as on an edge), waited for before returning. */
    spn_device_t *cdev = (!dst->bt->iface->is_host || src->bt->iface->is_host) ? ddev : sdev;
    rc = copy_stream(s, cdev, &st, &e);
  }
  if (rc == SPN_OK && (rc = spn_buffer_wait_ready(src, st, &e)) == SPN_OK &&
      (rc = spn_stream_copy(st, dst, dst_off, src, src_off, n, &e)) == SPN_OK && !s->ex->stream)
    rc = spn_stream_synchronize(st, &e);
  if (rc != SPN_OK)
    return spn_error_set(err, rc, "buffer_copy: stage \"%s\": %zu bytes from %s to %s: %.800s", name, n, sdev->name,
                         ddev->name, e.msg);
  int d = dir_of(src->bt->mem_kind, dst->bt->mem_kind);
  uint64_t dt = spn__now_ns() - t0;
  spn__xfer_add(&s->srt->xfer, d, n, dt);
  bool owned;
  spn_job_t *job = copy_job(s, job_id, &owned);
  if (job)
    spn__xfer_add(&job->xfer, d, n, dt);
  if (owned)
    spn__job_unref(&job);
  return SPN_OK;
}
