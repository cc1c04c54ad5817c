/* spindle/plugin-cuda.h — the CUDA side of the frame filter helper (ABI 1.1).
 *
 * For a stage whose frame mapping has a CUDA kernel. Include it instead of
 * spindle/plugin.h from a plugin built with the CUDA toolkit (it includes
 * <cuda_runtime_api.h>; define SPN_PLUGIN_CUDA_MAJOR to the toolkit's major,
 * `pkg-config --variable=cuda_major spindle-plugin`, so the loader accepts
 * the plugin). Still no host symbols: the plugin links libcudart only.
 *
 * spn_frame_filter_process_cuda runs f->cuda with device pointers and the
 * instance's stream when the instance is placed on a CUDA device, and f->cpu
 * when it is placed on the CPU, so one kind with device_need = EITHER has a
 * GPU body and its CPU twin. A frame that arrives in host memory on a GPU
 * instance is uploaded first (one copy on the instance's stream: the host's
 * buffer_copy, counted for the stage and the job, or, on an earlier 1.1 host
 * without it, cudaMemcpyAsync); the output always stays on the device
 * (tensor device_kind CUDA). The inputs the batch read are released when
 * it ends: device memory of the instance's GPU at once (the device layer
 * frees it after the work queued so far), host memory (a frame uploaded
 * here) after one wait for the stream.
 */
#ifndef SPINDLE_PLUGIN_CUDA_H
#define SPINDLE_PLUGIN_CUDA_H

#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "spindle/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether releasing held[0..n) must wait for the instance's stream first:
 * when one of them is host or pinned memory (freed at once, while a queued
 * upload may still read it) or another device's memory. The instance's own
 * device memory needs no wait: the device layer orders its free after the
 * work queued on every stream of the device so far (device-cuda.c), and the
 * pool hands a block out again only once that free has run. */
static inline bool spn__cuda_held_need_wait(spn_stage_t *stage, spn_buffer_t *const *held, size_t n) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (!SPN_HOST_HAS(host, buffer_device))
    return true;
  int32_t kind = SPN_DEVICE_CPU, index = 0;
  host->stage_get_device(stage, &kind, &index);
  for (size_t i = 0; i < n; i++) {
    int32_t bk = SPN_DEVICE_CPU, bi = -1;
    if (host->buffer_mem_kind(held[i]) != SPN_MEM_DEVICE)
      return true;
    host->buffer_device(held[i], &bk, &bi);
    if (bk != kind || bi != index)
      return true;
  }
  return false;
}

/* Release the buffers a batch's queued work may still use: the instance's
 * device memory at once (its free is ordered after that work), anything
 * else once the instance's stream has passed them, one wait for the whole
 * batch. A failed wait is the batch's error (naming the stage); the buffers
 * are released either way. Without the wait, the batch's frames already
 * went out with their readiness events (buffer_set_ready): the executor
 * thread, which every stage placed on the GPU shares, goes on to queue
 * other work while the GPU runs this batch's. Ownership: consumes
 * held[0..n) and the array. Thread: stage. */
static inline int32_t spn__cuda_release_held(spn_stage_t *stage, spn_buffer_t **held, size_t n, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t rc = SPN_OK;
  if (n && spn__cuda_held_need_wait(stage, held, n)) {
    cudaError_t ce = cudaStreamSynchronize((cudaStream_t)host->stage_get_stream(stage));
    if (ce != cudaSuccess)
      rc = spn_error_set(err, SPN_ECUDA, "%s: waiting for the stream: %s (%s)", host->stage_get_name(stage),
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
  }
  for (size_t i = 0; i < n; i++)
    host->buffer_unref(&held[i]);
  free(held);
  return rc;
}

/* The process callback of a frame filter with a CUDA body (see
 * spn_frame_filter_process for the CPU-only one). Failures of a frame
 * (bad input, a CUDA error) fail that frame's job only; out of memory fails
 * the batch, and so does a failed wait for the stream at its end. The
 * buffers the batch's queued work reads or writes (each input, its upload,
 * the output of a frame that failed) stay referenced until that one wait:
 * a buffer's last reference returns its memory to the pool, which may hand
 * it to another stream at once. Ownership: consumes msgs[0..n) (emitted,
 * replaced or freed, set to NULL). Thread: stage (the instance's GPU
 * executor). */
static inline int32_t spn_frame_filter_process_cuda(spn_stage_t *stage, void *state, spn_msg_t **msgs, size_t n,
                                                    const spn_frame_filter_t *f, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t dev_kind = SPN_DEVICE_CPU, dev_index = 0;
  host->stage_get_device(stage, &dev_kind, &dev_index);
  bool on_cuda = dev_kind == SPN_DEVICE_CUDA && f->cuda;
  /* At most three a frame: its input, its upload, a failed frame's output. */
  spn_buffer_t **held = NULL;
  size_t n_held = 0;
  if (on_cuda && n && !(held = (spn_buffer_t **)calloc(3 * n, sizeof *held)))
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory for a batch of %zu frames", host->stage_get_name(stage),
                         n);
  for (size_t i = 0; i < n; i++) {
    int64_t idx = host->msg_find(msgs[i], f->item ? f->item : "frame");
    spn_item_t it;
    memset(&it, 0, sizeof it); /* (no designated initialisers: C++ includes this too) */
    it.struct_size = sizeof it;
    int32_t rc = SPN_OK;
    char why[200] = "";
    spn_buffer_t *up = NULL;
    if (idx < 0 || host->msg_item(msgs[i], (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR) {
      rc = host->emit(stage, 0, &msgs[i], err); /* nothing to map: forwarded */
      if (rc != SPN_OK) {
        spn__cuda_release_held(stage, held, n_held, NULL);
        return rc;
      }
      continue;
    }
    if (!on_cuda && !f->cpu) {
      snprintf(why, sizeof why, "%s: this filter has no CPU body; place the stage on a CUDA device",
               host->stage_get_name(stage));
    } else if (!on_cuda && it.tensor.device_kind != SPN_DEVICE_CPU) {
      snprintf(why, sizeof why, "%s: item \"%s\" is in device memory but the stage runs on the CPU",
               host->stage_get_name(stage), it.name);
    } else if (on_cuda && it.tensor.device_kind != SPN_DEVICE_CUDA) {
      /* Host frame on a GPU instance: one upload on the instance's stream. */
      size_t nb = spn_tensor_nbytes(&it.tensor);
      if ((rc = host->buffer_new(stage, nb, &up, err)) != SPN_OK) {
        spn__cuda_release_held(stage, held, n_held, NULL);
        return rc;
      }
      if (SPN_HOST_HAS(host, buffer_copy)) {
        /* Counted for the stage and the job (what crossed PCIe). */
        spn_error_t cerr = SPN_ERROR_INIT;
        if (host->buffer_copy(stage, host->msg_envelope(msgs[i])->job_id, up, 0, it.buffer, 0, nb, &cerr) != SPN_OK)
          snprintf(why, sizeof why, "%.60s: uploading \"%.40s\": %.80s", host->stage_get_name(stage), it.name,
                   cerr.msg);
      } else { /* an earlier 1.1 host: the same copy, uncounted */
        cudaError_t ce = cudaMemcpyAsync(host->buffer_data(up), host->buffer_data(it.buffer), nb,
                                         cudaMemcpyHostToDevice, (cudaStream_t)host->stage_get_stream(stage));
        if (ce != cudaSuccess)
          snprintf(why, sizeof why, "%s: uploading \"%s\" (%zu bytes): %s", host->stage_get_name(stage), it.name,
                   nb, cudaGetErrorString(ce));
      }
      it.tensor.data = host->buffer_data(up);
    } else {
      it.tensor.data = host->buffer_data(it.buffer);
    }
    if (why[0]) {
      host->fail_job(stage, host->msg_envelope(msgs[i])->job_id, SPN_EUNSUPPORTED, why);
      host->msg_free(&msgs[i]);
      host->buffer_unref(&up);
      continue;
    }
    if (on_cuda) {
      /* The input message goes inside spn__frame_filter_one while the
       * kernels (or the upload) may still read its buffer. */
      if (it.buffer)
        held[n_held++] = host->buffer_ref(it.buffer);
      if (up)
        held[n_held++] = up;
      up = NULL;
    }
    spn_buffer_t *kept = NULL;
    rc = spn__frame_filter_one(stage, state, &msgs[i], (size_t)idx, &it.tensor, on_cuda, f, on_cuda ? &kept : NULL,
                               err);
    if (kept)
      held[n_held++] = kept;
    if (rc != SPN_OK) {
      spn__cuda_release_held(stage, held, n_held, NULL);
      return rc;
    }
  }
  return spn__cuda_release_held(stage, held, n_held, err);
}

/* A device scratch buffer of the instance, kept from call to call: *buf
 * grows to at least n bytes (plus `slack` more when it has to grow, so a
 * size that creeps up does not regrow every time). A smaller buffer is
 * released once the instance's stream has passed the work queued on it
 * (the pool may hand its memory out again at once). Ownership: *buf is the
 * caller's reference (buffer_unref it after the stream's last use).
 * Thread: stage (the instance's GPU executor). */
static inline int32_t spn_cuda_scratch(spn_stage_t *stage, spn_buffer_t **buf, size_t n, size_t slack,
                                       spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (*buf && host->buffer_size(*buf) >= n)
    return SPN_OK;
  if (*buf) {
    cudaError_t ce = cudaStreamSynchronize((cudaStream_t)host->stage_get_stream(stage));
    host->buffer_unref(buf);
    if (ce != cudaSuccess)
      return spn_error_set(err, SPN_ECUDA, "%s: waiting for the stream: %s (%s)", host->stage_get_name(stage),
                           cudaGetErrorString(ce), cudaGetErrorName(ce));
  }
  return host->buffer_new_kind(stage, n + slack, SPN_MEM_DEVICE, buf, err);
}

#ifdef __cplusplus
}
#endif
#endif
