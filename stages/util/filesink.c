/* filesink.c — `filesink`, a sink that writes every frame's bytes to a file.
 *
 * For each job it opens the per-job `path` (created or truncated), appends
 * the bytes of each message's "frame" tensor in seq order (one instance:
 * the host delivers a job's messages in order), checks that seqs are dense
 * from 0, and fsyncs and closes the file at the end of the stream. A job
 * that fails or is cancelled has its file removed, so the path holds either
 * the whole stream or nothing. Under the job service the path is the
 * temporary name the service renames on success. An empty path (the
 * default) writes nothing, so a config can be run as is. The file I/O is blocking:
 * this is a utility stage for tests and the synthetic pipelines, not a
 * media muxer.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spindle/plugin.h"


typedef struct filesink_config {
  char *path;
} filesink_config_t;

static const spn_config_field_t filesink_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(filesink_config_t, path),
     .doc = "file each job's frames are written to (set per job; empty: count frames, write nothing)",
     .def_str = ""},
    {0},
};

static const spn_port_t filesink_inputs[] = {{.name = "in", .type = "any"}};

typedef struct filesink_job {
  uint64_t job_id;
  int fd;
  char *path;
  uint64_t next_seq;
  int64_t frames;
  bool failed, closed, regular;
} filesink_job_t;

static int32_t filesink_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                                 spn_error_t *err) {
  const filesink_config_t *c = job->config;
  filesink_job_t *j = calloc(1, sizeof *j);
  if (!j || !(j->path = strdup(c->path ? c->path : ""))) {
    free(j);
    return spn_error_set(err, SPN_ENOMEM, "filesink: out of memory");
  }
  j->job_id = job->job_id;
  j->fd = -1;
  *job_state = j;
  if (!*j->path)
    return SPN_OK; /* no path: frames are counted, nothing is written */
  j->fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  struct stat st;
  if (j->fd < 0 || fstat(j->fd, &st) != 0) {
    int32_t rc = spn_error_set(err, SPN_EIO, "job %llu: output %s: %s", (unsigned long long)job->job_id, j->path,
                               strerror(errno));
    if (j->fd >= 0)
      close(j->fd);
    free(j->path);
    free(j);
    *job_state = NULL;
    return rc;
  }
  /* Only a regular file is removed on failure (never a device). */
  j->regular = S_ISREG(st.st_mode);
  return SPN_OK;
}

static void filesink_fail(spn_stage_t *stage, filesink_job_t *j, int32_t status, const char *why) {
  const spn_host_api_t *host = spn_stage_host(stage);
  char msg[768];
  snprintf(msg, sizeof msg, "job %llu: output %s: %s", (unsigned long long)j->job_id, j->path, why);
  j->failed = true;
  host->fail_job(stage, j->job_id, status, msg);
}

static void filesink_write(spn_stage_t *stage, filesink_job_t *j, const spn_msg_t *m, uint64_t seq) {
  const spn_host_api_t *host = spn_stage_host(stage);
  char why[256];
  int64_t idx = host->msg_find(m, "frame");
  spn_item_t it = {.struct_size = sizeof it};
  if (idx < 0 || host->msg_item(m, (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR || !it.buffer ||
      host->buffer_size(it.buffer) < spn_tensor_nbytes(&it.tensor)) {
    snprintf(why, sizeof why, "seq %llu has no \"frame\" tensor", (unsigned long long)seq);
    filesink_fail(stage, j, SPN_EPROTO, why);
    return;
  }
  if (j->fd < 0)
    return;
  const uint8_t *p = host->buffer_data(it.buffer);
  size_t n = spn_tensor_nbytes(&it.tensor);
  while (n) {
    ssize_t w = write(j->fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      snprintf(why, sizeof why, "write at seq %llu: %s", (unsigned long long)seq, w < 0 ? strerror(errno) : "no progress");
      filesink_fail(stage, j, SPN_EIO, why);
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

static void filesink_end(spn_stage_t *stage, filesink_job_t *j) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (j->failed || j->closed)
    return;
  j->closed = true;
  char why[256];
  if (j->fd >= 0 && j->regular && fsync(j->fd) != 0) {
    snprintf(why, sizeof why, "fsync: %s", strerror(errno));
    filesink_fail(stage, j, SPN_EIO, why);
    return;
  }
  host->log(stage, j->job_id, SPN_LOG_DEBUG, "%lld frames written to %s", (long long)j->frames, j->path);
}

static int32_t filesink_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                                spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    filesink_job_t *j = job_states[i];
    if (j->failed)
      continue;
    const spn_envelope_t *env = host->msg_envelope(msgs[i]);
    if (env->flags & SPN_MSG_EOS) {
      filesink_end(stage, j);
      continue;
    }
    if (env->seq != j->next_seq) {
      char why[128];
      snprintf(why, sizeof why, "seq %llu arrived where %llu was expected", (unsigned long long)env->seq,
               (unsigned long long)j->next_seq);
      filesink_fail(stage, j, SPN_EPROTO, why);
      continue;
    }
    j->next_seq++;
    if (env->flags & SPN_MSG_SKIP)
      continue;
    filesink_write(stage, j, msgs[i], env->seq);
    if (j->failed)
      continue;
    j->frames++;
    host->progress(stage, j->job_id, j->frames, env->total);
  }
  return SPN_OK;
}

static int32_t filesink_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  filesink_end(stage, job_state);
  return SPN_OK;
}

static void filesink_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  filesink_job_t *j = job_state;
  if (!j)
    return;
  if (j->fd >= 0) {
    close(j->fd);
    /* A failed or cancelled job leaves nothing behind. */
    if ((!ok || j->failed) && j->regular)
      unlink(j->path);
  }
  free(j->path);
  free(j);
}

static int32_t filesink_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "filesink",
      .doc = "sink that writes each job's frame bytes, in order, to the per-job path",
      .schema = filesink_schema,
      .config_size = sizeof(filesink_config_t),
      .inputs = filesink_inputs,
      .n_inputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .job_open = filesink_job_open,
      .process = filesink_process,
      .flush = filesink_flush,
      .job_close = filesink_job_close,
      .flags = SPN_KIND_SEES_SKIPS, /* a dropped frame is not a gap */
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(filesink, .version = "1.0", .license = "Apache-2.0", .init = filesink_init)
