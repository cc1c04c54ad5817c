/* harness-driver.c — one stage kind of a plugin driven through the stage
 * harness (spindle/harness.h) on the real runtime, for the Python tests that
 * compute their references with NumPy and OpenCV (test-facedetect-stage.py,
 * test-superres-stage.py). It links libspindle's public API only, as a stage
 * author's test would; models are loaded by the real engine.
 *
 *   harness-driver PLUGIN.so KIND W H BATCH OUTDIR [TOML-LINE...] -- JOB:FRAME...
 *
 * TOML-LINE: a line of the stage's [[stage]] table (`model = "x.onnx"`),
 * BATCH its max_batch. FRAME is a raw W*H*3 RGB file, optionally followed by
 * "+faces" (a "faces" item with one known face is attached), or "bad" (a
 * float tensor where a u8 frame belongs). Each job's frames are pushed in
 * order with seq 0, 1, ...; every job runs at once (batches may mix jobs).
 *
 * Prints, per job in order of first appearance, one JSON line per message
 * the stage emitted ({"job", "seq", "faces": [[x0,y0,x1,y1,score,track,
 * lm0..lm9], ...] or null, "frame": [h, w] or null, "device_kind": 0 host / 1 CUDA,
 * "file": OUTDIR/JOB-SEQ.rgb
 * holding the emitted frame, "items"}), then {"eos": JOB} when its end of
 * stream came through and {"failed": JOB, "status", "msg"} when it failed.
 * A stage that cannot be built (its create refused the config) prints
 * {"create_error": MSG} and exits 0. Exit 1 when anything else went wrong.
 * SPINDLE_DRIVER_LOG=debug turns on the runtime's debug log (stderr).
 * SPINDLE_DRIVER_DEVICES sets the runtime's devices ("cuda:0" runs a kind
 * that can use a GPU there; frames it leaves in device memory are copied to
 * the host for the file, in a build with CUDA).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/harness.h"
#ifdef SPN_DRIVER_CUDA
#include <cuda_runtime_api.h>
#endif

#define MAX_JOBS 16

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

static int read_file(const char *path, void *buf, size_t n) {
  FILE *fp = fopen(path, "rb");
  size_t got = fp ? fread(buf, 1, n, fp) : 0;
  if (fp)
    fclose(fp);
  return got == n ? 0 : -1;
}

/* A message for one FRAME argument (see the header). */
static spn_msg_t *make_msg(spn_harness_t *h, uint64_t seq, const char *spec, int32_t w, int32_t hh) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_msg_t *m = NULL;
  char frame[1024];
  snprintf(frame, sizeof frame, "%s", spec);
  if (spn_harness_msg_new(h, seq, &m, &err) != SPN_OK) {
    fprintf(stderr, "msg_new: %s\n", err.msg);
    return NULL;
  }
  char *plus = strstr(frame, "+faces");
  if (plus) {
    *plus = '\0';
    spn_face_t f = {.x0 = 10, .y0 = 20, .x1 = 30, .y1 = 40, .score = 0.9f, .track_id = 7};
    for (int i = 0; i < 10; i++)
      f.landmarks[i] = (float)(i + 1);
    if (spn_harness_host(h)->msg_add_meta(m, "faces", &f, sizeof f, &err) != SPN_OK)
      goto fail;
  }
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.ndim = 3;
  t.shape[0] = hh, t.shape[1] = w, t.shape[2] = 3;
  bool bad = !strcmp(frame, "bad");
  t.dtype = bad ? SPN_DTYPE_F32 : SPN_DTYPE_U8;
  size_t n = spn_tensor_nbytes(&t);
  void *px = calloc(1, n);
  if (!px || (!bad && read_file(frame, px, n))) {
    fprintf(stderr, "%s: cannot read %zu bytes\n", frame, n);
    free(px);
    goto fail_quiet;
  }
  int32_t rc = spn_harness_add_tensor(h, m, "frame", &t, px, &err);
  free(px);
  if (rc != SPN_OK)
    goto fail;
  return m;
fail:
  fprintf(stderr, "message: %s\n", err.msg);
fail_quiet:
  spn_harness_host(h)->msg_free(&m);
  return NULL;
}

/* One emitted message as a JSON line; its u8 frame written to OUTDIR. */
static int print_output(spn_harness_t *h, const spn_msg_t *m, const char *outdir) {
  const spn_host_api_t *host = spn_harness_host(h);
  const spn_envelope_t *env = host->msg_envelope(m);
  int bad = 0;
  printf("{\"job\": %llu, \"seq\": %llu, \"faces\": ", (unsigned long long)env->job_id, (unsigned long long)env->seq);
  spn_item_t it = {.struct_size = sizeof it};
  int64_t k = host->msg_find(m, "faces");
  if (k < 0 || host->msg_item(m, (size_t)k, &it) != SPN_OK || it.kind != SPN_ITEM_META) {
    printf("null");
  } else {
    const spn_face_t *faces = it.meta;
    size_t n = it.meta_size / sizeof(spn_face_t);
    bad |= it.meta_size % sizeof(spn_face_t) != 0;
    printf("[");
    for (size_t i = 0; i < n; i++) {
      printf("%s[%.4f, %.4f, %.4f, %.4f, %.3f, %d", i ? ", " : "", faces[i].x0, faces[i].y0, faces[i].x1,
             faces[i].y1, faces[i].score, faces[i].track_id);
      for (int l = 0; l < 10; l++)
        printf(", %.4f", faces[i].landmarks[l]);
      printf("]");
    }
    printf("]");
  }
  k = host->msg_find(m, "frame");
  if (k >= 0 && host->msg_item(m, (size_t)k, &it) == SPN_OK && it.kind == SPN_ITEM_TENSOR &&
      it.tensor.dtype == SPN_DTYPE_U8) {
    char path[512];
    snprintf(path, sizeof path, "%s/%llu-%llu.rgb", outdir, (unsigned long long)env->job_id,
             (unsigned long long)env->seq);
    size_t n = spn_tensor_nbytes(&it.tensor);
    const void *bytes = host->buffer_data(it.buffer);
    void *copy = NULL;
    if (it.tensor.device_kind != SPN_DEVICE_CPU) {
#ifdef SPN_DRIVER_CUDA
      copy = malloc(n);
      bad |= !copy || cudaMemcpy(copy, bytes, n, cudaMemcpyDeviceToHost) != cudaSuccess;
      bytes = copy;
#else
      bad = 1;
#endif
    }
    FILE *fp = bad ? NULL : fopen(path, "wb");
    bad |= !fp || fwrite(bytes, 1, n, fp) != n;
    if (fp)
      fclose(fp);
    free(copy);
    printf(", \"frame\": [%lld, %lld], \"device_kind\": %d, \"file\": ", (long long)it.tensor.shape[0],
           (long long)it.tensor.shape[1], (int)it.tensor.device_kind);
    print_json_string(path);
  } else {
    printf(", \"frame\": null");
  }
  printf(", \"items\": %zu}\n", host->msg_item_count(m));
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 8) {
    fprintf(stderr, "usage: see the header of harness-driver.c\n");
    return 2;
  }
  int32_t w = atoi(argv[3]), hh = atoi(argv[4]);
  const char *outdir = argv[6];
  char config[8192];
  int used = snprintf(config, sizeof config, "batching = { max_batch = %d }\n", atoi(argv[5]));
  int a = 7;
  for (; a < argc && strcmp(argv[a], "--") && used < (int)sizeof config; a++)
    used += snprintf(config + used, sizeof config - (size_t)used, "%s\n", argv[a]);
  if (a == argc || used >= (int)sizeof config) {
    fprintf(stderr, "no \"--\" or config too long\n");
    return 2;
  }
  const char *lv = getenv("SPINDLE_DRIVER_LOG");
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = argv[1];
  o.kind = argv[2];
  o.config = config;
  o.devices = getenv("SPINDLE_DRIVER_DEVICES");
  if (lv && !strcmp(lv, "debug"))
    o.log_level = SPN_LOG_DEBUG;
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_new(&o, &h, &err) != SPN_OK) {
    printf("{\"create_error\": ");
    print_json_string(err.msg);
    printf("}\n");
    return 0;
  }
  uint64_t jobs[MAX_JOBS], seqs[MAX_JOBS] = {0};
  int n_jobs = 0, failures = 0;
  for (a++; a < argc; a++) {
    char *colon = strchr(argv[a], ':');
    long job = atol(argv[a]);
    if (!colon || job < 1)
      return 2;
    int j = 0;
    while (j < n_jobs && jobs[j] != (uint64_t)job)
      j++;
    if (j == n_jobs) {
      if (n_jobs == MAX_JOBS)
        return 2;
      jobs[n_jobs++] = (uint64_t)job;
    }
    spn_msg_t *m = make_msg(h, seqs[j]++, colon + 1, w, hh);
    if (!m || spn_harness_push(h, (uint64_t)job, 0, &m, &err) != SPN_OK) {
      fprintf(stderr, "push: %s\n", err.msg);
      spn_harness_free(&h);
      return 1;
    }
  }
  if (spn_harness_run(h, &err) != SPN_OK) {
    fprintf(stderr, "run: %s\n", err.msg);
    spn_harness_free(&h);
    return 1;
  }
  for (int j = 0; j < n_jobs; j++) {
    for (size_t i = 0; i < spn_harness_output_len(h, jobs[j], 0); i++)
      failures += print_output(h, spn_harness_output(h, jobs[j], 0, i), outdir);
    if (spn_harness_output_eos(h, jobs[j], 0))
      printf("{\"eos\": %llu}\n", (unsigned long long)jobs[j]);
    int32_t rc = spn_harness_job_status(h, jobs[j], &err);
    if (rc != SPN_OK) {
      printf("{\"failed\": %llu, \"status\": %d, \"msg\": ", (unsigned long long)jobs[j], rc);
      print_json_string(err.msg);
      printf("}\n");
    }
  }
  spn_harness_free(&h);
  return failures ? 1 : 0;
}
