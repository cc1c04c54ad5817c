/* test-client-watch.c — spn_client_watch when the gateway stops answering.
 *
 * A fake gateway (a ROUTER socket on a thread of this test) answers the
 * first WATCH with a running job and then goes silent, as a gateway that
 * was killed. With a callback, the callback hears the silence (the last
 * status again, spn_client_unanswered_ms > 0) and stops the watch; without
 * one, the watch gives up after 60 timeouts with SPN_ETIMEDOUT and says
 * what the job was doing, instead of waiting for ever.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <zmq.h>

#include "spindle/client.h"

typedef struct fake {
  void *ctx, *router;
  char endpoint[128];
  pthread_t thread;
  int answered; /* WATCH requests answered (the first one only) */
} fake_t;

static void *fake_run(void *arg) {
  fake_t *f = arg;
  /* ident, "", "SPN1", type, body */
  zmq_msg_t part[5];
  int n = 0;
  for (;;) {
    zmq_msg_init(&part[n]);
    if (zmq_msg_recv(&part[n], f->router, 0) < 0) {
      zmq_msg_close(&part[n]);
      break;
    }
    int more = zmq_msg_more(&part[n]);
    n++;
    if (more && n < 5)
      continue;
    if (!more && n == 5 && !f->answered && zmq_msg_size(&part[3]) == 5 &&
        !memcmp(zmq_msg_data(&part[3]), "WATCH", 5)) {
      char body[256];
      size_t len = zmq_msg_size(&part[4]) < sizeof body - 1 ? zmq_msg_size(&part[4]) : sizeof body - 1;
      memcpy(body, zmq_msg_data(&part[4]), len);
      body[len] = '\0';
      cJSON *j = cJSON_Parse(body);
      const cJSON *req = cJSON_GetObjectItemCaseSensitive(j, "req");
      char reply[256];
      snprintf(reply, sizeof reply,
               "{\"req\":%lld,\"id\":7,\"state\":\"running\",\"attempts\":1,\"done\":3,\"total\":10}",
               cJSON_IsNumber(req) ? (long long)req->valuedouble : 0LL);
      cJSON_Delete(j);
      zmq_send(f->router, zmq_msg_data(&part[0]), zmq_msg_size(&part[0]), ZMQ_SNDMORE);
      zmq_send(f->router, "", 0, ZMQ_SNDMORE);
      zmq_send(f->router, "SPN1", 4, ZMQ_SNDMORE);
      zmq_send(f->router, "EVENT", 5, ZMQ_SNDMORE);
      zmq_send(f->router, reply, strlen(reply), 0);
      f->answered++;
    }
    for (int i = 0; i < n; i++)
      zmq_msg_close(&part[i]);
    n = 0;
    /* drain the rest of an over-long message */
    while (more) {
      zmq_msg_t x;
      zmq_msg_init(&x);
      if (zmq_msg_recv(&x, f->router, 0) < 0) {
        zmq_msg_close(&x);
        return NULL;
      }
      more = zmq_msg_more(&x);
      zmq_msg_close(&x);
    }
  }
  return NULL;
}

static void fake_start(fake_t *f) {
  memset(f, 0, sizeof *f);
  f->ctx = zmq_ctx_new();
  f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
  assert_int_equal(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
  size_t n = sizeof f->endpoint;
  assert_int_equal(zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &n), 0);
  assert_int_equal(pthread_create(&f->thread, NULL, fake_run, f), 0);
}

static void fake_stop(fake_t *f) {
  zmq_ctx_shutdown(f->ctx); /* the thread's recv returns ETERM */
  pthread_join(f->thread, NULL);
  zmq_close(f->router);
  zmq_ctx_term(f->ctx);
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct seen {
  spn_client_t *c;
  int events, silent;
  int64_t unanswered_ms;
} seen_t;

static int stop_when_silent(void *user, const spn_client_status_t *ev) {
  seen_t *s = user;
  s->events++;
  assert_int_equal(ev->id, 7);
  assert_int_equal(ev->state, SPN_QSTATE_RUNNING);
  int64_t ms = spn_client_unanswered_ms(s->c);
  if (ms > 0) {
    s->silent++;
    s->unanswered_ms = ms;
    return 1;
  }
  return 0;
}

static spn_client_t *client_for(const fake_t *f) {
  spn_client_options_t o = SPN_CLIENT_OPTIONS_INIT;
  o.timeout_ms = 50;
  spn_client_t *c = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_client_new(f->endpoint, &o, &c, &err), SPN_OK);
  return c;
}

static void test_callback_hears_the_silence(void **state) {
  (void)state;
  fake_t f;
  fake_start(&f);
  spn_client_t *c = client_for(&f);
  seen_t s = {.c = c};
  spn_client_status_t final;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_client_watch(c, 7, stop_when_silent, &s, &final, &err), SPN_OK);
  assert_int_equal(s.events, 2); /* the answer, then the same status while silent */
  assert_int_equal(s.silent, 1);
  assert_true(s.unanswered_ms >= 50);
  assert_int_equal(final.state, SPN_QSTATE_RUNNING);
  assert_int_equal(final.done, 3);
  spn_client_free(&c);
  fake_stop(&f);
}

static void test_no_callback_gives_up(void **state) {
  (void)state;
  fake_t f;
  fake_start(&f);
  spn_client_t *c = client_for(&f);
  spn_client_status_t final;
  memset(&final, 0, sizeof final);
  spn_error_t err = SPN_ERROR_INIT;
  double t0 = mono();
  assert_int_equal(spn_client_watch(c, 7, NULL, NULL, &final, &err), SPN_ETIMEDOUT);
  double took = mono() - t0;
  fprintf(stderr, "gave up after %.2f s: %s\n", took, err.msg);
  assert_true(took >= 60 * 0.05 && took < 20); /* 60 timeouts of 50 ms, and not for ever */
  assert_non_null(strstr(err.msg, "job 7: no answer from the gateway for 3 s; the job was running"));
  assert_int_equal(final.state, SPN_QSTATE_RUNNING);
  assert_int_equal(final.id, 7);
  assert_int_equal(f.answered, 1);
  spn_client_free(&c);
  fake_stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_callback_hears_the_silence),
      cmocka_unit_test(test_no_callback_gives_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
