/* device.c — the backend-independent half of the device layer.
 *
 * Buffers, streams and events dispatch through the owning device's vtable
 * (device-internal.h). A buffer's refcount is an atomic: references may be
 * taken and dropped on any thread, and the thread that drops the last one
 * calls the buffer type's free. Device specs are parsed here and handed to
 * the backend that owns the kind. */
#include "device-internal.h"

#include <stdlib.h>
#include <string.h>

int32_t spn_device_kind(const spn_device_t *dev) { return dev->kind; }
int32_t spn_device_index(const spn_device_t *dev) { return dev->index; }
const char *spn_device_name(const spn_device_t *dev) { return dev->name; }

spn_buffer_type_t *spn_device_buffer_type(spn_device_t *dev, int32_t mem_kind) {
  if (mem_kind < 0 || mem_kind > SPN_MEM_PINNED)
    return NULL;
  return &dev->bt[mem_kind];
}

bool spn_buffer_type_is_host(const spn_buffer_type_t *bt) { return bt->iface->is_host; }

int32_t spn_buffer_type_alloc(spn_buffer_type_t *bt, size_t size, spn_buffer_t **out, spn_error_t *err) {
  spn_buffer_t *b = calloc(1, sizeof *b);
  if (!b)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory allocating a buffer", bt->device->name);
  int32_t rc = bt->iface->alloc(bt, size, &b->data, &b->ctx, err);
  if (rc != SPN_OK) {
    free(b);
    return rc;
  }
  atomic_init(&b->refs, 1);
  b->bt = bt;
  b->size = size;
  *out = b;
  return SPN_OK;
}

void *spn_buffer_data(spn_buffer_t *buf) { return buf->data; }
size_t spn_buffer_size(const spn_buffer_t *buf) { return buf->size; }
spn_device_t *spn_buffer_device(const spn_buffer_t *buf) { return buf->bt->device; }
bool spn_buffer_is_host(const spn_buffer_t *buf) { return buf->bt->iface->is_host; }
int32_t spn_buffer_mem_kind(const spn_buffer_t *buf) { return buf->bt->mem_kind; }
spn_event_t *spn_buffer_ready_event(const spn_buffer_t *buf) { return buf->ready; }

int32_t spn_buffer_set_ready(spn_buffer_t *buf, spn_stream_t *s, spn_error_t *err) {
  /* CPU streams run work when it is issued: the contents are complete now. */
  if (!s || s->dev->kind == SPN_DEVICE_CPU) {
    spn_event_free(&buf->ready);
    return SPN_OK;
  }
  if (buf->ready && buf->ready->dev != s->dev)
    spn_event_free(&buf->ready);
  int32_t rc;
  if (!buf->ready && (rc = spn_event_new(s->dev, &buf->ready, err)) != SPN_OK)
    return rc;
  return spn_event_record(buf->ready, s, err);
}

int32_t spn_buffer_wait_ready(spn_buffer_t *buf, spn_stream_t *s, spn_error_t *err) {
  if (!buf->ready)
    return SPN_OK;
  if (s && s->dev == buf->ready->dev)
    return spn_stream_wait_event(s, buf->ready, err);
  /* Another device or the host: wait here (cross-device stream waits are
   * not portable across backends). */
  return spn_event_synchronize(buf->ready, err);
}

spn_buffer_t *spn_buffer_ref(spn_buffer_t *buf) {
  atomic_fetch_add_explicit(&buf->refs, 1, memory_order_relaxed);
  return buf;
}

void spn_buffer_unref(spn_buffer_t **buf) {
  if (!buf || !*buf)
    return;
  spn_buffer_t *b = *buf;
  *buf = NULL;
  /* acq_rel: the freeing thread sees every write made through other refs. */
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
    spn_event_free(&b->ready);
    b->bt->iface->free(b->bt, b->data, b->ctx);
    free(b);
  }
}

int32_t spn_stream_new(spn_device_t *dev, spn_stream_t **out, spn_error_t *err) {
  spn_stream_t *s = calloc(1, sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory creating a stream", dev->name);
  s->dev = dev;
  int32_t rc = dev->iface->stream_new(dev, &s->native, &s->ctx, err);
  if (rc != SPN_OK) {
    free(s);
    return rc;
  }
  *out = s;
  return SPN_OK;
}

void spn_stream_free(spn_stream_t **s) {
  if (!s || !*s)
    return;
  (*s)->dev->iface->stream_free((*s)->dev, (*s)->ctx);
  free(*s);
  *s = NULL;
}

int32_t spn_stream_synchronize(spn_stream_t *s, spn_error_t *err) { return s->dev->iface->stream_sync(s->dev, s->ctx, err); }
void *spn_stream_native(spn_stream_t *s) { return s->native; }

int32_t spn_stream_copy(spn_stream_t *s, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src, size_t src_off,
                        size_t size, spn_error_t *err) {
  if (dst_off > dst->size || size > dst->size - dst_off || src_off > src->size || size > src->size - src_off)
    return spn_error_set(err, SPN_EOVERFLOW, "%s: copy of %zu bytes out of range (dst %zu+%zu, src %zu+%zu)",
                         s->dev->name, size, dst->size, dst_off, src->size, src_off);
  return s->dev->iface->copy(s->dev, s->ctx, dst, dst_off, src, src_off, size, err);
}

/* An event of dev made by `make` (the iface's event_new or event_new_timed). */
static int32_t event_make(spn_device_t *dev, int32_t (*make)(spn_device_t *, void **, spn_error_t *),
                          spn_event_t **out, spn_error_t *err) {
  spn_event_t *e = calloc(1, sizeof *e);
  if (!e)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory creating an event", dev->name);
  e->dev = dev;
  int32_t rc = make(dev, &e->ctx, err);
  if (rc != SPN_OK) {
    free(e);
    return rc;
  }
  *out = e;
  return SPN_OK;
}

int32_t spn_event_new(spn_device_t *dev, spn_event_t **out, spn_error_t *err) {
  return event_make(dev, dev->iface->event_new, out, err);
}

void spn_event_free(spn_event_t **ev) {
  if (!ev || !*ev)
    return;
  (*ev)->dev->iface->event_free((*ev)->dev, (*ev)->ctx);
  free(*ev);
  *ev = NULL;
}

int32_t spn__event_new_timed(spn_device_t *dev, spn_event_t **out, spn_error_t *err) {
  if (!dev->iface->event_new_timed || !dev->iface->event_elapsed)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: no timed events", dev->name);
  return event_make(dev, dev->iface->event_new_timed, out, err);
}

int32_t spn__event_elapsed(spn_event_t *start, spn_event_t *end, bool wait, uint64_t *ns, spn_error_t *err) {
  if (start->dev != end->dev)
    return spn_error_set(err, SPN_EINVAL, "%s, %s: timed events of two devices", start->dev->name, end->dev->name);
  return start->dev->iface->event_elapsed(start->dev, start->ctx, end->ctx, wait, ns, err);
}

int32_t spn_event_record(spn_event_t *ev, spn_stream_t *s, spn_error_t *err) {
  return ev->dev->iface->event_record(ev->dev, ev->ctx, s->ctx, err);
}
int32_t spn_event_synchronize(spn_event_t *ev, spn_error_t *err) { return ev->dev->iface->event_sync(ev->dev, ev->ctx, err); }
int32_t spn_stream_wait_event(spn_stream_t *s, spn_event_t *ev, spn_error_t *err) {
  return s->dev->iface->stream_wait_event(s->dev, s->ctx, ev->ctx, err);
}

int32_t spn__devices_open(const char *spec, const spn__backend_t *const *extra, size_t n_extra,
                          spn_device_t ***devs, uint32_t *n, spn_error_t *err) {
  if (!spec || !*spec)
    spec = "auto";
  const spn__backend_t *cpu = spn__backend_cpu();
  if (!strcmp(spec, "auto")) {
    /* Every device of the first extra backend that has any, else the CPU. */
    for (size_t i = 0; i < n_extra; i++)
      if (extra[i]->probe() > 0)
        return extra[i]->open("", devs, n, err);
    return cpu->open("", devs, n, err);
  }
  const char *colon = strchr(spec, ':');
  size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *rest = colon ? colon + 1 : "";
  for (size_t i = 0; i <= n_extra; i++) {
    const spn__backend_t *b = i < n_extra ? extra[i] : cpu;
    if (strlen(b->kind_name) == klen && !strncmp(b->kind_name, spec, klen))
      return b->open(rest, devs, n, err);
  }
  char kinds[256];
  size_t w = (size_t)snprintf(kinds, sizeof kinds, "auto, cpu, cpu:N");
  for (size_t i = 0; i < n_extra && w < sizeof kinds; i++)
    w += (size_t)snprintf(kinds + w, sizeof kinds - w, ", %s, %s:N", extra[i]->kind_name, extra[i]->kind_name);
  return spn_error_set(err, SPN_EUNSUPPORTED, "devices \"%s\": no backend for \"%.*s\" in this build (it takes %s)",
                       spec, (int)klen, spec, kinds);
}

void spn__devices_free(spn_device_t ***devs, uint32_t n) {
  if (!devs || !*devs)
    return;
  for (uint32_t i = 0; i < n; i++)
    if ((*devs)[i])
      (*devs)[i]->iface->free((*devs)[i]);
  free(*devs);
  *devs = NULL;
}
