/* exec.c — running one leased job on a worker thread, and the built-in test
 * runner.
 *
 * Output discipline: every output i is written to a temporary file beside its
 * final path, named ".<stem>.spn-<job id>-<attempt>.tmp<.ext>" (the final
 * name's extension kept last, so a runner that picks a container or format
 * from the name — the encode stage does — sees the one the user asked for:
 * "out.mp4" is written as ".out.spn-7-1.tmp.mp4"). An attempt
 * first removes the temporaries of the job's earlier attempts (left by a
 * worker killed mid-write), so a retry never leaves a second file; an attempt
 * that lost its lease but still runs (a frozen worker that woke up) cannot
 * disturb the new attempt's file, and cannot publish its own because it was
 * unlinked. Only after the runner returns SPN_OK are the temporaries renamed
 * (atomic within a directory) to the final names; on failure or cancel they
 * are removed. So an output is either absent or complete, and never two.
 *
 * Exactly-once publication: before the first rename an attempt writes a
 * publication marker ".spn-<job id>.published" (holding its attempt number)
 * beside the job's first output. The marker is removed only once the queue
 * has durably recorded the job as succeeded (the gateway after its commit,
 * a queue worker after complete()). A re-run of the job — its lease was lost
 * between the renames and that record (the gateway was killed -9), or it was
 * released (same attempt number) while its report was in flight —
 * finds the marker, finishes the recorded attempt's renames if any are left
 * (its temporaries are still there), and succeeds without running the job
 * again: an output once renamed into place is never written again.
 *
 * The marker's second line carries what the publishing attempt reported, as
 * one JSON object: its last progress ("done", "total") and the fields of a
 * remote worker's DONE (spn__exec_report_to_json). The re-run reports those
 * as its own, so the job's record says what produced its outputs (not "1 of
 * 1" with no warnings). The line is optional: a marker with only "attempt N"
 * still rolls forward.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-internal.h"
#include "proto-internal.h"

/* ---- job specs ---- */

static int32_t io_list(const cJSON *obj, const char *key, spn_job_io_t **out, size_t *n,
                       spn_error_t *err) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = NULL;
  *n = 0;
  if (!o)
    return SPN_OK;
  if (!cJSON_IsObject(o))
    return spn_error_set(err, SPN_EINVAL, "job spec: \"%s\" must be an object of name: path", key);
  size_t cnt = (size_t)cJSON_GetArraySize(o);
  if (cnt == 0)
    return SPN_OK;
  *out = calloc(cnt, sizeof **out);
  if (!*out)
    return spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
  const cJSON *it;
  cJSON_ArrayForEach(it, o) {
    if (!cJSON_IsString(it))
      return spn_error_set(err, SPN_EINVAL, "job spec: %s.%s must be a string path", key,
                           it->string);
    (*out)[*n].name = strdup(it->string);
    (*out)[*n].path = strdup(it->valuestring);
    (*n)++;
    if (!(*out)[*n - 1].name || !(*out)[*n - 1].path)
      return spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
  }
  return SPN_OK;
}

int32_t spn__job_spec_from_json(const cJSON *obj, int64_t id, uint32_t attempt, spn_job_spec_t *s,
                                spn_error_t *err) {
  memset(s, 0, sizeof *s);
  s->id = id;
  s->attempt = attempt;
  int32_t rc;
  const char *p = spn__json_str(obj, "pipeline");
  if (!p || !*p) {
    rc = spn_error_set(err, SPN_EINVAL, "job spec: \"pipeline\" must be a non-empty string");
    goto out_fail;
  }
  if (!(s->pipeline = strdup(p))) {
    rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
    goto out_fail;
  }
  if ((rc = io_list(obj, "inputs", &s->inputs, &s->n_inputs, err)) < 0 ||
      (rc = io_list(obj, "outputs", &s->outputs, &s->n_outputs, err)) < 0)
    goto out_fail;
  const cJSON *to = cJSON_GetObjectItemCaseSensitive(obj, "timeout");
  if (to) {
    if (!cJSON_IsNumber(to) || !(to->valuedouble > 0) || to->valuedouble > SPN_JOB_TIMEOUT_MAX_S) {
      rc = spn_error_set(err, SPN_EINVAL, "job spec: \"timeout\" must be seconds in (0, %d]", SPN_JOB_TIMEOUT_MAX_S);
      goto out_fail;
    }
    s->timeout_s = to->valuedouble;
  }
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(obj, "params");
  if (pr && !cJSON_IsObject(pr)) {
    rc = spn_error_set(err, SPN_EINVAL, "job spec: \"params\" must be an object");
    goto out_fail;
  }
  size_t cnt = pr ? (size_t)cJSON_GetArraySize(pr) : 0;
  if (cnt) {
    s->params = calloc(cnt, sizeof *s->params);
    if (!s->params) {
      rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
      goto out_fail;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, pr) {
      char buf[64];
      const char *v;
      if (cJSON_IsString(it))
        v = it->valuestring;
      else if (cJSON_IsNumber(it)) {
        snprintf(buf, sizeof buf, "%.17g", it->valuedouble);
        v = buf;
      } else if (cJSON_IsBool(it))
        v = cJSON_IsTrue(it) ? "true" : "false";
      else {
        rc = spn_error_set(err, SPN_EINVAL, "job spec: params.%s must be a string, number or boolean",
                           it->string);
        goto out_fail;
      }
      s->params[s->n_params].key = strdup(it->string);
      s->params[s->n_params].value = strdup(v);
      s->n_params++;
      if (!s->params[s->n_params - 1].key || !s->params[s->n_params - 1].value) {
        rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
        goto out_fail;
      }
    }
  }
  /* The join step of a segmented job (gateway.c writes the plan): its
   * segment files are derived from its output and id, its cut times kept. */
  const cJSON *seg = cJSON_GetObjectItemCaseSensitive(obj, "segments");
  if (seg) {
    const cJSON *bounds = cJSON_GetObjectItemCaseSensitive(seg, "bounds");
    const char *oname = spn__json_str(seg, "output");
    const spn_job_io_t *out = NULL;
    for (size_t i = 0; oname && i < s->n_outputs; i++)
      if (!strcmp(s->outputs[i].name, oname))
        out = &s->outputs[i];
    int nb = cJSON_IsArray(bounds) ? cJSON_GetArraySize(bounds) : 0;
    if (nb < 2 || !out) {
      rc = spn_error_set(err, SPN_EINVAL, "job spec: \"segments\" needs an output name and 2 or more bounds");
      goto out_fail;
    }
    size_t n = (size_t)nb - 1;
    /* the input the joined audio comes from ("audio"; plans stored before
     * it named only the cut input, which was it) */
    const char *iname = spn__json_str(seg, "audio");
    if (!iname)
      iname = spn__json_str(seg, "input");
    s->segment_audio_cut = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(seg, "audio_cut"));
    for (size_t i = 0; iname && i < s->n_inputs; i++)
      if (!strcmp(s->inputs[i].name, iname) && !(s->segment_source = strdup(s->inputs[i].path))) {
        rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
        goto out_fail;
      }
    s->segment_files = calloc(n, sizeof *s->segment_files);
    s->segment_bounds = calloc(n + 1, sizeof *s->segment_bounds);
    if (!s->segment_files || !s->segment_bounds) {
      rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
      goto out_fail;
    }
    s->n_segments = n;
    for (size_t i = 0; i <= n; i++) {
      const cJSON *b = cJSON_GetArrayItem(bounds, (int)i);
      if (!cJSON_IsString(b)) {
        rc = spn_error_set(err, SPN_EINVAL, "job spec: segments.bounds[%zu] must be a time string", i);
        goto out_fail;
      }
      s->segment_bounds[i] = strtod(b->valuestring, NULL);
      if (i < n && !(s->segment_files[i] = spn__segment_file(out->path, id, (uint32_t)i))) {
        rc = spn_error_set(err, SPN_ENOMEM, "job spec: out of memory");
        goto out_fail;
      }
    }
  }
  return SPN_OK;
out_fail:
  spn__job_spec_free(s);
  return rc;
}

void spn__job_spec_free(spn_job_spec_t *s) {
  for (size_t i = 0; i < s->n_inputs; i++) {
    free(s->inputs[i].name);
    free(s->inputs[i].path);
  }
  for (size_t i = 0; i < s->n_outputs; i++) {
    free(s->outputs[i].name);
    free(s->outputs[i].path);
  }
  for (size_t i = 0; i < s->n_params; i++) {
    free(s->params[i].key);
    free(s->params[i].value);
  }
  for (size_t i = 0; s->segment_files && i < s->n_segments; i++)
    free(s->segment_files[i]);
  free(s->segment_files);
  free(s->segment_bounds);
  free(s->segment_source);
  free(s->inputs);
  free(s->outputs);
  free(s->params);
  free(s->pipeline);
  memset(s, 0, sizeof *s);
}

void spn_segment_plan_free(spn_segment_plan_t *plan) {
  free(plan->bounds);
  memset(plan, 0, sizeof *plan);
}

const char *spn_job_spec_param(const spn_job_spec_t *job, const char *key) {
  for (size_t i = 0; i < job->n_params; i++)
    if (!strcmp(job->params[i].key, key))
      return job->params[i].value;
  return NULL;
}

/* ---- context ---- */

void spn_job_ctx_progress(spn_job_ctx_t *ctx, uint64_t done, uint64_t total) {
  if (!ctx->progress)
    return;
  ctx->done = done;
  ctx->total = total;
  /* Coalesce: at most one event per 50 ms, but always the last one. */
  double now = spn__mono_s();
  if (done < total && now - ctx->last_progress_s < 0.05)
    return;
  ctx->last_progress_s = now;
  ctx->progress(ctx->progress_user, done, total);
}

/* Its owner (a cancel, a worker stopping) asked it to stop. */
static bool owner_cancelled(const spn_job_ctx_t *ctx) {
  return ctx->cancel_flag && __atomic_load_n(ctx->cancel_flag, __ATOMIC_ACQUIRE) != 0;
}

bool spn_job_ctx_cancelled(const spn_job_ctx_t *ctx) {
  return owner_cancelled(ctx) || (ctx->deadline > 0 && spn__mono_s() >= ctx->deadline);
}

const char *spn_job_ctx_output_tmp(const spn_job_ctx_t *ctx, size_t i) {
  return i < ctx->job->n_outputs ? ctx->tmp_paths[i] : NULL;
}

void spn_job_ctx_add_gpu_seconds(spn_job_ctx_t *ctx, double seconds) { ctx->gpu_s += seconds; }

void spn_job_ctx_warn(spn_job_ctx_t *ctx, const char *msg) {
  if (!msg || !*msg)
    return;
  if (!ctx->warnings)
    ctx->warnings = cJSON_CreateArray();
  if (ctx->warnings)
    cJSON_AddItemToArray(ctx->warnings, cJSON_CreateString(msg));
}

void spn__warnings_render(const cJSON *arr, char *out, size_t size) {
  out[0] = '\0';
  int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
  if (!n || size < 64)
    return;
  /* Keep lines while they fit with room left for the "more" line. */
  cJSON *keep = cJSON_CreateArray();
  int kept = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    if (!cJSON_IsString(it))
      continue;
    cJSON_AddItemToArray(keep, cJSON_CreateString(it->valuestring));
    char *txt = cJSON_PrintUnformatted(keep);
    bool fits = txt && strlen(txt) + 80 < size;
    free(txt);
    if (!fits) {
      cJSON_DeleteItemFromArray(keep, kept);
      break;
    }
    kept++;
  }
  int strings = 0;
  cJSON_ArrayForEach(it, arr) strings += cJSON_IsString(it);
  if (kept < strings) {
    char more[80];
    snprintf(more, sizeof more, "... %d more warnings: see the worker's log", strings - kept);
    cJSON_AddItemToArray(keep, cJSON_CreateString(more));
  }
  char *txt = kept || strings ? cJSON_PrintUnformatted(keep) : NULL;
  if (txt && strlen(txt) < size)
    memcpy(out, txt, strlen(txt) + 1);
  free(txt);
  cJSON_Delete(keep);
}

spn_fail_how_t spn__fail_how(int32_t status) {
  return status == SPN_ECANCELLED ? SPN_FAIL_CANCELLED : status == SPN_EMEDIA ? SPN_FAIL_FINAL : SPN_FAIL_RETRY;
}

void spn__exec_report_to_json(cJSON *b, const spn_exec_result_t *res) {
  cJSON_AddNumberToObject(b, "compute_s", res->compute_s);
  cJSON_AddNumberToObject(b, "gpu_s", res->gpu_s);
  spn__xfer_to_json(b, "transfers", &res->xfer);
  cJSON *w = res->status == SPN_OK && res->warnings[0] ? cJSON_Parse(res->warnings) : NULL;
  if (cJSON_IsArray(w))
    cJSON_AddItemToObject(b, "warnings", w);
  else
    cJSON_Delete(w);
}

static double seconds_of(const cJSON *b, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= 0 ? v->valuedouble : 0;
}

uint32_t spn__exec_report_from_json(const cJSON *b, spn_exec_result_t *res, spn_error_t *err) {
  uint32_t bad = 0;
  res->compute_s = seconds_of(b, "compute_s");
  res->gpu_s = seconds_of(b, "gpu_s");
  if (spn__xfer_from_json(cJSON_GetObjectItemCaseSensitive(b, "transfers"), &res->xfer, err) != SPN_OK) {
    memset(&res->xfer, 0, sizeof res->xfer);
    bad |= SPN_REPORT_BAD_TRANSFERS;
  }
  /* Warnings: an array of strings, kept as far as they fit. */
  const cJSON *wn = cJSON_GetObjectItemCaseSensitive(b, "warnings");
  bool wn_ok = !wn || cJSON_IsArray(wn);
  const cJSON *it;
  if (wn_ok && wn)
    cJSON_ArrayForEach(it, wn) wn_ok = wn_ok && cJSON_IsString(it);
  if (wn_ok)
    spn__warnings_render(wn, res->warnings, sizeof res->warnings);
  else
    bad |= SPN_REPORT_BAD_WARNINGS;
  return bad;
}

char *spn__publish_marker(const spn_job_spec_t *job) {
  if (job->n_outputs == 0)
    return NULL;
  const char *final = job->outputs[0].path;
  const char *slash = strrchr(final, '/');
  size_t dirlen = slash ? (size_t)(slash - final + 1) : 0;
  size_t n = dirlen + 64;
  char *m = malloc(n);
  if (m)
    snprintf(m, n, "%.*s.spn-%lld.published", (int)dirlen, final, (long long)job->id);
  return m;
}

char *spn__publish_marker_of(spn_queue_t *q, int64_t id) {
  spn_queue_job_t j;
  if (q->ops->get(q->impl, id, &j, NULL) < 0)
    return NULL;
  cJSON *spec = cJSON_Parse(j.spec_json);
  spn_job_spec_t js;
  char *m = NULL;
  if (spec && spn__job_spec_from_json(spec, id, j.attempts, &js, NULL) == SPN_OK) {
    m = spn__publish_marker(&js);
    spn__job_spec_free(&js);
  }
  cJSON_Delete(spec);
  spn__queue_job_clear(&j);
  return m;
}

void spn__unpublish(spn_queue_t *q, int64_t id) {
  char *m = spn__publish_marker_of(q, id);
  if (!m)
    return; /* no outputs (or the queue is away: a later sweep hands it out) */
  if (unlink(m) != 0 && errno != ENOENT) {
    free(m);
    return; /* kept in the queue's list: a later sweep tries again */
  }
  free(m);
  if (q->ops->unpublished)
    q->ops->unpublished(q->impl, id, NULL);
}

static char *tmp_name(const char *final, int64_t id, uint32_t attempt);

char *spn__segment_file(const char *final, int64_t parent, uint32_t k) {
  const char *slash = strrchr(final, '/');
  size_t dirlen = slash ? (size_t)(slash - final + 1) : 0;
  const char *base = final + dirlen;
  const char *dot = strrchr(base, '.');
  if (!dot || dot == base || !dot[1])
    dot = base + strlen(base);
  size_t n = strlen(final) + 64;
  char *t = malloc(n);
  if (t)
    snprintf(t, n, "%.*s.%.*s.spn-%lld-seg%u%s", (int)dirlen, final, (int)(dot - base), base, (long long)parent, k,
             dot);
  return t;
}

/* An earlier attempt of this job published (or began to): finish its
 * renames and report success without running again. Returns true when the
 * job is published; false when there is no usable marker (it is removed
 * then, and the job runs). */
static bool roll_forward(const spn_job_spec_t *job, const char *marker, spn_job_ctx_t *ctx,
                         spn_exec_result_t *res) {
  FILE *f = fopen(marker, "r");
  if (!f)
    return false;
  unsigned att = 0;
  char line[SPN_JOB_WARNINGS_MAX + 1024];
  bool ok = fgets(line, sizeof line, f) && sscanf(line, "attempt %u", &att) == 1 && att > 0 &&
            att <= job->attempt;
  /* What the publishing attempt reported (write_marker); what does not parse
   * is left out, never guessed. */
  int64_t done = 0, total = 0;
  cJSON *rep = ok && fgets(line, sizeof line, f) ? cJSON_Parse(line) : NULL;
  if (cJSON_IsObject(rep)) {
    if (!spn__json_int(rep, "done", &done) || !spn__json_int(rep, "total", &total))
      done = total = 0;
    spn__exec_report_from_json(rep, res, NULL);
  }
  cJSON_Delete(rep);
  fclose(f);
  for (size_t i = 0; ok && i < job->n_outputs; i++) {
    char *t = tmp_name(job->outputs[i].path, job->id, att);
    struct stat st;
    if (!t)
      ok = false;
    else if (stat(t, &st) == 0)
      ok = rename(t, job->outputs[i].path) == 0;
    else
      ok = stat(job->outputs[i].path, &st) == 0;
    free(t);
  }
  if (!ok) {
    unlink(marker);
    *res = (spn_exec_result_t){0};
    return false;
  }
  if (total > 0 && done >= 0 && done <= total)
    spn_job_ctx_progress(ctx, (uint64_t)done, (uint64_t)total);
  res->status = SPN_OK;
  res->published_before = true;
  return true;
}

/* The marker: "attempt N", then what this attempt reported as one line of
 * JSON (roll_forward reads it back). */
static int32_t write_marker(const char *marker, uint32_t attempt, const spn_job_ctx_t *ctx,
                            const spn_exec_result_t *res, spn_error_t *err) {
  cJSON *rep = cJSON_CreateObject();
  char *txt = NULL;
  if (rep) {
    cJSON_AddNumberToObject(rep, "done", (double)ctx->done);
    cJSON_AddNumberToObject(rep, "total", (double)ctx->total);
    spn__exec_report_to_json(rep, res);
    txt = cJSON_PrintUnformatted(rep);
    cJSON_Delete(rep);
  }
  if (!txt)
    return spn_error_set(err, SPN_ENOMEM, "publication marker %s: out of memory", marker);
  int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(txt);
    return spn_error_set(err, SPN_EIO, "publication marker %s: %s", marker, strerror(errno));
  }
  char head[32];
  int n = snprintf(head, sizeof head, "attempt %u\n", attempt);
  struct iovec iov[] = {{head, (size_t)n}, {txt, strlen(txt)}, {"\n", 1}};
  ssize_t want = (ssize_t)(iov[0].iov_len + iov[1].iov_len + 1);
  bool ok = writev(fd, iov, 3) == want && fsync(fd) == 0;
  free(txt);
  close(fd);
  if (!ok) {
    unlink(marker);
    return spn_error_set(err, SPN_EIO, "publication marker %s: write failed", marker);
  }
  return SPN_OK;
}

static char *tmp_name(const char *final, int64_t id, uint32_t attempt) {
  const char *slash = strrchr(final, '/');
  size_t dirlen = slash ? (size_t)(slash - final + 1) : 0;
  const char *base = final + dirlen;
  /* The extension is the last dot's suffix, not a leading dot (".hidden"
   * has none) and not an empty one ("out." has none). */
  const char *dot = strrchr(base, '.');
  if (!dot || dot == base || !dot[1])
    dot = base + strlen(base);
  size_t n = strlen(final) + 64;
  char *t = malloc(n);
  if (t)
    snprintf(t, n, "%.*s.%.*s.spn-%lld-%u.tmp%s", (int)dirlen, final, (int)(dot - base), base, (long long)id,
             attempt, dot);
  return t;
}

/* Remove an earlier attempt's temporary and whatever the runner derived
 * from its name (the encode stage writes "<tmp>.XXXXXX" and renames it to
 * <tmp> when done: a worker killed mid-encode leaves that behind). */
static void remove_leftovers(const char *tmp) {
  unlink(tmp);
  const char *slash = strrchr(tmp, '/');
  if (!slash)
    return;
  char *dir = strndup(tmp, (size_t)(slash - tmp) + 1);
  const char *base = slash + 1;
  size_t blen = strlen(base);
  DIR *d = dir ? opendir(dir) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, base, blen) != 0 || e->d_name[blen] != '.')
      continue;
    char *p = malloc(strlen(dir) + strlen(e->d_name) + 1);
    if (p) {
      sprintf(p, "%s%s", dir, e->d_name);
      unlink(p);
      free(p);
    }
  }
  if (d)
    closedir(d);
  free(dir);
}

/* The folder of each output must exist and be writable here, on the worker
 * that runs the job: the gateway checked it at submit, but a worker that
 * does not mount what the gateway does, or a folder removed meanwhile, would
 * otherwise fail only deep in a runner, naming the temporary. */
static int32_t check_output_dirs(const spn_job_spec_t *job, spn_error_t *err) {
  for (size_t i = 0; i < job->n_outputs; i++) {
    const char *path = job->outputs[i].path;
    const char *slash = strrchr(path, '/');
    char *dir = slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!dir)
      return spn_error_set(err, SPN_ENOMEM, "job %lld: out of memory", (long long)job->id);
    struct stat st;
    int e = stat(dir, &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR
                                          : access(dir, W_OK | X_OK) != 0 ? errno : 0;
    free(dir);
    if (e)
      return spn_error_set(err, SPN_ENOENT, "job %lld: output %s=%s: directory: %s (on this worker)",
                           (long long)job->id, job->outputs[i].name, path, strerror(e));
  }
  return SPN_OK;
}

/* An error that names an output's temporary (".out.spn-12-1.tmp.mp4": the
 * stage wrote there) names the output instead: that is the path the user
 * gave and knows. Every occurrence, for each output. */
static void name_outputs(const spn_job_spec_t *job, char *const *tmp, char *msg, size_t size) {
  for (size_t i = 0; i < job->n_outputs; i++) {
    size_t tl = tmp[i] ? strlen(tmp[i]) : 0;
    char *at = tl ? strstr(msg, tmp[i]) : NULL;
    while (at) {
      char rest[SPN_ERROR_MSG_MAX];
      snprintf(rest, sizeof rest, "%s", at + tl);
      size_t off = (size_t)(at - msg);
      snprintf(at, size - off, "%s%s", job->outputs[i].path, rest);
      size_t fl = strlen(job->outputs[i].path);
      at = off + fl < size ? strstr(msg + off + fl, tmp[i]) : NULL;
    }
  }
}

void spn__job_execute(const spn_job_runner_t *runner, const spn_job_spec_t *job,
                      const volatile int *cancel_flag, spn_exec_progress_cb progress, void *user,
                      spn_exec_result_t *res) {
  memset(res, 0, sizeof *res);
  spn_job_ctx_t ctx = {.job = job, .cancel_flag = cancel_flag, .progress = progress,
                       .progress_user = user, .last_progress_s = -1};
  spn_error_t err = SPN_ERROR_INIT;
  char *marker = spn__publish_marker(job);
  if (marker && roll_forward(job, marker, &ctx, res)) {
    free(marker);
    return;
  }
  ctx.tmp_paths = calloc(job->n_outputs ? job->n_outputs : 1, sizeof *ctx.tmp_paths);
  if (!ctx.tmp_paths || (job->n_outputs && !marker)) {
    free(marker);
    free(ctx.tmp_paths);
    res->status = SPN_ENOMEM;
    snprintf(res->error, sizeof res->error, "job %lld: out of memory", (long long)job->id);
    return;
  }
  for (size_t i = 0; i < job->n_outputs; i++) {
    if (!(ctx.tmp_paths[i] = tmp_name(job->outputs[i].path, job->id, job->attempt))) {
      res->status = spn_error_set(&err, SPN_ENOMEM, "job %lld: out of memory", (long long)job->id);
      goto out;
    }
    /* Remove what earlier attempts of this job may have left (a worker
     * killed mid-write). A worker still running an attempt it lost writes to
     * an unlinked file then, and its rename fails: it can never publish. */
    for (uint32_t a = 1; a < job->attempt; a++) {
      char *old = tmp_name(job->outputs[i].path, job->id, a);
      if (old)
        remove_leftovers(old);
      free(old);
    }
  }
  if ((res->status = check_output_dirs(job, &err)) != SPN_OK)
    goto out;
  double t0 = spn__mono_s();
  ctx.deadline = job->timeout_s > 0 ? t0 + job->timeout_s : 0;
  if (!runner->has_pipeline(runner->data, job->pipeline))
    res->status = spn_error_set(&err, SPN_ENOENT, "job %lld: unknown pipeline \"%s\"",
                                (long long)job->id, job->pipeline);
  else
    res->status = runner->run(runner->data, job, &ctx, &err);
  res->compute_s = spn__mono_s() - t0;
  res->gpu_s = ctx.gpu_s;
  res->xfer = ctx.xfer;
  spn__warnings_render(ctx.warnings, res->warnings, sizeof res->warnings);
  if (res->status == SPN_OK && owner_cancelled(&ctx))
    res->status = spn_error_set(&err, SPN_ECANCELLED, "cancelled");
  /* It stopped at its timeout (a run that finished anyway keeps its result;
   * a cancel by its owner stays a cancel). */
  if (res->status == SPN_ECANCELLED && ctx.deadline > 0 && spn__mono_s() >= ctx.deadline && !owner_cancelled(&ctx))
    res->status = spn_error_set(&err, SPN_ETIMEDOUT, "job %lld: timed out after %g s (its timeout)",
                                (long long)job->id, job->timeout_s);
  if (res->status == SPN_OK && marker)
    res->status = write_marker(marker, job->attempt, &ctx, res, &err);
  if (res->status == SPN_OK) {
    for (size_t i = 0; i < job->n_outputs; i++) {
      if (rename(ctx.tmp_paths[i], job->outputs[i].path) != 0) {
        res->status = spn_error_set(&err, SPN_EIO, "job %lld: output %s: rename %s: %s",
                                    (long long)job->id, job->outputs[i].name, job->outputs[i].path,
                                    strerror(errno));
        break;
      }
    }
  } else if (res->status == SPN_ECANCELLED && !err.msg[0]) {
    spn_error_set(&err, SPN_ECANCELLED, "cancelled");
  }
  /* Abandoned inside a stage's call: say so after why it was stopped. */
  if (ctx.wedged && res->status != SPN_OK) {
    res->wedged = true;
    if (!err.msg[0])
      snprintf(err.msg, sizeof err.msg, "%s", spn_strerror(res->status));
    size_t n = strlen(err.msg);
    snprintf(err.msg + n, sizeof err.msg - n, "; %s", ctx.wedged_why);
  }
out:
  if (res->status != SPN_OK) {
    for (size_t i = 0; i < job->n_outputs; i++)
      if (ctx.tmp_paths[i])
        unlink(ctx.tmp_paths[i]);
    /* A rename failed: nothing of this attempt is published. (If some
     * renames succeeded the job fails anyway; its retry republishes.) */
    if (marker)
      unlink(marker);
    if (ctx.tmp_paths)
      name_outputs(job, ctx.tmp_paths, err.msg, sizeof err.msg);
    snprintf(res->error, sizeof res->error, "%s", err.msg[0] ? err.msg : spn_strerror(res->status));
  }
  for (size_t i = 0; i < job->n_outputs; i++)
    free(ctx.tmp_paths[i]);
  free(ctx.tmp_paths);
  free(marker);
  cJSON_Delete(ctx.warnings);
}

/* ---- the built-in test runner ---- */

typedef struct test_runner {
  uint32_t chunk_bytes, chunk_delay_ms;
  char *exec_log;
} test_runner_t;

static void exec_log(test_runner_t *t, const char *what, const spn_job_spec_t *job) {
  if (!t->exec_log)
    return;
  int fd = open(t->exec_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return;
  char line[96];
  int n = snprintf(line, sizeof line, "%s %lld %u\n", what, (long long)job->id, job->attempt);
  /* One write with O_APPEND: lines from several processes never interleave. */
  if (write(fd, line, (size_t)n) != n) {
    /* the log is a test aid; nothing to do */
  }
  close(fd);
}

static const spn_job_io_t *find_io(const spn_job_io_t *v, size_t n, const char *name, size_t *idx) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].name, name)) {
      *idx = i;
      return &v[i];
    }
  if (n) {
    *idx = 0;
    return &v[0];
  }
  return NULL;
}

static int32_t run_copy(test_runner_t *t, const spn_job_spec_t *job, spn_job_ctx_t *ctx,
                        spn_error_t *err) {
  size_t ii, oi;
  const spn_job_io_t *in = find_io(job->inputs, job->n_inputs, "in", &ii);
  const spn_job_io_t *out = find_io(job->outputs, job->n_outputs, "out", &oi);
  if (!in || !out)
    return spn_error_set(err, SPN_EINVAL, "job %lld: pipeline \"%s\" needs one input and one output",
                         (long long)job->id, job->pipeline);
  uint32_t delay = t->chunk_delay_ms;
  const char *dp = spn_job_spec_param(job, "chunk_delay_ms");
  if (dp)
    delay = (uint32_t)strtoul(dp, NULL, 10);
  int32_t rc = SPN_OK;
  int ifd = open(in->path, O_RDONLY | O_CLOEXEC);
  if (ifd < 0)
    return spn_error_set(err, SPN_EIO, "job %lld: input %s: %s: %s", (long long)job->id, in->name,
                         in->path, strerror(errno));
  struct stat st;
  if (fstat(ifd, &st) != 0) {
    rc = spn_error_set(err, SPN_EIO, "job %lld: input %s: %s", (long long)job->id, in->path,
                       strerror(errno));
    goto out_in;
  }
  const char *tmp = spn_job_ctx_output_tmp(ctx, oi);
  int ofd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (ofd < 0) {
    rc = spn_error_set(err, SPN_EIO, "job %lld: output %s: %s: %s", (long long)job->id, out->name,
                       tmp, strerror(errno));
    goto out_in;
  }
  uint64_t chunk = t->chunk_bytes ? t->chunk_bytes : 65536;
  uint64_t total = ((uint64_t)st.st_size + chunk - 1) / chunk;
  char *buf = malloc(chunk);
  if (!buf) {
    rc = spn_error_set(err, SPN_ENOMEM, "job %lld: out of memory", (long long)job->id);
    goto out_out;
  }
  spn_job_ctx_progress(ctx, 0, total);
  for (uint64_t i = 0; i < total; i++) {
    if (spn_job_ctx_cancelled(ctx)) {
      rc = spn_error_set(err, SPN_ECANCELLED, "job %lld: cancelled after %llu of %llu chunks",
                         (long long)job->id, (unsigned long long)i, (unsigned long long)total);
      goto out_buf;
    }
    if (delay) {
      struct timespec ts = {delay / 1000, (long)(delay % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    ssize_t r = read(ifd, buf, chunk);
    if (r <= 0) {
      rc = spn_error_set(err, SPN_EIO, "job %lld: input %s: short read at chunk %llu",
                         (long long)job->id, in->path, (unsigned long long)i);
      goto out_buf;
    }
    if (write(ofd, buf, (size_t)r) != r) {
      rc = spn_error_set(err, SPN_EIO, "job %lld: output %s: write: %s", (long long)job->id, tmp,
                         strerror(errno));
      goto out_buf;
    }
    spn_job_ctx_progress(ctx, i + 1, total);
  }
  if (fsync(ofd) != 0)
    rc = spn_error_set(err, SPN_EIO, "job %lld: output %s: fsync: %s", (long long)job->id, tmp,
                       strerror(errno));
out_buf:
  free(buf);
out_out:
  close(ofd);
out_in:
  close(ifd);
  return rc;
}

static int32_t test_run(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  test_runner_t *t = data;
  exec_log(t, "start", job);
  int32_t rc;
  if (!strcmp(job->pipeline, "noop")) {
    rc = SPN_OK;
  } else if (!strcmp(job->pipeline, "fail")) {
    const char *sa = spn_job_spec_param(job, "succeed_at");
    if (sa && job->attempt >= strtoul(sa, NULL, 10)) {
      rc = run_copy(t, job, ctx, err);
    } else {
      const char *reason = spn_job_spec_param(job, "reason");
      rc = spn_error_set(err, SPN_EIO, "job %lld attempt %u: %s", (long long)job->id, job->attempt,
                         reason ? reason : "requested failure");
    }
  } else {
    rc = run_copy(t, job, ctx, err);
  }
  if (rc == SPN_OK)
    exec_log(t, "done", job);
  return rc;
}

static const char *const test_pipelines[] = {"copy", "fail", "noop"};

static bool test_has_pipeline(void *data, const char *name) {
  (void)data;
  for (size_t i = 0; i < sizeof test_pipelines / sizeof *test_pipelines; i++)
    if (!strcmp(name, test_pipelines[i]))
      return true;
  return false;
}

bool spn__pipeline_filter_add(char **filter, const char *name) {
  if (!*name || strchr(name, '\n'))
    return false;
  size_t have = *filter ? strlen(*filter) : 0, n = strlen(name);
  char *f = realloc(*filter, have + n + 3);
  if (!f)
    return false;
  if (!have)
    f[have++] = '\n';
  memcpy(f + have, name, n);
  f[have + n] = '\n';
  f[have + n + 1] = '\0';
  *filter = f;
  return true;
}

bool spn__pipeline_filter_next(const char *filter, const char **name, size_t *len) {
  const char *at = *name ? *name + *len + 1 : filter ? filter + 1 : NULL;
  const char *nl = at ? strchr(at, '\n') : NULL;
  if (!nl)
    return false;
  *name = at;
  *len = (size_t)(nl - at);
  return true;
}

void spn__pipeline_filter_describe(const char *filter, char *out, size_t n) {
  snprintf(out, n, "%s", filter ? "" : "any");
  size_t at = 0, len = 0;
  for (const char *name = NULL; at < n && spn__pipeline_filter_next(filter, &name, &len);) {
    int w = snprintf(out + at, n - at, "%s%.*s", at ? ", " : "", (int)len, name);
    at += w > 0 ? (size_t)w : 0;
  }
}

bool spn__runner_pipelines_add(const spn_job_runner_t *runner, char **filter) {
  if (!runner || runner->run != test_run)
    return spn__pipeline_runner_names(runner, filter);
  for (size_t i = 0; i < sizeof test_pipelines / sizeof *test_pipelines; i++)
    if (!spn__pipeline_filter_add(filter, test_pipelines[i]))
      return false;
  return true;
}

char *spn__runner_pipelines(const spn_job_runner_t *runner) {
  char *f = NULL;
  if (spn__runner_pipelines_add(runner, &f))
    return f;
  free(f);
  return NULL;
}

int32_t spn_test_runner_new(const spn_test_runner_config_t *cfg, spn_job_runner_t *out,
                            spn_error_t *err) {
  test_runner_t *t = calloc(1, sizeof *t);
  if (!t)
    return spn_error_set(err, SPN_ENOMEM, "test runner: out of memory");
  t->chunk_bytes = cfg->chunk_bytes;
  t->chunk_delay_ms = cfg->chunk_delay_ms;
  if (cfg->exec_log && !(t->exec_log = strdup(cfg->exec_log))) {
    free(t);
    return spn_error_set(err, SPN_ENOMEM, "test runner: out of memory");
  }
  *out = (spn_job_runner_t){.data = t, .run = test_run, .has_pipeline = test_has_pipeline};
  return SPN_OK;
}

void spn_test_runner_free(spn_job_runner_t *r) {
  test_runner_t *t = r->data;
  if (t) {
    free(t->exec_log);
    free(t);
  }
  *r = (spn_job_runner_t){0};
}

bool spn__job_is_segmented(const spn_queue_job_t *j) {
  return j->parent || strstr(j->spec_json, "\"segments\":") != NULL;
}

bool spn__warnings_any(const char *warnings_json) {
  return warnings_json && *warnings_json && strcmp(warnings_json, "[]");
}

static void segment_warned(void *user, const spn_queue_job_t *c) {
  if (spn__warnings_any(c->warnings_json))
    *(bool *)user = true;
}

bool spn__segments_warned(const spn_queue_t *q, int64_t id) {
  bool warned = false;
  if (q->ops->children)
    (void)q->ops->children(q->impl, id, segment_warned, &warned, NULL);
  return warned;
}

/* Give fn the segment files of segmented job p. */
static void segment_files_take(const spn_queue_job_t *p, void (*fn)(void *user, char *path), void *user) {
  cJSON *spec = cJSON_Parse(p->spec_json);
  spn_job_spec_t js;
  if (spec && spn__job_spec_from_json(spec, p->id, p->attempts, &js, NULL) == SPN_OK) {
    for (size_t k = 0; k < js.n_segments; k++) {
      fn(user, js.segment_files[k]);
      js.segment_files[k] = NULL;
    }
    spn__job_spec_free(&js);
  }
  cJSON_Delete(spec);
}

int64_t spn__segments_spent(spn_queue_t *q, int64_t id, void (*fn)(void *user, char *path), void *user) {
  spn_queue_job_t j, p;
  if (q->ops->get(q->impl, id, &j, NULL) < 0)
    return 0;
  int64_t parent = j.parent;
  if (parent && q->ops->get(q->impl, parent, &p, NULL) == SPN_OK) {
    /* A segment ended after its job failed or was cancelled: its file will
     * never be joined. */
    if (spn_queue_state_terminal(p.state) && p.state != SPN_QSTATE_SUCCEEDED)
      segment_files_take(&p, fn, user);
    spn__queue_job_clear(&p);
  } else if (!parent && spn_queue_state_terminal(j.state) && spn__job_is_segmented(&j)) {
    segment_files_take(&j, fn, user);
  }
  spn__queue_job_clear(&j);
  return parent;
}
