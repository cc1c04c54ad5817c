/* stage-lipsync.c — `lipsync`, Wav2Lip on frames with faces and mel chunks.
 *
 * Input port "video" (type "faces": frames with a tensor item "frame",
 * (H,W,3) u8 RGB, and a metadata item "faces", as facedetect emits them) and
 * input port "mel" (type "mel": one tensor item "mel", 80×16 f32, per video
 * frame, as melspec emits them). Both arrive in process() mixed, from any
 * number of jobs; they are told apart by item name. Output port "video"
 * (type "video", so superres or an encoder can follow): every input frame,
 * in seq order, still carrying its "faces" item, the mouth region redrawn
 * where the frame has a face and a mel chunk.
 *
 * The join: each job keeps a window of slots keyed by seq, starting at the
 * next seq to emit. A slot is filled by its frame and its mel chunk. It is
 * *runnable* when both are there and the frame has a usable face; it is
 * *done* when it was run, or needs no run: no face (or a crop with nothing
 * inside the frame), or no mel chunk will ever come for it (seq beyond the
 * mel stream's `total`, or the job's streams ended). After each process()
 * call the runnable slots of all jobs are packed into batches of up to
 * `batch_size` and run through the model together; then every job emits its
 * done slots from the head of its window, so output stays in seq order.
 *
 * Audio and video out of step: chunks pair with frames by seq, so chunks
 * cut at another rate than the video's drift from its frames (25 for a 30
 * fps video: a frame more every sixth of a second), and chunks of a speech that starts
 * elsewhere than the video (a video cut at decode's start, its speech
 * not) are off from the first. Each pair's times are compared (the
 * frame's pts, the chunk's: melspec gives it on the speech's clock, which
 * the encoder plays from the first frame's time); a job whose pair is a
 * whole chunk interval apart is warned once, naming both (melspec's fps =
 * 0 takes the video's rate; the param `start` sets melspec's start with
 * decode's; a `--set decode.path` that left melspec's video behind, or a
 * config that cuts the video alone, is what this catches).
 *
 * Audio and video of different lengths: Wav2Lip cuts the video to the
 * audio's mel chunks (and loops the frames if the audio is longer). A
 * stream must not lose frames, so here the video rules: frames beyond the
 * audio pass through unchanged, mel chunks beyond the video are dropped.
 *
 * Frames are never modified in place (an output may feed several stages that
 * share the buffer): a synced frame is copied into a new buffer first; an
 * untouched frame is forwarded by reference. The stage must have a single
 * instance per job's frames: replicas would each see only part of a job's
 * seqs.
 *
 * On a CUDA device (a build with CUDA; the kind runs on either side) the
 * frames stay in that GPU's memory: a host frame is uploaded once when it
 * arrives, the batch's crops are prepared by kernels into a device batch,
 * Wav2Lip runs on the engine's CUDA backend with its output left on the
 * device, and each synced frame is a device copy with the mouth pasted by
 * kernels (wav2lip-cuda.c, the twins of wav2lip.c). The mel input is a
 * device batch too: a job whose mel source sends its whole spectrogram
 * (melspec does, with seq 0: wav2lip.h, SPN_W2L_SPEC_ITEM) has it uploaded
 * once and kept until the job closes, and its rows are cut from it by a
 * gather kernel, 80×16 windows starting where spn_w2l_mel_start says, so
 * its chunks never cross PCIe; the chunks of a job without one (another mel
 * source, a spectrogram over 16 MiB) are uploaded into their rows, 5 KB a
 * synced frame, as the one copy per batch and job. A batch may mix both.
 * Every upload is the stage's buffer_copy, counted for the stage and the
 * job. A batch does not wait for the GPU: its pasted frames go downstream
 * with their ready events, and the input frames it replaced are released at
 * once (this GPU's memory returns to the pool only after the work queued on
 * the device; a host that cannot say where a buffer lives gets one wait a
 * batch, as before). The waits are once per job after its spectrogram's upload,
 * before the message holding it goes; per frame that arrives in host memory
 * or on another GPU, after its upload, for the same reason; and, for jobs
 * without a spectrogram on the device, before a batch rewrites the pinned
 * staging of mel chunks that the last batch's upload may still read.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef SPN_LIPSYNC_CUDA
#include "spindle/plugin-cuda.h"
#else
#include "spindle/plugin.h"
#endif
#include "wav2lip.h"


/* The most seqs a job may buffer ahead of the oldest one still waiting for
 * its frame or mel chunk: a job whose inputs drift further apart (or that
 * feeds this stage from two different jobs' streams) is failed rather than
 * buffered without end. */
#define LS_MAX_WINDOW (1u << 20)

typedef struct ls_config {
  char *model;
  int64_t pad_top, pad_bottom, pad_left, pad_right;
  int64_t batch_size;
  double feather;
} ls_config_t;

static const spn_config_field_t ls_schema[] = {
    {.key = "model", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_REQUIRED, .offset = offsetof(ls_config_t, model),
     .doc = "Wav2Lip ONNX model: inputs mel (N,1,80,16) and face (N,6,96,96), output (N,3,96,96)"},
    {.key = "pad_top", .type = SPN_CONFIG_INT, .offset = offsetof(ls_config_t, pad_top),
     .doc = "pixels added above the face box (Wav2Lip --pads, 1st)", .def_int = 0, .min = -4096, .max = 4096},
    {.key = "pad_bottom", .type = SPN_CONFIG_INT, .offset = offsetof(ls_config_t, pad_bottom),
     .doc = "pixels added below the face box (Wav2Lip --pads, 2nd; includes the chin)", .def_int = 10,
     .min = -4096, .max = 4096},
    {.key = "pad_left", .type = SPN_CONFIG_INT, .offset = offsetof(ls_config_t, pad_left),
     .doc = "pixels added left of the face box (Wav2Lip --pads, 3rd)", .def_int = 0, .min = -4096, .max = 4096},
    {.key = "pad_right", .type = SPN_CONFIG_INT, .offset = offsetof(ls_config_t, pad_right),
     .doc = "pixels added right of the face box (Wav2Lip --pads, 4th)", .def_int = 0, .min = -4096, .max = 4096},
    {.key = "batch_size", .type = SPN_CONFIG_INT, .offset = offsetof(ls_config_t, batch_size),
     .doc = "faces per model run, across jobs (Wav2Lip's wav2lip_batch_size)", .def_int = 128, .min = 1,
     .max = 4096},
    {.key = "feather", .type = SPN_CONFIG_FLOAT, .offset = offsetof(ls_config_t, feather),
     .doc = "width in pixels of the soft edge when pasting the mouth back (0: hard paste)", .def_float = 4.0,
     .min = 0.0, .max = 1000.0},
    {0},
};

static const spn_port_t ls_inputs[] = {{.name = "video", .type = "faces"}, {.name = "mel", .type = "mel"}};
static const spn_port_t ls_outputs[] = {{.name = "video", .type = "video"}};

/* One seq of a job: its frame (and faces) and its mel chunk. */
typedef struct ls_slot {
  bool have_frame, have_mel, done, failed_run;
  spn_envelope_t env;        /* the frame's envelope */
  spn_buffer_t *buf;         /* the frame's pixels (a reference), or the synced copy once done */
  spn_tensor_t t;            /* (H,W,3) u8 */
  spn_face_t *faces;         /* copy of the "faces" item; NULL and 0 when absent */
  size_t n_faces;
  bool has_faces_item;
  bool has_rect;
  spn_w2l_rect_t rect;
  double mel_pts;            /* the chunk's envelope pts: seconds of the speech */
  float mel[SPN_W2L_MEL_FLOATS];
} ls_slot_t;

typedef struct ls_job {
  uint64_t job_id;
  bool failed;
  bool ended;          /* flush: no more input of any kind */
  int64_t mel_total;   /* from the mel envelopes; -1 unknown */
  uint64_t next_emit;  /* seq of the window's head */
  ls_slot_t **win;     /* ring of cap slots; win[(head + k) % cap] is seq next_emit + k */
  size_t cap, head;
  struct ls_job *next; /* the state's list of open jobs */
  /* On a GPU instance: the job's whole spectrogram in its memory, when the
   * mel source sent one (take_spec), and the fps its chunks are cut at. */
  spn_buffer_t *d_spec; /* (80, spec_frames) f32 */
  int64_t spec_frames;
  double spec_fps;
  int64_t spec_first;   /* the spectrogram's chunk of seq 0 (a job cut at a start) */
  bool spec_refused;    /* one was sent and left aside (logged once) */
  bool have_mel0;       /* chunk seq 0 came: mel_pts0 is its pts */
  double mel_pts0;
  bool have_pts0;       /* frame seq 0 came: pts0 is its pts */
  double pts0;
  bool drift_warned;    /* chunks and frames drifted apart (warned once) */
} ls_job_t;

typedef struct ls_state {
  ls_config_t cfgv; /* copy of the stage config; its strings are host-owned */
  const ls_config_t *cfg;
  spn_w2l_pads_t pads;
  spn_model_t *model;
  int32_t in_face, in_mel; /* model input indices */
  size_t bs;
  float *face_buf; /* (bs,6,96,96) */
  float *mel_buf;  /* (bs,1,80,16) */
  float *out_buf;  /* (bs,3,96,96) */
  ls_slot_t **run; /* runnable slots gathered for one batch */
  ls_job_t **run_job;
  ls_job_t *jobs;
  /* On a GPU instance: the batch in device memory, the paste's scratch, and
   * the frames a batch replaced (released at its end: spindle/plugin-cuda.h,
   * spn__cuda_held_need_wait). */
  spn_buffer_t *d_face, *d_out, *d_small, *d_big, *d_mask;
  spn_buffer_t **retired;
  /* The batch's mel input on the device, the pinned staging of the chunks
   * of jobs without a spectrogram there, the gather's rows. */
  spn_buffer_t *d_mel, *h_mel;
#ifdef SPN_LIPSYNC_CUDA
  spn_w2l_mel_src_t *mel_src;
  /* Recorded after the last batch's uploads from h_mel (h_mel_queued):
   * the next batch waits for it before writing h_mel again. */
  cudaEvent_t h_mel_ev;
  bool h_mel_queued;
#endif
} ls_state_t;

/* Whether this instance runs on a GPU (only in a build with CUDA); *index
 * its runtime device index. */
static bool on_gpu(spn_stage_t *stage, int32_t *index) {
  int32_t kind = SPN_DEVICE_CPU, idx = 0;
  spn_stage_host(stage)->stage_get_device(stage, &kind, &idx);
  if (index)
    *index = idx;
#ifdef SPN_LIPSYNC_CUDA
  return kind == SPN_DEVICE_CUDA;
#else
  return false;
#endif
}

#ifdef SPN_LIPSYNC_CUDA
/* n bytes from src at src_off to dst at dst_off on the instance's stream,
 * for job `job_id`: the host's buffer_copy, counted for the stage and the
 * job, or on an earlier 1.1 host without it the same cudaMemcpyAsync,
 * uncounted (its error then says `what`, when given). */
static int32_t stage_copy(spn_stage_t *stage, uint64_t job_id, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                          size_t src_off, size_t n, const char *what, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (SPN_HOST_HAS(host, buffer_copy))
    return host->buffer_copy(stage, job_id, dst, dst_off, src, src_off, n, err);
  cudaError_t ce = cudaMemcpyAsync((char *)host->buffer_data(dst) + dst_off,
                                   (const char *)host->buffer_data(src) + src_off, n, cudaMemcpyDefault,
                                   (cudaStream_t)host->stage_get_stream(stage));
  if (ce == cudaSuccess)
    return SPN_OK;
  return what ? spn_error_set(err, SPN_ECUDA, "%s: %s", what, cudaGetErrorString(ce))
              : spn_error_set(err, SPN_ECUDA, "%s", cudaGetErrorString(ce));
}
#endif

/* ---- slots ---------------------------------------------------------------------------- */

static void slot_free(const spn_host_api_t *host, ls_slot_t **sp) {
  ls_slot_t *s = *sp;
  if (!s)
    return;
  if (s->buf)
    host->buffer_unref(&s->buf);
  free(s->faces);
  free(s);
  *sp = NULL;
}

/* The slot of `seq`, created when absent. NULL with a message in `why`
 * when the seq is behind the head (already emitted: a duplicate) or too far
 * ahead, or memory runs out. */
static ls_slot_t *slot_get(ls_job_t *j, uint64_t seq, char *why, size_t why_len) {
  if (seq < j->next_emit) {
    snprintf(why, why_len, "seq %llu arrived twice (already emitted)", (unsigned long long)seq);
    return NULL;
  }
  uint64_t off = seq - j->next_emit;
  if (off >= LS_MAX_WINDOW) {
    snprintf(why, why_len,
             "seq %llu is %llu ahead of seq %llu still waiting for its frame or mel chunk (limit %u): "
             "are both inputs from the same job?",
             (unsigned long long)seq, (unsigned long long)off, (unsigned long long)j->next_emit, LS_MAX_WINDOW);
    return NULL;
  }
  if (off >= j->cap) {
    size_t ncap = j->cap ? j->cap : 64;
    while (ncap <= off)
      ncap *= 2;
    ls_slot_t **nw = calloc(ncap, sizeof *nw);
    if (!nw) {
      snprintf(why, why_len, "out of memory buffering seq %llu", (unsigned long long)seq);
      return NULL;
    }
    for (size_t k = 0; k < j->cap; k++)
      nw[k] = j->win[(j->head + k) % j->cap];
    free(j->win);
    j->win = nw;
    j->cap = ncap;
    j->head = 0;
  }
  ls_slot_t **sp = &j->win[(j->head + off) % j->cap];
  if (!*sp) {
    *sp = calloc(1, sizeof **sp);
    if (!*sp)
      snprintf(why, why_len, "out of memory buffering seq %llu", (unsigned long long)seq);
  }
  return *sp;
}

static ls_slot_t *slot_at(const ls_job_t *j, size_t off) {
  return off < j->cap ? j->win[(j->head + off) % j->cap] : NULL;
}

static void job_fail(spn_stage_t *stage, ls_job_t *j, int32_t status, const char *msg) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (j->failed)
    return;
  j->failed = true;
  host->fail_job(stage, j->job_id, status, msg);
}

/* A frame needs no model run when it has no usable face, or when its mel
 * chunk will never come. */
static void slot_settle(const ls_job_t *j, ls_slot_t *s) {
  if (!s->have_frame || s->done)
    return;
  if (!s->has_rect)
    s->done = true;
  else if (!s->have_mel && (j->ended || (j->mel_total >= 0 && s->env.seq >= (uint64_t)j->mel_total)))
    s->done = true;
}

/* ---- input ---------------------------------------------------------------------------- */

/* A slot with both its frame and its chunk: whether their times agree
 * (see the file's header): the frame's pts on the input's clock, the
 * chunk's on the speech's; the chunks' interval from chunk 0's pts, the
 * video's rate (for the message) from frame 0's. */
static void check_drift(spn_stage_t *stage, ls_job_t *j, const ls_slot_t *s) {
  if (j->drift_warned || !j->have_mel0 || !s->have_frame || !s->have_mel || s->env.seq == 0)
    return;
  double ft = s->env.pts, mt = s->mel_pts;
  double step = (mt - j->mel_pts0) / (double)s->env.seq; /* the chunks' interval */
  if (!(step > 0) || fabs(ft - mt) < step)
    return;
  j->drift_warned = true;
  char rates[96] = ""; /* where the rates differ (by more than 1%) */
  double vfps = j->have_pts0 && ft > j->pts0 ? (double)s->env.seq / (ft - j->pts0) : 0;
  if (vfps > 0 && fabs(vfps * step - 1.0) > 0.01)
    snprintf(rates, sizeof rates, " (chunks at %.3g fps, the video at about %.3g fps)", 1.0 / step, vfps);
  spn_stage_host(stage)->log(
      stage, j->job_id, SPN_LOG_WARN,
      "the speech is out of step with the video: frame %llu is at %.3f s of the video and its mel chunk at %.3f s "
      "of the speech%s, so the lips %s the speech; melspec must cut the chunks at the video's rate and from its "
      "start (fps = 0 takes the rate of melspec.video, which must be the job's video; its start must be decode's: "
      "the input `video` and the param `start` set both)",
      (unsigned long long)s->env.seq, ft, mt, rates, ft < mt ? "lead" : "lag");
}

static void take_frame(spn_stage_t *stage, ls_state_t *st, ls_job_t *j, spn_msg_t *m, int64_t fidx) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const spn_envelope_t *env = host->msg_envelope(m);
  char why[512];
  spn_item_t it = {.struct_size = sizeof it};
  if (host->msg_item(m, (size_t)fidx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR) {
    snprintf(why, sizeof why, "input \"video\" seq %llu: item \"frame\" is not a tensor",
             (unsigned long long)env->seq);
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
  const spn_tensor_t *t = &it.tensor;
  int32_t dev_index = 0;
  bool gpu = on_gpu(stage, &dev_index);
  if (t->dtype != SPN_DTYPE_U8 || t->ndim != 3 || t->shape[2] != 3 || t->shape[0] <= 0 || t->shape[1] <= 0 ||
      t->shape[0] > INT32_MAX / 4 || t->shape[1] > INT32_MAX / 4 || (t->device_kind != SPN_DEVICE_CPU && !gpu)) {
    snprintf(why, sizeof why, "input \"video\" seq %llu: frame must be an (H,W,3) u8 RGB tensor in %s",
             (unsigned long long)env->seq, gpu ? "host or device memory" : "host memory");
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
  ls_slot_t *s = slot_get(j, env->seq, why, sizeof why);
  if (!s) {
    char msg[600];
    snprintf(msg, sizeof msg, "input \"video\": %s", why);
    job_fail(stage, j, SPN_EINVAL, msg);
    return;
  }
  if (s->have_frame) {
    snprintf(why, sizeof why, "input \"video\": seq %llu arrived twice", (unsigned long long)env->seq);
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
  /* Faces: optional; a malformed item is an error, an absent one means no face. */
  int64_t fa = host->msg_find(m, "faces");
  if (fa >= 0) {
    spn_item_t fi = {.struct_size = sizeof fi};
    if (host->msg_item(m, (size_t)fa, &fi) != SPN_OK || fi.kind != SPN_ITEM_META ||
        fi.meta_size % sizeof(spn_face_t) != 0) {
      snprintf(why, sizeof why, "input \"video\" seq %llu: item \"faces\" is not a whole number of spn_face_t",
               (unsigned long long)env->seq);
      job_fail(stage, j, SPN_EINVAL, why);
      return;
    }
    s->has_faces_item = true;
    s->n_faces = fi.meta_size / sizeof(spn_face_t);
    if (s->n_faces) {
      s->faces = malloc(fi.meta_size);
      if (!s->faces) {
        job_fail(stage, j, SPN_ENOMEM, "out of memory copying faces");
        return;
      }
      memcpy(s->faces, fi.meta, fi.meta_size);
    }
  }
  s->env = *env;
  s->t = *t;
  s->t.data = NULL;
  /* Keep the pixels by reference when the tensor is the whole buffer from
   * its start (what msg_add_tensor makes) and where this instance works
   * (host memory on the CPU, this GPU's memory on a GPU); otherwise copy
   * them there. */
  size_t nb = spn_tensor_nbytes(t);
  bool here = gpu ? t->device_kind == SPN_DEVICE_CUDA && t->device_index == dev_index
                  : t->device_kind == SPN_DEVICE_CPU;
  if (here && it.buffer && host->buffer_data(it.buffer) == t->data && host->buffer_size(it.buffer) >= nb) {
    s->buf = host->buffer_ref(it.buffer);
  } else {
    spn_error_t err = SPN_ERROR_INIT;
    if (host->buffer_new(stage, nb, &s->buf, &err) != SPN_OK) {
      job_fail(stage, j, SPN_ENOMEM, err.msg);
      return;
    }
#ifdef SPN_LIPSYNC_CUDA
    if (gpu) {
      /* From host memory or another GPU's, counted for the stage and the
       * job where the host can; the message (and its buffer) goes when this
       * call returns, so the copy is waited for. */
      cudaStream_t stream = (cudaStream_t)host->stage_get_stream(stage);
      int32_t rc = SPN_OK;
      if (it.buffer)
        rc = stage_copy(stage, env->job_id, s->buf, 0, it.buffer,
                        (size_t)((const char *)t->data - (const char *)host->buffer_data(it.buffer)), nb, NULL, &err);
      else if (cudaMemcpyAsync(host->buffer_data(s->buf), t->data, nb, cudaMemcpyDefault, stream) != cudaSuccess)
        rc = spn_error_set(&err, SPN_ECUDA, "%s", cudaGetErrorString(cudaGetLastError()));
      if (rc == SPN_OK && cudaStreamSynchronize(stream) != cudaSuccess)
        rc = spn_error_set(&err, SPN_ECUDA, "%s", cudaGetErrorString(cudaGetLastError()));
      if (rc == SPN_OK)
        rc = host->buffer_set_ready(stage, s->buf, &err);
      if (rc != SPN_OK) {
        snprintf(why, sizeof why, "input \"video\" seq %llu: copying the frame to the GPU: %.400s",
                 (unsigned long long)env->seq, err.msg);
        job_fail(stage, j, rc, why);
        return;
      }
      s->t.device_kind = SPN_DEVICE_CUDA;
      s->t.device_index = dev_index;
    } else
#endif
      memcpy(host->buffer_data(s->buf), t->data, nb);
  }
  s->have_frame = true;
  if (env->seq == 0) {
    j->have_pts0 = true;
    j->pts0 = env->pts;
  }
  check_drift(stage, j, s);
  int32_t pick = spn_w2l_pick_face(s->faces, s->n_faces);
  if (pick >= 0) {
    s->has_rect =
        spn_w2l_crop_rect(&s->faces[pick], (int32_t)t->shape[1], (int32_t)t->shape[0], &st->pads, &s->rect);
  }
  slot_settle(j, s);
}

#ifdef SPN_LIPSYNC_CUDA
/* The job's whole spectrogram, when its mel source sends one beside a chunk
 * (melspec does on seq 0; wav2lip.h, SPN_W2L_SPEC_ITEM): uploaded to this
 * GPU once, counted for the stage and the job, after which every batch cuts
 * the job's chunks there (spn_w2l_mel_gather_cuda) instead of uploading
 * them. The chunks stay what the port promises, so a spectrogram that does
 * not fit them (shape, more than SPN_W2L_SPEC_MAX_BYTES, its chunk count at
 * its fps not the stream's total) or that cannot be uploaded is logged and
 * left aside: the job goes on with its chunks. */
static void take_spec(spn_stage_t *stage, ls_job_t *j, spn_msg_t *m) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int64_t si = host->msg_find(m, SPN_W2L_SPEC_ITEM), fi = host->msg_find(m, SPN_W2L_SPEC_FPS_ITEM);
  int64_t oi = host->msg_find(m, SPN_W2L_SPEC_FIRST_ITEM);
  if (si < 0 || j->d_spec || j->spec_refused)
    return;
  char why[SPN_ERROR_MSG_MAX] = "";
  spn_item_t it = {.struct_size = sizeof it}, ft = {.struct_size = sizeof ft};
  const spn_tensor_t *t = &it.tensor;
  double fps = 0;
  bool has_fps = fi >= 0 && host->msg_item(m, (size_t)fi, &ft) == SPN_OK && ft.kind == SPN_ITEM_META &&
                 ft.meta_size == sizeof fps;
  if (has_fps)
    memcpy(&fps, ft.meta, sizeof fps);
  int64_t first = 0;
  spn_item_t ot = {.struct_size = sizeof ot};
  bool bad_first = oi >= 0 && (host->msg_item(m, (size_t)oi, &ot) != SPN_OK || ot.kind != SPN_ITEM_META ||
                               ot.meta_size != sizeof first);
  if (oi >= 0 && !bad_first)
    memcpy(&first, ot.meta, sizeof first);
  if (!has_fps) {
    snprintf(why, sizeof why, "no item \"%s\" (one double) beside it", SPN_W2L_SPEC_FPS_ITEM);
  } else if (host->msg_item(m, (size_t)si, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR || !it.buffer ||
             t->dtype != SPN_DTYPE_F32 || t->ndim != 2 || t->shape[0] != SPN_W2L_MEL_BINS ||
             t->shape[1] < SPN_W2L_MEL_STEPS || t->device_kind != SPN_DEVICE_CPU) {
    snprintf(why, sizeof why, "not an (80, n >= 16) f32 tensor in host memory");
  } else if (spn_tensor_nbytes(t) > SPN_W2L_SPEC_MAX_BYTES) {
    snprintf(why, sizeof why, "%zu bytes, more than the %zu taken", spn_tensor_nbytes(t), SPN_W2L_SPEC_MAX_BYTES);
  } else if (!(fps > 0) || !(fps < 1e6)) {
    snprintf(why, sizeof why, "its fps (%g) is not a frame rate", fps);
  } else if (bad_first || first < 0 || first >= spn_w2l_mel_chunks(fps, t->shape[1])) {
    snprintf(why, sizeof why, "item \"%s\" is not the index (one int64) of one of its chunks",
             SPN_W2L_SPEC_FIRST_ITEM);
  } else if (j->mel_total >= 0 && spn_w2l_mel_chunks(fps, t->shape[1]) - first != j->mel_total) {
    snprintf(why, sizeof why, "%lld columns at %g fps from chunk %lld make %lld chunks, the stream has %lld",
             (long long)t->shape[1], fps, (long long)first, (long long)(spn_w2l_mel_chunks(fps, t->shape[1]) - first),
             (long long)j->mel_total);
  }
  if (!why[0]) {
    spn_error_t err = SPN_ERROR_INIT;
    cudaStream_t stream = (cudaStream_t)host->stage_get_stream(stage);
    size_t nb = spn_tensor_nbytes(t);
    size_t off = (size_t)((const char *)t->data - (const char *)host->buffer_data(it.buffer));
    int32_t rc = host->buffer_new_kind(stage, nb, SPN_MEM_DEVICE, &j->d_spec, &err);
    if (rc == SPN_OK)
      rc = stage_copy(stage, j->job_id, j->d_spec, 0, it.buffer, off, nb, NULL, &err);
    /* The message, and the host memory it holds, goes when this call
     * returns: the copy is waited for, once per job. */
    if (rc == SPN_OK && cudaStreamSynchronize(stream) != cudaSuccess)
      rc = spn_error_set(&err, SPN_ECUDA, "%s", cudaGetErrorString(cudaGetLastError()));
    if (rc != SPN_OK) {
      host->buffer_unref(&j->d_spec);
      snprintf(why, sizeof why, "uploading it: %.400s", err.msg);
    }
  }
  if (why[0]) {
    j->spec_refused = true;
    host->log(stage, j->job_id, SPN_LOG_WARN,
              "input \"mel\": the spectrogram (item \"%s\") is left aside: %s; the job's mel chunks go up one by "
              "one with their batches",
              SPN_W2L_SPEC_ITEM, why);
    return;
  }
  j->spec_frames = t->shape[1];
  j->spec_fps = fps;
  j->spec_first = first;
  host->log(stage, j->job_id, SPN_LOG_DEBUG,
            "the job's spectrogram (%lld mel frames, %zu bytes) is on the GPU: its chunks are cut there",
            (long long)j->spec_frames, spn_tensor_nbytes(t));
}
#endif

static void take_mel(spn_stage_t *stage, ls_job_t *j, spn_msg_t *m, int64_t midx) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const spn_envelope_t *env = host->msg_envelope(m);
  char why[512];
  spn_item_t it = {.struct_size = sizeof it};
  if (host->msg_item(m, (size_t)midx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR ||
      it.tensor.dtype != SPN_DTYPE_F32 || spn_tensor_numel(&it.tensor) != SPN_W2L_MEL_FLOATS ||
      it.tensor.ndim < 2 || it.tensor.shape[it.tensor.ndim - 2] != SPN_W2L_MEL_BINS ||
      it.tensor.shape[it.tensor.ndim - 1] != SPN_W2L_MEL_STEPS || it.tensor.device_kind != SPN_DEVICE_CPU) {
    snprintf(why, sizeof why, "input \"mel\" seq %llu: item \"mel\" must be an (80,16) or (1,80,16) f32 tensor",
             (unsigned long long)env->seq);
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
  if (env->total >= 0)
    j->mel_total = env->total;
  if (j->mel_total >= 0 && env->seq >= (uint64_t)j->mel_total) {
    snprintf(why, sizeof why, "input \"mel\": seq %llu beyond the stream's total of %lld chunks",
             (unsigned long long)env->seq, (long long)j->mel_total);
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
#ifdef SPN_LIPSYNC_CUDA
  if (on_gpu(stage, NULL))
    take_spec(stage, j, m);
#endif
  if (env->seq < j->next_emit)
    return; /* its frame is already out (it passed through): a late chunk is dropped */
  ls_slot_t *s = slot_get(j, env->seq, why, sizeof why);
  if (!s) {
    char msg[600];
    snprintf(msg, sizeof msg, "input \"mel\": %s", why);
    job_fail(stage, j, SPN_EINVAL, msg);
    return;
  }
  if (s->have_mel) {
    snprintf(why, sizeof why, "input \"mel\": seq %llu arrived twice", (unsigned long long)env->seq);
    job_fail(stage, j, SPN_EINVAL, why);
    return;
  }
  memcpy(s->mel, it.tensor.data, sizeof s->mel);
  s->have_mel = true;
  s->mel_pts = env->pts;
  if (env->seq == 0) {
    j->have_mel0 = true;
    j->mel_pts0 = env->pts;
  }
  check_drift(stage, j, s);
}

/* ---- model ---------------------------------------------------------------------------- */


static void fail_slot(spn_stage_t *stage, ls_job_t *j, const ls_slot_t *s, int32_t rc, const char *why) {
  char msg[SPN_ERROR_MSG_MAX + 64];
  snprintf(msg, sizeof msg, "seq %llu: %s", (unsigned long long)s->env.seq, why);
  job_fail(stage, j, rc, msg);
}

#ifdef SPN_LIPSYNC_CUDA
/* The mel input of a batch of n slots on the GPU, (n,1,80,16) in d_mel:
 * rows of jobs whose spectrogram is on the device are cut from it by the
 * gather kernels (nothing crosses PCIe for them); the chunks of the other
 * jobs are staged in pinned memory and uploaded into their rows, one copy
 * per job's run of consecutive rows (run_ready gathers job by job), counted
 * for that job. Both kinds may share a batch. The staging is written again
 * only by the next batch, after this one's wait. */
static int32_t mel_batch_cuda(spn_stage_t *stage, ls_state_t *st, size_t n, void *stream, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const size_t msz = SPN_W2L_MEL_FLOATS;
  float *d = host->buffer_data(st->d_mel);
  size_t n_src = 0;
  bool staged = false; /* this batch has queued an upload from h_mel */
  for (size_t i = 0; i < n; i++) {
    ls_job_t *j = st->run_job[i];
    if (j->d_spec) {
      st->mel_src[n_src++] = (spn_w2l_mel_src_t){.mel = host->buffer_data(j->d_spec),
                                                 .n_frames = j->spec_frames,
                                                 .fps = j->spec_fps,
                                                 .i = j->spec_first + (int64_t)st->run[i]->env.seq,
                                                 .row = (int32_t)i};
      continue;
    }
    int32_t rc;
    if (!st->h_mel &&
        (rc = host->buffer_new_kind(stage, st->bs * msz * sizeof(float), SPN_MEM_PINNED, &st->h_mel, err)) != SPN_OK)
      return rc;
    /* The last batch's uploads from h_mel may still be queued (this
     * batch's own read other rows). */
    if (st->h_mel_queued && !staged) {
      cudaError_t ce = cudaEventSynchronize(st->h_mel_ev);
      if (ce != cudaSuccess)
        return spn_error_set(err, SPN_ECUDA, "lipsync: waiting for the last batch's mel upload: %s (%s)",
                             cudaGetErrorString(ce), cudaGetErrorName(ce));
      st->h_mel_queued = false;
    }
    float *h = host->buffer_data(st->h_mel);
    size_t last = i;
    while (last + 1 < n && st->run_job[last + 1] == j)
      last++;
    for (size_t r = i; r <= last; r++)
      memcpy(h + r * msz, st->run[r]->mel, msz * sizeof(float));
    size_t off = i * msz * sizeof(float), nb = (last + 1 - i) * msz * sizeof(float);
    cudaError_t ce;
    if (!st->h_mel_ev && (ce = cudaEventCreateWithFlags(&st->h_mel_ev, cudaEventDisableTiming)) != cudaSuccess)
      return spn_error_set(err, SPN_ECUDA, "lipsync: an event for the mel upload: %s (%s)", cudaGetErrorString(ce),
                           cudaGetErrorName(ce));
    if ((rc = stage_copy(stage, j->job_id, st->d_mel, off, st->h_mel, off, nb, "uploading mel chunks", err)) != SPN_OK)
      return rc;
    ce = cudaEventRecord(st->h_mel_ev, (cudaStream_t)stream);
    if (ce != cudaSuccess)
      return spn_error_set(err, SPN_ECUDA, "lipsync: marking the mel upload: %s (%s)", cudaGetErrorString(ce),
                           cudaGetErrorName(ce));
    st->h_mel_queued = staged = true;
    i = last;
  }
  return spn_w2l_mel_gather_cuda(d, (int32_t)n, st->mel_src, n_src, stream, err);
}
#endif

/* Run the model over n gathered slots and paste the results into fresh
 * copies of their frames — on the CPU, or on the instance's GPU with the
 * twins of wav2lip.c. A failure fails the jobs of those slots only. */
static void run_batch(spn_stage_t *stage, ls_state_t *st, size_t n) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const size_t fsz = SPN_W2L_FACE_FLOATS, msz = SPN_W2L_MEL_FLOATS, osz = SPN_W2L_OUT_FLOATS;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t dev_index = 0, rc = SPN_OK;
  bool gpu = on_gpu(stage, &dev_index);
  void *stream = host->stage_get_stream(stage);
  (void)stream; /* (a build without CUDA) */
  float *face = st->face_buf, *outp = st->out_buf;
#ifdef SPN_LIPSYNC_CUDA
  size_t paste_px = 0; /* the largest crop of the batch, for the paste's scratch */
  for (size_t i = 0; i < n; i++)
    if ((size_t)st->run[i]->rect.w * (size_t)st->run[i]->rect.h > paste_px)
      paste_px = (size_t)st->run[i]->rect.w * (size_t)st->run[i]->rect.h;
  if (gpu && ((rc = spn_cuda_scratch(stage, &st->d_face, st->bs * fsz * sizeof(float), 0, &err)) != SPN_OK ||
              (rc = spn_cuda_scratch(stage, &st->d_out, st->bs * osz * sizeof(float), 0, &err)) != SPN_OK ||
              (rc = spn_cuda_scratch(stage, &st->d_small, (size_t)SPN_W2L_SIZE * SPN_W2L_SIZE * 3, 0, &err)) != SPN_OK ||
              (rc = spn_cuda_scratch(stage, &st->d_big, paste_px * 3, 0, &err)) != SPN_OK ||
              (rc = spn_cuda_scratch(stage, &st->d_mask, paste_px * sizeof(float), 0, &err)) != SPN_OK ||
              (rc = spn_cuda_scratch(stage, &st->d_mel, st->bs * msz * sizeof(float), 0, &err)) != SPN_OK)) {
    for (size_t i = 0; i < n; i++)
      fail_slot(stage, st->run_job[i], st->run[i], rc, err.msg);
    return;
  }
  if (gpu && (rc = mel_batch_cuda(stage, st, n, stream, &err)) != SPN_OK) {
    for (size_t i = 0; i < n; i++)
      fail_slot(stage, st->run_job[i], st->run[i], rc, err.msg);
    /* The copies and gathers already queued read the jobs' spectrograms,
     * which the failed jobs release when they close (after this call). */
    (void)cudaStreamSynchronize((cudaStream_t)stream);
    return;
  }
  if (gpu) {
    face = host->buffer_data(st->d_face);
    outp = host->buffer_data(st->d_out);
  }
#endif
  for (size_t i = 0; i < n; i++) {
    ls_slot_t *s = st->run[i];
    spn_image_t img = SPN_IMAGE_INIT;
    rc = spn_image_wrap(&img, host->buffer_data(s->buf), (int32_t)s->t.shape[1], (int32_t)s->t.shape[0],
                        SPN_PIXFMT_RGB24, &err);
#ifdef SPN_LIPSYNC_CUDA
    if (gpu) {
      if (rc == SPN_OK)
        rc = spn_w2l_prepare_cuda(&img, &s->rect, face + i * fsz, host->buffer_data(st->d_small), stream, &err);
      if (rc != SPN_OK) {
        fail_slot(stage, st->run_job[i], s, rc, err.msg);
        cudaMemsetAsync(face + i * fsz, 0, fsz * sizeof(float), (cudaStream_t)stream);
      }
    } else
#endif
    {
      if (rc == SPN_OK)
        rc = spn_w2l_prepare(&img, &s->rect, face + i * fsz, &err);
      if (rc != SPN_OK) {
        fail_slot(stage, st->run_job[i], s, rc, err.msg);
        memset(face + i * fsz, 0, fsz * sizeof(float));
      }
      memcpy(st->mel_buf + i * msz, s->mel, msz * sizeof(float));
    }
  }
  spn_tensor_t in[2] = {SPN_TENSOR_INIT, SPN_TENSOR_INIT};
  spn_tensor_t *fi = &in[st->in_face], *mi = &in[st->in_mel];
  fi->dtype = SPN_DTYPE_F32;
  fi->ndim = 4;
  fi->shape[0] = (int64_t)n, fi->shape[1] = 6, fi->shape[2] = SPN_W2L_SIZE, fi->shape[3] = SPN_W2L_SIZE;
  fi->data = face;
  mi->dtype = SPN_DTYPE_F32;
  mi->ndim = 4;
  mi->shape[0] = (int64_t)n, mi->shape[1] = 1, mi->shape[2] = SPN_W2L_MEL_BINS, mi->shape[3] = SPN_W2L_MEL_STEPS;
  mi->data = st->mel_buf;
  spn_tensor_t out = SPN_TENSOR_INIT;
  out.dtype = SPN_DTYPE_F32;
  out.ndim = 4;
  out.shape[0] = (int64_t)n, out.shape[1] = 3, out.shape[2] = SPN_W2L_SIZE, out.shape[3] = SPN_W2L_SIZE;
  out.data = outp;
  if (gpu) {
    fi->device_kind = mi->device_kind = out.device_kind = SPN_DEVICE_CUDA;
    fi->device_index = mi->device_index = out.device_index = dev_index;
    mi->data = host->buffer_data(st->d_mel);
  }
  /* run_ready gathers job by job: count the jobs sharing this run. */
  size_t n_jobs = 1;
  for (size_t i = 1; i < n; i++)
    n_jobs += st->run_job[i] != st->run_job[i - 1];
  host->log(stage, 0, SPN_LOG_DEBUG, "wav2lip run: %zu faces from %zu jobs%s", n, n_jobs, gpu ? " on the GPU" : "");
  rc = host->model_run(stage, st->model, in, 2, &out, 1, &err);
  if (rc != SPN_OK) {
    for (size_t i = 0; i < n; i++)
      fail_slot(stage, st->run_job[i], st->run[i], rc, err.msg);
#ifdef SPN_LIPSYNC_CUDA
    /* The prepare kernels may still read the frames, which the failed
     * jobs release when they close (after this call). */
    if (gpu)
      (void)cudaStreamSynchronize((cudaStream_t)stream);
#endif
    return;
  }
  size_t n_retired = 0;
  for (size_t i = 0; i < n; i++) {
    ls_slot_t *s = st->run[i];
    ls_job_t *j = st->run_job[i];
    if (j->failed)
      continue;
    size_t nb = spn_tensor_nbytes(&s->t);
    spn_buffer_t *nbuf = NULL;
    if ((rc = host->buffer_new(stage, nb, &nbuf, &err)) != SPN_OK) {
      job_fail(stage, j, rc, err.msg);
      continue;
    }
    spn_image_t img = SPN_IMAGE_INIT;
    rc = spn_image_wrap(&img, host->buffer_data(nbuf), (int32_t)s->t.shape[1], (int32_t)s->t.shape[0],
                        SPN_PIXFMT_RGB24, &err);
#ifdef SPN_LIPSYNC_CUDA
    if (gpu) {
      if (rc == SPN_OK)
        rc = stage_copy(stage, s->env.job_id, nbuf, 0, s->buf, 0, nb, "copying the frame", &err);
      if (rc == SPN_OK)
        rc = spn_w2l_paste_cuda(&img, &s->rect, outp + i * osz, (float)st->cfg->feather,
                                host->buffer_data(st->d_small), host->buffer_data(st->d_big),
                                host->buffer_data(st->d_mask), stream, &err);
      if (rc == SPN_OK)
        rc = host->buffer_set_ready(stage, nbuf, &err);
    } else
#endif
    {
      memcpy(host->buffer_data(nbuf), host->buffer_data(s->buf), nb);
      if (rc == SPN_OK)
        rc = spn_w2l_paste(&img, &s->rect, outp + i * osz, (float)st->cfg->feather, &err);
    }
    if (rc != SPN_OK) {
      if (gpu)
        st->retired[n_retired++] = nbuf; /* the stream may still write it */
      else
        host->buffer_unref(&nbuf);
      fail_slot(stage, j, s, rc, err.msg);
      continue;
    }
    if (gpu)
      st->retired[n_retired++] = s->buf; /* the stream still reads it */
    else
      host->buffer_unref(&s->buf);
    s->buf = nbuf;
    s->done = true;
  }
#ifdef SPN_LIPSYNC_CUDA
  if (gpu) {
    /* The frames the batch replaced, and those of slots whose job failed in
     * it (released when the job closes, after this call), are this GPU's
     * memory, whose free the device layer orders after the work queued so
     * far: the batch does not wait for the GPU. Its pasted frames went out
     * with their ready events, and the stream runs on while the next batch
     * gathers; an error the GPU has already reported (a fault is sticky)
     * fails the batch's jobs here. A host that cannot say where a buffer
     * lives (no buffer_device) gets one wait, whose failure does the same. */
    bool wait = spn__cuda_held_need_wait(stage, st->retired, n_retired);
    cudaError_t ce = wait ? cudaStreamSynchronize((cudaStream_t)stream) : cudaStreamQuery((cudaStream_t)stream);
    if (ce != cudaSuccess && (wait || ce != cudaErrorNotReady)) {
      char why[256];
      snprintf(why, sizeof why, "lipsync: the GPU failed a batch of %zu faces: %s (%s)", n, cudaGetErrorString(ce),
               cudaGetErrorName(ce));
      for (size_t i = 0; i < n; i++)
        fail_slot(stage, st->run_job[i], st->run[i], SPN_ECUDA, why);
    }
    for (size_t i = 0; i < n_retired; i++)
      host->buffer_unref(&st->retired[i]);
  }
#endif
}

/* Run every runnable slot of `only` (or of all jobs when NULL), in batches. */
static void run_ready(spn_stage_t *stage, ls_state_t *st, ls_job_t *only) {
  size_t n = 0;
  for (ls_job_t *j = only ? only : st->jobs; j; j = only ? NULL : j->next) {
    if (j->failed)
      continue;
    for (size_t k = 0; k < j->cap && !j->failed; k++) { /* (a batch run below may fail the job) */
      ls_slot_t *s = slot_at(j, k);
      if (!s)
        continue;
      slot_settle(j, s);
      if (s->done || !s->have_frame || !s->have_mel)
        continue;
      st->run[n] = s;
      st->run_job[n] = j;
      if (++n == st->bs) {
        run_batch(stage, st, n);
        n = 0;
      }
    }
  }
  if (n)
    run_batch(stage, st, n);
}

/* ---- output --------------------------------------------------------------------------- */

static int32_t emit_slot(spn_stage_t *stage, ls_slot_t *s, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_msg_t *m = NULL;
  int32_t rc = host->msg_new(stage, &s->env, &m, err);
  if (rc != SPN_OK)
    return rc;
  if ((rc = host->msg_add_tensor(m, "frame", &s->t, s->buf, err)) != SPN_OK)
    goto out_msg;
  if (s->has_faces_item &&
      (rc = host->msg_add_meta(m, "faces", s->faces, s->n_faces * sizeof(spn_face_t), err)) != SPN_OK)
    goto out_msg;
  return host->emit(stage, 0, &m, err);
out_msg:
  host->msg_free(&m);
  return rc;
}

/* Emit the done slots at the head of the window. At the end of the job
 * (`ended`), also move past seqs that never came (a frame dropped upstream
 * with a SKIP the runtime forwards itself) and drop mel-only slots. */
static int32_t emit_ready(spn_stage_t *stage, ls_job_t *j, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  while (!j->failed && j->cap) {
    ls_slot_t **sp = &j->win[j->head];
    ls_slot_t *s = *sp;
    if (!s) {
      if (!j->ended)
        return SPN_OK;
      bool any = false;
      for (size_t k = 1; k < j->cap && !any; k++)
        any = slot_at(j, k) != NULL;
      if (!any)
        return SPN_OK;
    } else if (s->have_frame) {
      slot_settle(j, s);
      if (!s->done)
        return SPN_OK;
      int32_t rc = emit_slot(stage, s, err);
      if (rc != SPN_OK)
        return rc;
    } else if (!j->ended) {
      return SPN_OK; /* a mel chunk waiting for its frame */
    }
    slot_free(host, sp);
    j->head = (j->head + 1) % j->cap;
    j->next_emit++;
  }
  return SPN_OK;
}

/* ---- callbacks ------------------------------------------------------------------------ */

static void ls_destroy(spn_stage_t *stage, void *state);

static int32_t ls_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const ls_config_t *cfg = config;
  /* Fail early, with what to do, when the model file is not there: the
   * usual first run of this pipeline. */
  if (!cfg->model || access(cfg->model, R_OK) != 0) {
    int e = errno;
    return spn_error_set(err, SPN_ENOENT,
                         "lipsync: model \"%s\": %s. Export a Wav2Lip checkpoint to ONNX with "
                         "`python3 tools/export/export.py wav2lip wav2lip_gan.pth wav2lip.onnx` "
                         "(see docs/pipelines.md) and set `model` to its path",
                         cfg->model ? cfg->model : "", cfg->model ? strerror(e) : "not set");
  }
  ls_state_t *st = calloc(1, sizeof *st);
  if (!st)
    return spn_error_set(err, SPN_ENOMEM, "lipsync: out of memory");
  st->cfgv = *cfg;
  st->cfg = &st->cfgv;
  st->pads = (spn_w2l_pads_t){(int32_t)cfg->pad_top, (int32_t)cfg->pad_bottom, (int32_t)cfg->pad_left,
                              (int32_t)cfg->pad_right};
  st->bs = (size_t)cfg->batch_size;
  st->face_buf = malloc(st->bs * SPN_W2L_FACE_FLOATS * sizeof(float));
  st->mel_buf = malloc(st->bs * SPN_W2L_MEL_FLOATS * sizeof(float));
  st->out_buf = malloc(st->bs * SPN_W2L_OUT_FLOATS * sizeof(float));
  st->run = malloc(st->bs * sizeof *st->run);
  st->run_job = malloc(st->bs * sizeof *st->run_job);
  st->retired = calloc(st->bs, sizeof *st->retired);
#ifdef SPN_LIPSYNC_CUDA
  st->mel_src = malloc(st->bs * sizeof *st->mel_src);
  bool gpu_ok = st->mel_src != NULL;
#else
  bool gpu_ok = true;
#endif
  if (!st->face_buf || !st->mel_buf || !st->out_buf || !st->run || !st->run_job || !st->retired || !gpu_ok) {
    ls_destroy(stage, st);
    return spn_error_set(err, SPN_ENOMEM, "lipsync: out of memory for a batch of %zu faces", (size_t)cfg->batch_size);
  }
  *state = st;
  return SPN_OK;
}

/* Which model input is which: by shape ((N,6,96,96) face, (N,1,80,16)
 * mel), else by name. */
static int32_t ls_bind_model(const spn_host_api_t *host, ls_state_t *st, const char *path, spn_error_t *err) {
  int32_t nin = host->model_io_count(st->model, false), nout = host->model_io_count(st->model, true);
  if (nin != 2 || nout < 1)
    return spn_error_set(err, SPN_EINVAL,
                         "lipsync: model \"%s\" has %d inputs and %d outputs; Wav2Lip has 2 (mel, face) and 1",
                         path, nin, nout);
  st->in_face = st->in_mel = -1;
  for (int32_t i = 0; i < 2; i++) {
    const char *name = NULL;
    spn_tensor_t d = SPN_TENSOR_INIT;
    if (host->model_io(st->model, false, i, &name, &d) != SPN_OK)
      return spn_error_set(err, SPN_EINVAL, "lipsync: model \"%s\": cannot read input %d", path, i);
    if (d.ndim == 4 && d.shape[1] == 6)
      st->in_face = i;
    else if (d.ndim == 4 && d.shape[1] == 1 && d.shape[2] == SPN_W2L_MEL_BINS)
      st->in_mel = i;
    else if (name && (strstr(name, "face") || strstr(name, "img")))
      st->in_face = i;
    else if (name && (strstr(name, "mel") || strstr(name, "audio")))
      st->in_mel = i;
  }
  if (st->in_face < 0 || st->in_mel < 0 || st->in_face == st->in_mel)
    return spn_error_set(err, SPN_EINVAL,
                         "lipsync: model \"%s\": cannot tell its inputs apart; want face (N,6,96,96) and "
                         "mel (N,1,80,16)",
                         path);
  const char *oname = NULL;
  spn_tensor_t od = SPN_TENSOR_INIT;
  if (host->model_io(st->model, true, 0, &oname, &od) != SPN_OK || od.ndim != 4 ||
      (od.shape[1] >= 0 && od.shape[1] != 3) || (od.shape[2] >= 0 && od.shape[2] != SPN_W2L_SIZE) ||
      (od.shape[3] >= 0 && od.shape[3] != SPN_W2L_SIZE))
    return spn_error_set(err, SPN_EINVAL, "lipsync: model \"%s\": output 0 must be (N,3,96,96)", path);
  return SPN_OK;
}

static int32_t ls_preload(spn_stage_t *stage, void *state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  ls_state_t *st = state;
  int32_t rc = host->model_load(stage, st->cfg->model, &st->model, err);
  if (rc != SPN_OK)
    return rc;
  return ls_bind_model(host, st, st->cfg->model, err);
}

static int32_t ls_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  (void)stage;
  ls_state_t *st = state;
  ls_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "lipsync: out of memory opening job %llu",
                         (unsigned long long)job->job_id);
  j->job_id = job->job_id;
  j->mel_total = -1;
  j->next = st->jobs;
  st->jobs = j;
  *job_state = j;
  return SPN_OK;
}

static int32_t ls_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  ls_state_t *st = state;
  if (!st->model)
    return spn_error_set(err, SPN_EINVAL, "lipsync: no model loaded (preload did not run)");
  for (size_t i = 0; i < n; i++) {
    ls_job_t *j = job_states[i];
    if (!j || j->failed || !msgs[i])
      continue;
    int64_t f = host->msg_find(msgs[i], "frame");
    int64_t m = f < 0 ? host->msg_find(msgs[i], "mel") : -1;
    if (f >= 0)
      take_frame(stage, st, j, msgs[i], f);
    else if (m >= 0)
      take_mel(stage, j, msgs[i], m);
    else {
      char why[160];
      snprintf(why, sizeof why, "seq %llu: message has neither a \"frame\" nor a \"mel\" item",
               (unsigned long long)host->msg_envelope(msgs[i])->seq);
      job_fail(stage, j, SPN_EINVAL, why);
    }
  }
  run_ready(stage, st, NULL);
  for (ls_job_t *j = st->jobs; j; j = j->next) {
    int32_t rc = emit_ready(stage, j, err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t ls_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  ls_state_t *st = state;
  ls_job_t *j = job_state;
  if (!j || j->failed)
    return SPN_OK;
  j->ended = true;
  if (st->model)
    run_ready(stage, st, j);
  return emit_ready(stage, j, err);
}

static void ls_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  const spn_host_api_t *host = spn_stage_host(stage);
  (void)stage;
  (void)ok;
  ls_state_t *st = state;
  ls_job_t *j = job_state;
  if (!j)
    return;
  for (ls_job_t **pp = &st->jobs; *pp; pp = &(*pp)->next)
    if (*pp == j) {
      *pp = j->next;
      break;
    }
  for (size_t k = 0; k < j->cap; k++)
    slot_free(host, &j->win[k]);
  free(j->win);
  /* Device memory goes back to the pool after the work queued on it (the
   * device layer orders the free after every stream's work); every batch
   * that read it was waited for anyway, and so was its upload. */
  host->buffer_unref(&j->d_spec);
  free(j);
}

static void ls_destroy(spn_stage_t *stage, void *state) {
  const spn_host_api_t *host = spn_stage_host(stage);
  ls_state_t *st = state;
  if (!st)
    return;
#ifdef SPN_LIPSYNC_CUDA
  /* Work queued on the scratch and on the open jobs' frames ends before
   * they go back to the pool. */
  if (st->d_face || st->d_small || st->d_mel || st->h_mel)
    cudaStreamSynchronize((cudaStream_t)host->stage_get_stream(stage));
  if (st->h_mel_ev)
    cudaEventDestroy(st->h_mel_ev);
#endif
  while (st->jobs)
    ls_job_close(stage, st, st->jobs, false);
  if (st->model)
    host->model_release(stage, &st->model);
  free(st->face_buf);
  free(st->mel_buf);
  free(st->out_buf);
  free(st->run);
  free(st->run_job);
  free(st->retired);
#ifdef SPN_LIPSYNC_CUDA
  host->buffer_unref(&st->d_face);
  host->buffer_unref(&st->d_out);
  host->buffer_unref(&st->d_small);
  host->buffer_unref(&st->d_big);
  host->buffer_unref(&st->d_mask);
  host->buffer_unref(&st->d_mel);
  host->buffer_unref(&st->h_mel);
  free(st->mel_src);
#endif
  free(st);
}

#ifdef SPN_LIPSYNC_CUDA
/* On a GPU instance the frames may already be in its memory. */
#define LS_FRAME_MEM (SPN_MEMSET_HOST | SPN_MEMSET_DEVICE)
#else
#define LS_FRAME_MEM SPN_MEMSET_HOST
#endif
static const spn_port_caps_t ls_input_caps[] = {
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = LS_FRAME_MEM},
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_HOST}};
static const spn_port_caps_t ls_output_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = LS_FRAME_MEM}};

static int32_t ls_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "lipsync",
      .doc = "Wav2Lip: redraws the mouth of each frame's face from its mel chunk",
      .schema = ls_schema,
      .config_size = sizeof(ls_config_t),
      .inputs = ls_inputs,
      .n_inputs = 2,
      .outputs = ls_outputs,
      .n_outputs = 1,
#ifdef SPN_LIPSYNC_CUDA
      .device_need = SPN_NEED_EITHER,
#else
      .device_need = SPN_NEED_CPU,
#endif
      .input_caps = ls_input_caps,
      .output_caps = ls_output_caps,
      .max_batch = 128,
      .max_delay_ms = 10,
      .create = ls_create,
      .preload = ls_preload,
      .job_open = ls_job_open,
      .process = ls_process,
      .flush = ls_flush,
      .job_close = ls_job_close,
      .destroy = ls_destroy,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(lipsync, .version = "1.0", .license = "Apache-2.0", .init = ls_init)
