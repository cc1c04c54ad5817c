/* msg.c — messages: an envelope plus items, and their wire format.
 *
 * Inside a process a message is handed over by pointer: only the handle
 * crosses a ZeroMQ socket. Tensor items hold a reference to a refcounted
 * buffer, so forwarding a frame copies nothing; meta items own a copy of
 * their bytes. Exactly one owner frees a message (spn__msg_free), and the
 * buffers go when their last reference does.
 *
 * Across processes (ipc/tcp edges) a message is serialized with the framing
 * described in docs/architecture.md; the parser checks every length against
 * what is left and names the byte offset of anything malformed. */
#include <stdlib.h>
#include <string.h>

#include "runtime-internal.h"

int32_t spn__msg_new(const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err) {
  spn_msg_t *m = malloc(sizeof *m);
  if (!m)
    return spn_error_set(err, SPN_ENOMEM, "out of memory allocating a message");
  memset(&m->env, 0, sizeof m->env);
  if (env) {
    size_t n = env->struct_size && env->struct_size < sizeof *env ? env->struct_size : sizeof *env;
    memcpy(&m->env, env, n);
  } else {
    m->env.total = -1;
  }
  m->env.struct_size = sizeof m->env;
  m->n_items = m->cap_items = 0;
  m->attempt = 0;
  m->items = NULL;
  m->harness_id = 0;
  *out = m;
  return SPN_OK;
}

static void item_clear(spn__item_t *it) {
  free(it->name);
  spn_buffer_unref(&it->buffer);
  free(it->meta);
}

void spn__msg_free(spn_msg_t **msg) {
  if (!msg || !*msg)
    return;
  spn_msg_t *m = *msg;
  for (uint32_t i = 0; i < m->n_items; i++)
    item_clear(&m->items[i]);
  free(m->items);
  free(m);
  *msg = NULL;
}

static spn__item_t *item_push(spn_msg_t *m) {
  if (m->n_items == m->cap_items) {
    uint32_t cap = m->cap_items ? m->cap_items * 2 : 4;
    spn__item_t *v = realloc(m->items, cap * sizeof *v);
    if (!v)
      return NULL;
    m->items = v;
    m->cap_items = cap;
  }
  spn__item_t *it = &m->items[m->n_items];
  memset(it, 0, sizeof *it);
  return it;
}

int32_t spn__msg_clone(const spn_msg_t *src, spn_msg_t **out, spn_error_t *err) {
  spn_msg_t *m;
  int32_t rc = spn__msg_new(&src->env, &m, err);
  if (rc != SPN_OK)
    return rc;
  for (uint32_t i = 0; i < src->n_items; i++) {
    const spn__item_t *s = &src->items[i];
    spn__item_t *d = item_push(m);
    if (!d)
      goto out_nomem;
    d->kind = s->kind;
    d->name = strdup(s->name ? s->name : "");
    if (!d->name)
      goto out_nomem;
    m->n_items++;
    d->tensor = s->tensor;
    if (s->buffer)
      d->buffer = spn_buffer_ref(s->buffer);
    if (s->meta_size) {
      d->meta = malloc(s->meta_size);
      if (!d->meta)
        goto out_nomem;
      memcpy(d->meta, s->meta, s->meta_size);
      d->meta_size = s->meta_size;
    }
  }
  *out = m;
  return SPN_OK;
out_nomem:
  spn__msg_free(&m);
  return spn_error_set(err, SPN_ENOMEM, "out of memory copying a message");
}

/* ---- host table: messages --------------------------------------------------- */

int32_t spn__host_msg_add_tensor(spn_msg_t *msg, const char *name, const spn_tensor_t *t, spn_buffer_t *buf,
                                 spn_error_t *err) {
  if (!msg || !name || !t || !buf)
    return spn_error_set(err, SPN_EINVAL, "msg_add_tensor: NULL argument");
  if (spn_dtype_size(t->dtype) == 0 || t->ndim < 0 || t->ndim > SPN_TENSOR_MAX_DIMS)
    return spn_error_set(err, SPN_EINVAL, "msg_add_tensor \"%s\": bad dtype %d or ndim %d", name, t->dtype, t->ndim);
  for (int32_t i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0)
      return spn_error_set(err, SPN_EINVAL, "msg_add_tensor \"%s\": negative dimension %d", name, i);
  if (spn_tensor_nbytes(t) > buf->size)
    return spn_error_set(err, SPN_EOVERFLOW, "msg_add_tensor \"%s\": tensor needs %zu bytes, buffer has %zu", name,
                         spn_tensor_nbytes(t), buf->size);
  spn__item_t *it = item_push(msg);
  if (!it || !(it->name = strdup(name)))
    return spn_error_set(err, SPN_ENOMEM, "out of memory adding item \"%s\"", name);
  it->kind = SPN_ITEM_TENSOR;
  memset(&it->tensor, 0, sizeof it->tensor);
  it->tensor.struct_size = sizeof it->tensor;
  it->tensor.dtype = t->dtype;
  it->tensor.ndim = t->ndim;
  memcpy(it->tensor.shape, t->shape, sizeof t->shape);
  /* Host and pinned memory of a GPU is CPU-addressable: a CPU tensor. */
  bool on_dev = buf->bt->device && (!buf->bt->iface->is_host || buf->bt->device->kind == SPN_DEVICE_CPU);
  it->tensor.device_kind = on_dev ? buf->bt->device->kind : SPN_DEVICE_CPU;
  it->tensor.device_index = on_dev ? buf->bt->device->index : 0;
  it->buffer = spn_buffer_ref(buf);
  msg->n_items++;
  return SPN_OK;
}

int32_t spn__host_msg_replace_tensor(spn_msg_t *msg, size_t i, const spn_tensor_t *t, spn_buffer_t *buf,
                                     spn_error_t *err) {
  if (!msg || !t || !buf)
    return spn_error_set(err, SPN_EINVAL, "msg_replace_tensor: NULL argument");
  if (i >= msg->n_items || msg->items[i].kind != SPN_ITEM_TENSOR)
    return spn_error_set(err, SPN_EINVAL, "msg_replace_tensor: item %zu is not a tensor item (the message has %u items)",
                         i, msg->n_items);
  spn__item_t *it = &msg->items[i];
  if (spn_dtype_size(t->dtype) == 0 || t->ndim < 0 || t->ndim > SPN_TENSOR_MAX_DIMS)
    return spn_error_set(err, SPN_EINVAL, "msg_replace_tensor \"%s\": bad dtype %d or ndim %d", it->name, t->dtype,
                         t->ndim);
  for (int32_t d = 0; d < t->ndim; d++)
    if (t->shape[d] < 0)
      return spn_error_set(err, SPN_EINVAL, "msg_replace_tensor \"%s\": negative dimension %d", it->name, d);
  if (spn_tensor_nbytes(t) > buf->size)
    return spn_error_set(err, SPN_EOVERFLOW, "msg_replace_tensor \"%s\": tensor needs %zu bytes, buffer has %zu",
                         it->name, spn_tensor_nbytes(t), buf->size);
  /* Reference the new buffer before dropping the old: they may be one. */
  spn_buffer_t *old = it->buffer;
  it->buffer = spn_buffer_ref(buf);
  spn_buffer_unref(&old);
  memset(&it->tensor, 0, sizeof it->tensor);
  it->tensor.struct_size = sizeof it->tensor;
  it->tensor.dtype = t->dtype;
  it->tensor.ndim = t->ndim;
  memcpy(it->tensor.shape, t->shape, sizeof t->shape);
  it->tensor.device_kind = buf->bt->device ? buf->bt->device->kind : SPN_DEVICE_CPU;
  it->tensor.device_index = buf->bt->device ? buf->bt->device->index : 0;
  return SPN_OK;
}

int32_t spn__host_msg_replace_meta(spn_msg_t *msg, size_t i, const void *data, size_t size, spn_error_t *err) {
  if (!msg || (size && !data))
    return spn_error_set(err, SPN_EINVAL, "msg_replace_meta: NULL argument");
  if (i >= msg->n_items || msg->items[i].kind != SPN_ITEM_META)
    return spn_error_set(err, SPN_EINVAL, "msg_replace_meta: item %zu is not a meta item (the message has %u items)",
                         i, msg->n_items);
  spn__item_t *it = &msg->items[i];
  void *copy = NULL;
  if (size) {
    if (!(copy = malloc(size)))
      return spn_error_set(err, SPN_ENOMEM, "out of memory replacing item \"%s\" (%zu bytes)", it->name, size);
    memcpy(copy, data, size);
  }
  free(it->meta);
  it->meta = copy;
  it->meta_size = size;
  return SPN_OK;
}

int32_t spn__host_msg_add_meta(spn_msg_t *msg, const char *name, const void *data, size_t size, spn_error_t *err) {
  if (!msg || !name || (size && !data))
    return spn_error_set(err, SPN_EINVAL, "msg_add_meta: NULL argument");
  spn__item_t *it = item_push(msg);
  if (!it || !(it->name = strdup(name)))
    return spn_error_set(err, SPN_ENOMEM, "out of memory adding item \"%s\"", name);
  it->kind = SPN_ITEM_META;
  if (size) {
    it->meta = malloc(size);
    if (!it->meta) {
      free(it->name);
      return spn_error_set(err, SPN_ENOMEM, "out of memory adding item \"%s\" (%zu bytes)", name, size);
    }
    memcpy(it->meta, data, size);
  }
  it->meta_size = size;
  msg->n_items++;
  return SPN_OK;
}

int32_t spn__host_msg_item(const spn_msg_t *msg, size_t i, spn_item_t *item) {
  if (!msg || !item || i >= msg->n_items)
    return SPN_EINVAL;
  if (item->struct_size < sizeof(spn_item_t))
    return SPN_EABI;
  const spn__item_t *s = &msg->items[i];
  item->kind = s->kind;
  item->name = s->name;
  item->tensor = s->tensor;
  item->buffer = s->buffer;
  if (s->buffer)
    item->tensor.data = s->buffer->data;
  item->meta = s->meta;
  item->meta_size = s->meta_size;
  return SPN_OK;
}

int64_t spn__host_msg_find(const spn_msg_t *msg, const char *name) {
  if (!msg || !name)
    return -1;
  for (uint32_t i = 0; i < msg->n_items; i++)
    if (!strcmp(msg->items[i].name, name))
      return i;
  return -1;
}

/* ---- wire format -------------------------------------------------------------- */

static int grow(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need)
    c *= 2;
  uint8_t *b = realloc(*buf, c);
  if (!b)
    return -1;
  *buf = b;
  *cap = c;
  return 0;
}

#define PUT(v)                                     \
  do {                                             \
    if (grow(buf, cap, *len + sizeof(v)))          \
      return SPN_ENOMEM;                           \
    memcpy(*buf + *len, &(v), sizeof(v));          \
    *len += sizeof(v);                             \
  } while (0)
#define PUTB(p, n)                                 \
  do {                                             \
    if (grow(buf, cap, *len + (n)))                \
      return SPN_ENOMEM;                           \
    if (n)                                         \
      memcpy(*buf + *len, (p), (n));               \
    *len += (n);                                   \
  } while (0)

int32_t spn__msg_serialize_append(const spn_msg_t *m, bool counted, uint8_t **buf, size_t *len, size_t *cap) {
  uint32_t flags = m->env.flags, stream = m->env.stream, n_items = m->n_items;
  uint32_t cflag = counted ? 1 : 0;
  PUT(flags);
  PUT(cflag);
  PUT(m->env.job_id);
  PUT(stream);
  PUT(m->env.seq);
  PUT(m->env.pts);
  PUT(m->env.total);
  PUT(n_items);
  for (uint32_t i = 0; i < m->n_items; i++) {
    const spn__item_t *it = &m->items[i];
    uint32_t kind = (uint32_t)it->kind, nlen = (uint32_t)strlen(it->name);
    PUT(kind);
    PUT(nlen);
    PUTB(it->name, nlen);
    if (it->kind == SPN_ITEM_TENSOR) {
      /* Device memory is staged to the host by the producing stage; the
       * wire only carries host bytes. */
      if (!spn_buffer_is_host(it->buffer))
        return SPN_EUNSUPPORTED;
      int32_t dtype = it->tensor.dtype, ndim = it->tensor.ndim;
      PUT(dtype);
      PUT(ndim);
      for (int32_t d = 0; d < ndim; d++)
        PUT(it->tensor.shape[d]);
      uint64_t nbytes = spn_tensor_nbytes(&it->tensor);
      PUT(nbytes);
      PUTB(it->buffer->data, (size_t)nbytes);
    } else {
      uint64_t n = it->meta_size;
      PUT(n);
      PUTB(it->meta, (size_t)n);
    }
  }
  return SPN_OK;
}

#define GET(v)                                                                                   \
  do {                                                                                           \
    if (len - p < sizeof(v)) {                                                                   \
      rc = spn_error_set(err, SPN_EPROTO, "message truncated at byte %zu (need %zu more)", p,    \
                         sizeof(v));                                                             \
      goto out_bad;                                                                              \
    }                                                                                            \
    memcpy(&(v), buf + p, sizeof(v));                                                            \
    p += sizeof(v);                                                                              \
  } while (0)

int32_t spn__msg_deserialize(const uint8_t *buf, size_t len, size_t *pos, spn_device_t *dev, spn_msg_t **out,
                             bool *counted, spn_error_t *err) {
  size_t p = *pos;
  int32_t rc;
  spn_msg_t *m = NULL;
  spn_envelope_t env = {.struct_size = sizeof env};
  uint32_t cflag = 0, n_items = 0;
  GET(env.flags);
  GET(cflag);
  GET(env.job_id);
  GET(env.stream);
  GET(env.seq);
  GET(env.pts);
  GET(env.total);
  GET(n_items);
  if (n_items > 4096) {
    rc = spn_error_set(err, SPN_EPROTO, "message at byte %zu: %u items is more than 4096", *pos, n_items);
    goto out_bad;
  }
  rc = spn__msg_new(&env, &m, err);
  if (rc != SPN_OK)
    return rc;
  for (uint32_t i = 0; i < n_items; i++) {
    uint32_t kind = 0, nlen = 0;
    GET(kind);
    GET(nlen);
    if (nlen > 1024 || len - p < nlen) {
      rc = spn_error_set(err, SPN_EPROTO, "item name at byte %zu: bad length %u", p, nlen);
      goto out_bad;
    }
    char name[1025];
    memcpy(name, buf + p, nlen);
    name[nlen] = '\0';
    p += nlen;
    if (kind == SPN_ITEM_TENSOR) {
      spn_tensor_t t = SPN_TENSOR_INIT;
      GET(t.dtype);
      GET(t.ndim);
      if (t.ndim < 0 || t.ndim > SPN_TENSOR_MAX_DIMS || spn_dtype_size(t.dtype) == 0) {
        rc = spn_error_set(err, SPN_EPROTO, "tensor \"%s\" at byte %zu: bad dtype %d or ndim %d", name, p, t.dtype,
                           t.ndim);
        goto out_bad;
      }
      for (int32_t d = 0; d < t.ndim; d++) {
        GET(t.shape[d]);
        if (t.shape[d] < 0 || t.shape[d] > (int64_t)1 << 40) {
          rc = spn_error_set(err, SPN_EPROTO, "tensor \"%s\": bad dimension %d before byte %zu", name, d, p);
          goto out_bad;
        }
      }
      uint64_t nbytes = 0;
      GET(nbytes);
      if (nbytes != spn_tensor_nbytes(&t) || len - p < nbytes) {
        rc = spn_error_set(err, SPN_EPROTO, "tensor \"%s\" at byte %zu: %llu data bytes do not match its shape or "
                           "the frame", name, p, (unsigned long long)nbytes);
        goto out_bad;
      }
      spn_buffer_t *b = NULL;
      rc = spn_buffer_type_alloc(spn_device_buffer_type(dev, SPN_MEM_HOST), (size_t)nbytes, &b, err);
      if (rc != SPN_OK)
        goto out_bad;
      memcpy(b->data, buf + p, (size_t)nbytes);
      p += (size_t)nbytes;
      rc = spn__host_msg_add_tensor(m, name, &t, b, err);
      spn_buffer_unref(&b);
      if (rc != SPN_OK)
        goto out_bad;
    } else if (kind == SPN_ITEM_META) {
      uint64_t n = 0;
      GET(n);
      if (len - p < n) {
        rc = spn_error_set(err, SPN_EPROTO, "meta \"%s\" at byte %zu: %llu bytes past the end", name, p,
                           (unsigned long long)n);
        goto out_bad;
      }
      rc = spn__host_msg_add_meta(m, name, buf + p, (size_t)n, err);
      if (rc != SPN_OK)
        goto out_bad;
      p += (size_t)n;
    } else {
      rc = spn_error_set(err, SPN_EPROTO, "item \"%s\" before byte %zu: unknown kind %u", name, p, kind);
      goto out_bad;
    }
  }
  *pos = p;
  *counted = cflag != 0;
  *out = m;
  return SPN_OK;
out_bad:
  spn__msg_free(&m);
  return rc;
}
