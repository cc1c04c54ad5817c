/* spindle/device.h — devices, buffer types, buffers, streams and events.
 *
 * Modelled on ggml-backend: a device offers buffer types (its own memory,
 * host memory, pinned host memory); a buffer type allocates buffers; work is
 * ordered on streams and synchronised with events. The CPU backend is real
 * (aligned host memory, synchronous streams) and is the numeric reference;
 * `devices = "cpu:4"` opens four CPU devices so multi-device logic runs
 * without GPUs. Other backends (CUDA in cuda/) implement the same vtable
 * (core/runtime/device-internal.h) and register with the runtime.
 *
 * Buffers are refcounted with atomics and tagged with their device; whoever
 * drops the last reference frees the memory, from any thread.
 */
#ifndef SPINDLE_DEVICE_H
#define SPINDLE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"
#include "spindle/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_device spn_device_t;
typedef struct spn_buffer_type spn_buffer_type_t;
typedef struct spn_buffer spn_buffer_t;
typedef struct spn_stream spn_stream_t;
typedef struct spn_event spn_event_t;

/* Also defined, identically, by spindle/plugin.h. */
#ifndef SPN_MEM_KIND_DEFINED
#define SPN_MEM_KIND_DEFINED
typedef enum spn_mem_kind {
  SPN_MEM_DEVICE = 0, /* the device's own memory (on a CPU device: host memory the runtime treats as device memory) */
  SPN_MEM_HOST = 1,   /* pageable host memory */
  SPN_MEM_PINNED = 2, /* page-locked host memory (plain host memory on CPU) */
} spn_mem_kind_t;
#endif

/* Kind (spn_device_kind_t), index within the kind, and "cpu:1" /
 * "cuda:0 NVIDIA A10G". Ownership: borrowed for the device's life. Thread: any. */
SPN_API int32_t spn_device_kind(const spn_device_t *dev);
SPN_API int32_t spn_device_index(const spn_device_t *dev);
SPN_API const char *spn_device_name(const spn_device_t *dev);
/* A buffer type of the device; never NULL for the three kinds above.
 * Ownership: borrowed. Thread: any. */
SPN_API spn_buffer_type_t *spn_device_buffer_type(spn_device_t *dev, int32_t mem_kind);

/* Allocate `size` bytes (64-byte aligned on the host). Ownership: caller owns
 * one reference to *out. Thread: any. */
SPN_API int32_t spn_buffer_type_alloc(spn_buffer_type_t *bt, size_t size, spn_buffer_t **out, spn_error_t *err);
/* Whether the type's memory is host-addressable. Ownership: bt borrowed. Thread: any. */
SPN_API bool spn_buffer_type_is_host(const spn_buffer_type_t *bt);

/* spn_buffer_data: Ownership: borrowed, valid while a reference is held. Thread: any. */
SPN_API void *spn_buffer_data(spn_buffer_t *buf);
/* Size, device and host-addressability of the buffer. Ownership: the device
 * is borrowed (the runtime's, for its life). Thread: any. */
SPN_API size_t spn_buffer_size(const spn_buffer_t *buf);
SPN_API spn_device_t *spn_buffer_device(const spn_buffer_t *buf);
SPN_API bool spn_buffer_is_host(const spn_buffer_t *buf);
/* The spn_mem_kind_t of the buffer type it came from. Ownership: none. Thread: any. */
SPN_API int32_t spn_buffer_mem_kind(const spn_buffer_t *buf);
/* Readiness: the event after which the buffer's contents are complete, or
 * NULL when they are complete already. spn_buffer_set_ready records a new
 * one on `s` (replacing the previous one); on a CPU stream (work runs when
 * issued) it records nothing. Ownership: the buffer owns the event.
 * Thread: the stream's executor; readers after the buffer was handed on. */
SPN_API spn_event_t *spn_buffer_ready_event(const spn_buffer_t *buf);
SPN_API int32_t spn_buffer_set_ready(spn_buffer_t *buf, spn_stream_t *s, spn_error_t *err);
/* Make `s` wait until buf is ready (a no-op when it is); a NULL `s` waits on
 * the calling thread. Ownership: borrowed. Thread: the stream's executor. */
SPN_API int32_t spn_buffer_wait_ready(spn_buffer_t *buf, spn_stream_t *s, spn_error_t *err);
/* New reference; returns buf. Thread: any. Ownership: caller owns one more reference (spn_buffer_unref). */
SPN_API spn_buffer_t *spn_buffer_ref(spn_buffer_t *buf);
/* Drop a reference and set *buf to NULL; the last one frees. Thread: any.
 * Ownership: consumes *buf, sets it to NULL. */
SPN_API void spn_buffer_unref(spn_buffer_t **buf);

/* Streams order work on a device; on the CPU work runs when issued.
 * Ownership: caller owns *out. Thread: the device's executor. */
SPN_API int32_t spn_stream_new(spn_device_t *dev, spn_stream_t **out, spn_error_t *err);
/* Free the stream and set *s to NULL (NULL is ignored). Ownership: consumes
 * *s. Thread: the device's executor. */
SPN_API void spn_stream_free(spn_stream_t **s);
/* Wait on the calling thread until the stream's work is done.
 * Ownership: borrowed. Thread: the device's executor. */
SPN_API int32_t spn_stream_synchronize(spn_stream_t *s, spn_error_t *err);
/* The backend's native handle (cudaStream_t), NULL on the CPU.
 * Ownership: borrowed, valid for the stream's life. Thread: the device's executor. */
SPN_API void *spn_stream_native(spn_stream_t *s);
/* Copy size bytes between two buffers (any devices) in stream order.
 * Ownership: dst and src borrowed; keep both referenced until the stream has
 * passed the copy. Thread: the device's executor. */
SPN_API int32_t spn_stream_copy(spn_stream_t *s, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                                size_t src_off, size_t size, spn_error_t *err);

/* spn_event_new: Ownership: caller owns *out (spn_event_free). Thread: the device's executor. */
SPN_API int32_t spn_event_new(spn_device_t *dev, spn_event_t **out, spn_error_t *err);
/* Free the event and set *ev to NULL (NULL is ignored). Ownership: consumes
 * *ev. Thread: the device's executor. */
SPN_API void spn_event_free(spn_event_t **ev);
/* Mark the point reached by `s`; event_synchronize waits for it on the host,
 * stream_wait_event makes another stream wait for it. Ownership: borrowed. Thread: the device's executor. */
SPN_API int32_t spn_event_record(spn_event_t *ev, spn_stream_t *s, spn_error_t *err);
SPN_API int32_t spn_event_synchronize(spn_event_t *ev, spn_error_t *err);
SPN_API int32_t spn_stream_wait_event(spn_stream_t *s, spn_event_t *ev, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
