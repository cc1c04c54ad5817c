/* redis-fixture.h — a private redis-server for the queue tests (test-queue.c,
 * test-queue-segments.c): started once per cmocka group on a free loopback
 * port with appendonly on (redis_up / redis_down as the group's setup and
 * teardown; srv->pid stays 0, and the group's cases fail their setup, when
 * redis-server cannot start), plus a connection of the test's own to read
 * keys the way KEDA or an operator does. Each case takes its own key prefix
 * (srv->n). Static functions, using cmocka's asserts: include it after
 * <cmocka.h>, in one file per test program. */
#ifndef SPINDLE_TEST_REDIS_FIXTURE_H
#define SPINDLE_TEST_REDIS_FIXTURE_H

#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "jobs-internal.h"

/* The redis-server of the Redis group. */
typedef struct server {
  pid_t pid;
  char dir[64];
  char url[64];
  int n; /* tests so far: each gets its own key prefix */
} server_t;

/* A loopback port that binds now, drawn at random below the kernel's
 * ephemeral range (as tests/common/freeport.py, which says why: a port-0
 * port can be taken by another test's connection before redis-server binds
 * it); the kernel's choice when none there is free. */
static int free_port(void) {
  int low = 32768;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &low) != 1)
      low = 32768;
    fclose(f);
  }
  int hi = low < 32768 ? low : 32768, lo = hi - 12000 > 1024 ? hi - 12000 : 1024;
  unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
  for (int attempt = 0; attempt <= 200; attempt++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (attempt < 200 && hi > lo)
      a.sin_port = htons((uint16_t)(lo + (int)(rand_r(&seed) % (unsigned)(hi - lo))));
    socklen_t len = sizeof a;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    if (fd >= 0)
      close(fd);
    if (ok)
      return ntohs(a.sin_port);
  }
  return -1;
}

static int redis_up(void **state) {
  server_t *srv = calloc(1, sizeof *srv);
  *state = srv;
  snprintf(srv->dir, sizeof srv->dir, "/tmp/spn-redis-XXXXXX");
  int port = free_port();
  if (!mkdtemp(srv->dir) || port < 0)
    return 0;
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", 1);
    dup2(null, 1);
    execlp("redis-server", "redis-server", "--port", ports, "--bind", "127.0.0.1", "--dir", srv->dir,
           "--appendonly", "yes", "--save", "", (char *)NULL);
    _exit(127);
  }
  snprintf(srv->url, sizeof srv->url, "redis://127.0.0.1:%d", port);
  for (int i = 0; i < 100; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      fprintf(stderr, "redis-server did not start (is it installed?): the Redis cases are skipped\n");
      return 0;
    }
    spn_queue_config_t c = {.backend = "redis", .url = srv->url, .prefix = "probe:"};
    spn_queue_t q;
    if (spn_queue_open(&c, &q, NULL) == SPN_OK) {
      spn_queue_free(&q);
      srv->pid = pid;
      return 0;
    }
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return 0;
}

static int redis_down(void **state) {
  server_t *srv = *state;
  if (srv->pid) {
    kill(srv->pid, SIGTERM);
    waitpid(srv->pid, NULL, 0);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", srv->dir);
  if (srv->dir[0] && system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", srv->dir);
  free(srv);
  return 0;
}

/* A command on the test's own connection to the Redis of the group, the way
 * KEDA or an operator sees the keys (formatted as redisCommand's). */
static redisReply *redis_cmd(const server_t *srv, const char *fmt, ...) {
  int port = 0;
  assert_int_equal(sscanf(srv->url, "redis://127.0.0.1:%d", &port), 1);
  redisContext *c = redisConnect("127.0.0.1", port);
  assert_non_null(c);
  assert_int_equal(c->err, 0);
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  assert_non_null(r);
  redisFree(c);
  return r;
}

/* The lag of group "spindle" on P waiting as XINFO GROUPS reports it (what
 * KEDA's lagCount reads): -1 when Redis cannot say (unknown lag), -2 when
 * the stream or the group is missing. */
static long long waiting_lag(const server_t *srv, const char *prefix) {
  redisReply *r = redis_cmd(srv, "XINFO GROUPS %swaiting", prefix);
  long long lag = -2;
  for (size_t g = 0; r->type == REDIS_REPLY_ARRAY && g < r->elements; g++) {
    const redisReply *e = r->element[g];
    bool ours = false;
    long long v = -1;
    for (size_t i = 0; e->type == REDIS_REPLY_ARRAY && i + 1 < e->elements; i += 2) {
      const redisReply *k = e->element[i], *x = e->element[i + 1];
      if (!strcmp(k->str, "name"))
        ours = x->type == REDIS_REPLY_STRING && !strcmp(x->str, "spindle");
      else if (!strcmp(k->str, "lag"))
        v = x->type == REDIS_REPLY_INTEGER ? x->integer : -1;
    }
    if (ours)
      lag = v;
  }
  freeReplyObject(r);
  return lag;
}

/* Whether the waiting mirror KEDA scales on holds: the lag of group
 * "spindle" on P waiting equals q's queued jobs. Says which when not (each
 * Redis case's teardown checks it). */
static bool waiting_mirror_ok(const server_t *srv, const char *prefix, spn_queue_t *q) {
  int64_t cnt[SPN_QSTATE_COUNT];
  assert_int_equal(q->ops->counts(q->impl, cnt, NULL), SPN_OK);
  long long lag = waiting_lag(srv, prefix);
  if (lag == cnt[SPN_QSTATE_QUEUED])
    return true;
  fprintf(stderr, "%swaiting: lag %lld, but %lld job(s) queued\n", prefix, lag, (long long)cnt[SPN_QSTATE_QUEUED]);
  return false;
}

#endif
