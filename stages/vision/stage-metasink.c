/* stage-metasink.c — the `metasink` stage kind of the vision plugin: writes
 * each frame's detections as JSON Lines, so a pipeline can answer "where are
 * the faces in this video" without any C.
 *
 * One line per frame, in seq order:
 *   {"job":1,"seq":0,"pts":0.04,"faces":[{"box":[x0,y0,x1,y1],"score":0.99,
 *    "landmarks":[[x,y],[x,y],[x,y],[x,y],[x,y]],"track":3}]}
 * ("landmarks":null when the detector gives none, as the Haar cascade).
 * Box corners and landmarks are frame pixels (the facedetect stage's
 * spn_face_t); a frame without a "faces" item, or with none found, has
 * "faces":[]. SKIP messages write {"job":..,"seq":..,"skip":true}. EOS ends
 * the job's file.
 *
 * Invariants: seqs must arrive dense from 0 (one instance; the host delivers
 * a job's messages in order); a job that fails or is cancelled has its file
 * removed, so `path` holds the whole job or nothing; the file is fsynced at
 * end of stream. An empty or "-" path writes to standard output (lines of
 * different jobs may then interleave, each line whole).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spindle/plugin.h"

#include "plugin-vision.h"

typedef struct ms_config {
  char *path;
} ms_config_t;

static const spn_config_field_t k_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, path),
     .doc = "JSON Lines file each job's detections are written to (empty or \"-\": standard output)",
     .def_str = ""},
    {.key = NULL},
};

static const spn_port_t k_inputs[] = {{.name = "in", .type = "any"}};

typedef struct ms_job {
  uint64_t job_id;
  FILE *f;
  char *path;
  bool to_stdout, regular, failed, closed;
  uint64_t next_seq;
  int64_t frames, faces;
} ms_job_t;

static int32_t ms_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *h = spn_stage_host(stage);
  if (!h || !h->msg_find || !h->msg_item || !h->msg_envelope || !h->fail_job)
    return spn_error_set(err, SPN_EUNSUPPORTED, "metasink: this host cannot run stages (API table incomplete)");
  *state = (void *)h;
  return SPN_OK;
}

static int32_t ms_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  const ms_config_t *c = job->config;
  const char *p = c && c->path ? c->path : "";
  size_t pl = strlen(p);
  ms_job_t *j = calloc(1, sizeof *j);
  if (!j || !(j->path = strdup(p))) {
    free(j);
    return spn_error_set(err, SPN_ENOMEM, "metasink: out of memory");
  }
  j->job_id = job->job_id;
  /* A PATH key arrives joined to the config's folder: "-" ends in "/-". */
  j->to_stdout = !*p || !strcmp(p, "-") || (pl >= 2 && !strcmp(p + pl - 2, "/-"));
  if (j->to_stdout) {
    j->f = stdout;
  } else {
    struct stat st;
    j->f = fopen(p, "w");
    if (!j->f || fstat(fileno(j->f), &st)) {
      int32_t rc = spn_error_set(err, SPN_EIO, "job %llu: metasink output %s: %s",
                                 (unsigned long long)job->job_id, p, strerror(errno));
      if (j->f)
        fclose(j->f);
      free(j->path);
      free(j);
      return rc;
    }
    j->regular = S_ISREG(st.st_mode); /* only a regular file is removed on failure */
  }
  *job_state = j;
  return SPN_OK;
}

static void ms_fail(const spn_host_api_t *h, spn_stage_t *stage, ms_job_t *j, int32_t status, const char *why) {
  char msg[768];
  snprintf(msg, sizeof msg, "job %llu: metasink %s: %s", (unsigned long long)j->job_id,
           j->to_stdout ? "(stdout)" : j->path, why);
  j->failed = true;
  h->fail_job(stage, j->job_id, status, msg);
}

/* %.9g keeps every float bit; JSON has no NaN/Inf, so those become null. */
static void put_num(FILE *f, double v) {
  if (v != v || v > 1e300 || v < -1e300)
    fputs("null", f);
  else
    fprintf(f, "%.9g", v);
}

/* One frame's line. Returns false when the "faces" item is malformed. */
static bool ms_write_frame(const spn_host_api_t *h, ms_job_t *j, const spn_msg_t *m, const spn_envelope_t *env) {
  const spn_face_t *faces = NULL;
  size_t n = 0;
  int64_t idx = h->msg_find(m, "faces");
  if (idx >= 0) {
    spn_item_t it = {.struct_size = sizeof it};
    if (h->msg_item(m, (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_META || it.meta_size % sizeof(spn_face_t))
      return false;
    faces = it.meta;
    n = it.meta_size / sizeof(spn_face_t);
  }
  FILE *f = j->f;
  fprintf(f, "{\"job\":%llu,\"seq\":%llu,\"pts\":", (unsigned long long)env->job_id, (unsigned long long)env->seq);
  put_num(f, env->pts);
  fputs(",\"faces\":[", f);
  for (size_t i = 0; i < n; i++) {
    const spn_face_t *fc = &faces[i];
    fputs(i ? ",{\"box\":[" : "{\"box\":[", f);
    const float b[4] = {fc->x0, fc->y0, fc->x1, fc->y1};
    for (int k = 0; k < 4; k++) {
      if (k)
        fputc(',', f);
      put_num(f, b[k]);
    }
    fputs("],\"score\":", f);
    put_num(f, fc->score);
    bool has_lm = false; /* spn_face_t: all zero when the detector gives none */
    for (int k = 0; k < 10; k++)
      has_lm = has_lm || fc->landmarks[k] != 0.f;
    fputs(has_lm ? ",\"landmarks\":[" : ",\"landmarks\":null", f);
    for (int k = 0; k < 5 && has_lm; k++) {
      fputs(k ? ",[" : "[", f);
      put_num(f, fc->landmarks[2 * k]);
      fputc(',', f);
      put_num(f, fc->landmarks[2 * k + 1]);
      fputc(']', f);
    }
    fprintf(f, "%s,\"track\":%d}", has_lm ? "]" : "", fc->track_id);
  }
  fputs("]}\n", f);
  j->faces += (int64_t)n;
  return true;
}

static void ms_end(const spn_host_api_t *h, spn_stage_t *stage, ms_job_t *j) {
  if (j->failed || j->closed)
    return;
  j->closed = true;
  if (fflush(j->f) || (j->regular && fsync(fileno(j->f)))) {
    ms_fail(h, stage, j, SPN_EIO, strerror(errno));
    return;
  }
  if (h->log)
    h->log(stage, j->job_id, SPN_LOG_INFO, "metasink: %lld frames, %lld faces written to %s", (long long)j->frames,
           (long long)j->faces, j->to_stdout ? "stdout" : j->path);
}

static int32_t ms_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  const spn_host_api_t *h = state;
  for (size_t i = 0; i < n; i++) {
    ms_job_t *j = job_states[i];
    if (!j || j->failed)
      continue;
    const spn_envelope_t *env = h->msg_envelope(msgs[i]);
    if (env->flags & SPN_MSG_EOS) {
      ms_end(h, stage, j);
      continue;
    }
    char why[160];
    if (env->seq != j->next_seq) {
      snprintf(why, sizeof why, "seq %llu arrived where %llu was expected", (unsigned long long)env->seq,
               (unsigned long long)j->next_seq);
      ms_fail(h, stage, j, SPN_EPROTO, why);
      continue;
    }
    j->next_seq++;
    if (env->flags & SPN_MSG_SKIP) {
      fprintf(j->f, "{\"job\":%llu,\"seq\":%llu,\"skip\":true}\n", (unsigned long long)env->job_id,
              (unsigned long long)env->seq);
      continue;
    }
    if (!ms_write_frame(h, j, msgs[i], env)) {
      snprintf(why, sizeof why, "seq %llu: item \"faces\" is not a whole number of spn_face_t",
               (unsigned long long)env->seq);
      ms_fail(h, stage, j, SPN_EPROTO, why);
      continue;
    }
    if (ferror(j->f)) {
      ms_fail(h, stage, j, SPN_EIO, "write error");
      continue;
    }
    j->frames++;
    if (h->progress)
      h->progress(stage, j->job_id, j->frames, env->total);
  }
  return SPN_OK;
}

static int32_t ms_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  if (job_state)
    ms_end(state, stage, job_state);
  return SPN_OK;
}

static void ms_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  ms_job_t *j = job_state;
  if (!j)
    return;
  if (!j->to_stdout) {
    fclose(j->f);
    if ((!ok || j->failed) && j->regular)
      unlink(j->path); /* a failed or cancelled job leaves nothing behind */
  } else {
    fflush(stdout);
  }
  free(j->path);
  free(j);
}

static const spn_stage_kind_t k_metasink = {
    .struct_size = sizeof(spn_stage_kind_t),
    .name = "metasink",
    .doc = "sink that writes each frame's face boxes, landmarks, scores and pts as JSON Lines",
    .schema = k_schema,
    .config_size = sizeof(ms_config_t),
    .inputs = k_inputs,
    .n_inputs = 1,
    .device_need = SPN_NEED_CPU,
    .max_batch = 1,
    .create = ms_create,
    .job_open = ms_job_open,
    .process = ms_process,
    .flush = ms_flush,
    .job_close = ms_job_close,
    .flags = SPN_KIND_SEES_SKIPS, /* a dropped frame is not a gap */
};

const spn_stage_kind_t *vision_metasink_kind(void) {
  return &k_metasink;
}
