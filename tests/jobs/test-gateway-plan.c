/* test-gateway-plan.c — a segmented SUBMIT is planned (the runner reads its
 * input's keyframes) off the gateway's loop: while a slow plan runs, the
 * gateway keeps answering other clients, and the planned job then lands
 * with its segments and its own reply. A gateway stopped while a plan runs
 * waits for it and loses nothing.
 *
 * A real spn_server on loopback with a runner whose segment_plan sleeps
 * (PLAN_MS) and cuts every job into two segments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "proto-internal.h"
#include "server-internal.h"
#include "spindle/jobs.h"

#define PLAN_MS 1500

typedef struct plan_counter {
  pthread_mutex_t mu;
  int planned;
  pthread_t loop_thread; /* the thread running spn_server_run */
  int on_loop;           /* plans called on that thread (must stay 0) */
} plan_counter_t;

typedef struct gw {
  spn_server_config_t cfg;
  spn_job_runner_t runner;
  plan_counter_t pc;
  spn_server_t *s;
  pthread_t th;
  char ep[128];
  char db[128];
  void *ctx;
} gw_t;

static int32_t r_run(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  (void)data, (void)job, (void)ctx, (void)err;
  return SPN_OK;
}

static bool r_has(void *data, const char *name) {
  (void)data;
  return !strcmp(name, "clip");
}

static int32_t r_plan(void *data, const spn_job_spec_t *job, uint32_t segments, double seconds,
                      struct spn_segment_plan *plan, spn_error_t *err) {
  (void)job, (void)seconds;
  plan_counter_t *pc = data;
  pthread_mutex_lock(&pc->mu);
  if (pthread_equal(pthread_self(), pc->loop_thread))
    pc->on_loop++;
  pthread_mutex_unlock(&pc->mu);
  if (segments == 99)
    return spn_error_set(err, SPN_EMEDIA, "input \"video\": no keyframe");
  struct timespec ts = {PLAN_MS / 1000, (PLAN_MS % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  plan->count = 2;
  plan->bounds = calloc(3, sizeof *plan->bounds);
  if (!plan->bounds)
    return SPN_ENOMEM;
  plan->bounds[1] = 2.0;
  plan->bounds[2] = 4.0;
  snprintf(plan->start_key, sizeof plan->start_key, "decode.start");
  snprintf(plan->duration_key, sizeof plan->duration_key, "decode.duration");
  snprintf(plan->output, sizeof plan->output, "out");
  snprintf(plan->input, sizeof plan->input, "video");
  pthread_mutex_lock(&pc->mu);
  pc->planned++;
  pthread_mutex_unlock(&pc->mu);
  return SPN_OK;
}

static void *gw_main(void *arg) {
  gw_t *g = arg;
  spn_server_run(g->s, NULL);
  return NULL;
}

static char g_dir[64];

static int setup(void **state) {
  gw_t *g = calloc(1, sizeof *g);
  assert_non_null(g);
  pthread_mutex_init(&g->pc.mu, NULL);
  spn_server_config_defaults(&g->cfg);
  snprintf(g_dir, sizeof g_dir, "/tmp/spn-plan-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g->db, sizeof g->db, "%s/q.db", g_dir);
  g->cfg.db_path = strdup(g->db);
  g->cfg.bind = strdup("tcp://127.0.0.1:*");
  g->cfg.workers = 0;
  /* Inputs and outputs confined to the test's folder. */
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__roots_add(&g->cfg.input_roots, g_dir, &err), SPN_OK);
  assert_int_equal(spn__roots_add(&g->cfg.output_roots, g_dir, &err), SPN_OK);
  char in[128];
  snprintf(in, sizeof in, "%s/in.mp4", g_dir);
  FILE *f = fopen(in, "w");
  assert_non_null(f);
  fputs("not read by this runner", f);
  fclose(f);
  g->runner = (spn_job_runner_t){.data = &g->pc, .run = r_run, .has_pipeline = r_has, .segment_plan = r_plan};
  assert_int_equal(spn_server_new(&g->cfg, &g->runner, &g->s, &err), SPN_OK);
  size_t n = sizeof g->ep;
  assert_int_equal(zmq_getsockopt(g->s->router, ZMQ_LAST_ENDPOINT, g->ep, &n), 0);
  assert_int_equal(pthread_create(&g->th, NULL, gw_main, g), 0);
  g->pc.loop_thread = g->th;
  g->ctx = zmq_ctx_new();
  *state = g;
  return 0;
}

static void gw_stop(gw_t *g) {
  if (!g->s)
    return;
  spn_server_stop(g->s);
  pthread_join(g->th, NULL);
  spn_server_free(&g->s);
}

static int teardown(void **state) {
  gw_t *g = *state;
  gw_stop(g);
  zmq_ctx_term(g->ctx);
  spn_server_config_clear(&g->cfg);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", g_dir);
  pthread_mutex_destroy(&g->pc.mu);
  free(g);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *dealer(gw_t *g) {
  void *s = zmq_socket(g->ctx, ZMQ_DEALER);
  int z = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &z, sizeof z);
  assert_int_equal(zmq_connect(s, g->ep), 0);
  return s;
}

static void send_body(void *s, const char *type, const char *body) {
  zmq_send(s, "", 0, ZMQ_SNDMORE);
  zmq_send(s, "SPN1", 4, ZMQ_SNDMORE);
  zmq_send(s, type, strlen(type), ZMQ_SNDMORE);
  zmq_send(s, body, strlen(body), 0);
}

/* One reply (type into t, body returned; NULL on timeout). */
static cJSON *recv_reply(void *s, char t[17], int timeout_ms) {
  zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&it, 1, timeout_ms) <= 0)
    return NULL;
  spn_pmsg_t m;
  if (spn__proto_recv(s, false, &m) != SPN_OK)
    return NULL;
  snprintf(t, 17, "%s", m.type);
  return m.body;
}

static void segmented_body(char *buf, size_t cap, int req, int segments) {
  snprintf(buf, cap,
           "{\"req\":%d,\"pipeline\":\"clip\",\"inputs\":{\"video\":\"%s/in.mp4\"},"
           "\"outputs\":{\"out\":\"%s/out-%d.mp4\"},\"segments\":%d}",
           req, g_dir, g_dir, req, segments);
}

static void test_plan_off_loop(void **state) {
  gw_t *g = *state;
  void *a = dealer(g), *b = dealer(g);
  char body[512], t[17];
  segmented_body(body, sizeof body, 1, 2);
  double t0 = now_s();
  send_body(a, "SUBMIT", body);
  usleep(100 * 1000); /* the plan has started */
  /* Another client is served while the plan sleeps. */
  send_body(b, "SUBMIT", "{\"req\":7,\"pipeline\":\"clip\"}");
  cJSON *r = recv_reply(b, t, PLAN_MS / 2);
  double t_other = now_s() - t0;
  assert_non_null(r);
  assert_string_equal(t, "SUBMITTED");
  cJSON_Delete(r);
  assert_true(t_other < PLAN_MS / 1000.0);
  /* The planned job arrives after its plan, with its segments. */
  r = recv_reply(a, t, 10 * PLAN_MS);
  assert_non_null(r);
  assert_string_equal(t, "SUBMITTED");
  assert_true(now_s() - t0 >= PLAN_MS / 1000.0 * 0.95);
  const cJSON *id = cJSON_GetObjectItem(r, "id");
  assert_true(cJSON_IsNumber(id));
  char st[64];
  snprintf(st, sizeof st, "{\"req\":2,\"id\":%d}", (int)id->valuedouble);
  cJSON_Delete(r);
  send_body(a, "STATUS", st);
  r = recv_reply(a, t, 5000);
  assert_non_null(r);
  assert_string_equal(t, "STATUS");
  const cJSON *segs = cJSON_GetObjectItem(r, "segments");
  assert_int_equal(cJSON_GetArraySize(segs), 2);
  cJSON_Delete(r);
  assert_int_equal(g->pc.planned, 1);
  assert_int_equal(g->pc.on_loop, 0);
  zmq_close(a);
  zmq_close(b);
}

/* A plan that fails: the error names the input, nothing is stored. */
static void test_plan_error(void **state) {
  gw_t *g = *state;
  void *a = dealer(g);
  char body[512], t[17];
  segmented_body(body, sizeof body, 3, 99);
  send_body(a, "SUBMIT", body);
  cJSON *r = recv_reply(a, t, 10 * PLAN_MS);
  assert_non_null(r);
  assert_string_equal(t, "ERROR");
  const cJSON *msg = cJSON_GetObjectItem(r, "message");
  assert_non_null(strstr(msg->valuestring, "no keyframe"));
  cJSON_Delete(r);
  send_body(a, "LIST", "{\"req\":4}");
  r = recv_reply(a, t, 5000);
  assert_non_null(r);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "jobs")), 0);
  cJSON_Delete(r);
  zmq_close(a);
}

static void count_kid(void *user, const spn_queue_job_t *job) {
  (void)job;
  (*(size_t *)user)++;
}

/* Stopped while a plan runs: the stop waits for it, the job is stored and
 * acknowledged (nothing half-done, nothing lost). */
static void test_stop_during_plan(void **state) {
  gw_t *g = *state;
  void *a = dealer(g);
  char body[512], t[17];
  segmented_body(body, sizeof body, 5, 2);
  send_body(a, "SUBMIT", body);
  usleep(200 * 1000);
  gw_stop(g);
  cJSON *r = recv_reply(a, t, 2000);
  assert_non_null(r);
  assert_string_equal(t, "SUBMITTED");
  cJSON_Delete(r);
  zmq_close(a);
  /* Reopened: the job and its two segments are there. */
  spn_queue_config_t qc = {.backend = "sqlite", .path = g->db};
  spn_queue_t q;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_queue_open(&qc, &q, &err), SPN_OK);
  spn_queue_job_t j;
  memset(&j, 0, sizeof j);
  assert_int_equal(q.ops->get(q.impl, 1, &j, &err), SPN_OK);
  spn__queue_job_clear(&j);
  size_t nk = 0;
  assert_int_equal(q.ops->children(q.impl, 1, count_kid, &nk, &err), SPN_OK);
  assert_int_equal(nk, 2);
  spn_queue_free(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_plan_off_loop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plan_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stop_during_plan, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
