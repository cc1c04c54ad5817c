/* executor.c — threads that run actors.
 *
 * An executor is one thread with a command queue (mutex + list, signalled
 * through an eventfd) and the actors bound to it. Its loop: drain commands,
 * step every actor (receive, re-order, batch, process, generate), and when no
 * actor did anything, sleep in zmq_poll on the actors' mailboxes, the eventfd
 * and the earliest batch deadline. Actors never block the thread: an actor
 * without output credit is skipped until the consumer hands credit back and
 * wakes this executor.
 *
 * Wake-ups coalesce: `signalled` is set by the first waker and cleared by the
 * executor before it looks at its actors, so a wake that races with the scan
 * is never lost and a storm of wakes costs one eventfd write. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "runtime-internal.h"

uint64_t spn__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void spn__barrier_init(spn__barrier_t *b, uint32_t n) {
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  b->remaining = n;
  b->status = SPN_OK;
  spn_error_clear(&b->err);
}

void spn__barrier_done(spn__barrier_t *b, int32_t status, const spn_error_t *err) {
  pthread_mutex_lock(&b->mu);
  if (status != SPN_OK && b->status == SPN_OK) {
    b->status = status;
    if (err)
      b->err = *err;
  }
  if (--b->remaining == 0)
    pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

int32_t spn__barrier_wait(spn__barrier_t *b, spn_error_t *err) {
  pthread_mutex_lock(&b->mu);
  while (b->remaining)
    pthread_cond_wait(&b->cv, &b->mu);
  int32_t st = b->status;
  if (st != SPN_OK && err)
    *err = b->err;
  pthread_mutex_unlock(&b->mu);
  return st;
}

void spn__barrier_destroy(spn__barrier_t *b) {
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
}

void spn__executor_wake(spn__executor_t *ex) {
  if (!atomic_exchange(&ex->signalled, true)) {
    uint64_t one = 1;
    ssize_t w;
    do
      w = write(ex->efd, &one, sizeof one);
    while (w < 0 && errno == EINTR);
  }
}

void spn__executor_post(spn__executor_t *ex, spn__cmd_t *cmd) {
  cmd->next = NULL;
  pthread_mutex_lock(&ex->mu);
  if (ex->tail)
    ex->tail->next = cmd;
  else
    ex->head = cmd;
  ex->tail = cmd;
  pthread_mutex_unlock(&ex->mu);
  spn__executor_wake(ex);
}

static void add_actor(spn__executor_t *ex, spn_stage_t *a) {
  if (ex->n_actors == ex->cap_actors) {
    uint32_t cap = ex->cap_actors ? ex->cap_actors * 2 : 8;
    spn_stage_t **v = realloc(ex->actors, cap * sizeof *v);
    SPN_ASSERT(v);
    ex->actors = v;
    ex->cap_actors = cap;
  }
  ex->actors[ex->n_actors++] = a;
}

static void remove_actor(spn__executor_t *ex, spn_stage_t *a) {
  for (uint32_t i = 0; i < ex->n_actors; i++)
    if (ex->actors[i] == a) {
      memmove(&ex->actors[i], &ex->actors[i + 1], (ex->n_actors - i - 1) * sizeof *ex->actors);
      ex->n_actors--;
      return;
    }
}

/* Runs a command; returns false for STOP. */
static bool run_cmd(spn__executor_t *ex, spn__cmd_t *c) {
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc;
  switch (c->type) {
  case SPN__CMD_CREATE:
    rc = spn__actor_create(c->actor, &err);
    if (rc == SPN_OK)
      add_actor(ex, c->actor);
    spn__barrier_done(c->barrier, rc, &err);
    break;
  case SPN__CMD_CONNECT:
    rc = spn__actor_connect(c->actor, &err);
    spn__barrier_done(c->barrier, rc, &err);
    break;
  case SPN__CMD_START_JOB:
    spn__actor_start_job(c->actor, c->job, c->generate);
    break;
  case SPN__CMD_ABORT_JOB:
    spn__actor_abort_job(c->actor, c->job);
    break;
  case SPN__CMD_DESTROY:
    remove_actor(ex, c->actor);
    spn__actor_destroy(c->actor);
    spn__barrier_done(c->barrier, SPN_OK, NULL);
    break;
  case SPN__CMD_STOP:
    return false;
  }
  spn__job_unref(&c->job);
  return true;
}

/* The thread's name as `top -H`, gdb and profilers show it (15 bytes):
 * the name's first word (the device, or cpu-pool-N) and, for a stage
 * instance's thread, its last ("sr#0"): "cuda:0 sr#0". */
static void name_thread(const spn__executor_t *ex) {
  char t[16];
  size_t first = strcspn(ex->name, " ");
  const char *last = strrchr(ex->name, ' ');
  if (ex->device && last && last + 1 > ex->name + first && strchr(last, '#'))
    snprintf(t, sizeof t, "%.*s %s", (int)(first < 8 ? first : 8), ex->name, last + 1);
  else
    snprintf(t, sizeof t, "%.*s", (int)first, ex->name);
  (void)pthread_setname_np(pthread_self(), t);
}

static void *executor_main(void *arg) {
  spn__executor_t *ex = arg;
  name_thread(ex);
  /* A device executor's stream belongs to its thread (the device's, or one
   * stage instance's). */
  if (ex->device) {
    spn_error_t err = SPN_ERROR_INIT;
    if (spn_stream_new(ex->device, &ex->stream, &err) != SPN_OK)
      spn__log(ex->rt->log, SPN_LOG_ERROR, 0, NULL, ex->name, "cannot create the device stream: %s", err.msg);
  }
  zmq_pollitem_t *items = NULL;
  uint32_t cap_items = 0;
  bool running = true;
  while (running) {
    /* Clear the wake flag first: anything signalled from here on rings again. */
    atomic_store(&ex->signalled, false);
    pthread_mutex_lock(&ex->mu);
    spn__cmd_t *c = ex->head;
    ex->head = ex->tail = NULL;
    pthread_mutex_unlock(&ex->mu);
    while (c) {
      spn__cmd_t *next = c->next;
      if (!run_cmd(ex, c))
        running = false;
      free(c);
      c = next;
    }
    if (!running)
      break;
    uint64_t now = spn__now_ns(), deadline = UINT64_MAX;
    bool did = false;
    for (uint32_t i = 0; i < ex->n_actors; i++)
      did |= spn__actor_step(ex->actors[i], now, &deadline);
    if (did)
      continue;
    if (cap_items < ex->n_actors + 1) {
      cap_items = ex->n_actors + 8;
      zmq_pollitem_t *v = realloc(items, cap_items * sizeof *v);
      SPN_ASSERT(v);
      items = v;
    }
    uint32_t n = 0;
    items[n++] = (zmq_pollitem_t){.socket = NULL, .fd = ex->efd, .events = ZMQ_POLLIN};
    for (uint32_t i = 0; i < ex->n_actors; i++)
      if (ex->actors[i]->sock)
        items[n++] = (zmq_pollitem_t){.socket = ex->actors[i]->sock, .events = ZMQ_POLLIN};
    /* A cap on the sleep keeps a missed wake-up (a bug) from becoming a hang. */
    long timeout_ms = 100;
    if (deadline != UINT64_MAX) {
      uint64_t t = spn__now_ns();
      timeout_ms = deadline <= t ? 0 : (long)((deadline - t + 999999) / 1000000);
      if (timeout_ms > 100)
        timeout_ms = 100;
    }
    if (zmq_poll(items, (int)n, timeout_ms) > 0 && (items[0].revents & ZMQ_POLLIN)) {
      uint64_t v;
      ssize_t r = read(ex->efd, &v, sizeof v);
      (void)r;
    }
  }
  free(items);
  spn_stream_free(&ex->stream);
  return NULL;
}

int32_t spn__executor_start(spn_runtime_t *rt, spn__executor_t *ex, uint32_t index, spn_device_t *dev,
                            const char *name, spn_error_t *err) {
  memset(ex, 0, sizeof *ex);
  ex->rt = rt;
  ex->index = index;
  ex->device = dev;
  if (name)
    snprintf(ex->name, sizeof ex->name, "%.63s", name);
  else if (dev)
    snprintf(ex->name, sizeof ex->name, "%.63s", dev->name);
  else
    snprintf(ex->name, sizeof ex->name, "cpu-pool-%u", index);
  atomic_init(&ex->signalled, false);
  ex->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ex->efd < 0)
    return spn_error_set(err, SPN_EIO, "executor %s: eventfd: %s", ex->name, strerror(errno));
  pthread_mutex_init(&ex->mu, NULL);
  int e = pthread_create(&ex->thread, NULL, executor_main, ex);
  if (e) {
    pthread_mutex_destroy(&ex->mu);
    close(ex->efd);
    ex->efd = -1;
    return spn_error_set(err, SPN_EINTERNAL, "executor %s: cannot start thread: %s", ex->name, strerror(e));
  }
  return SPN_OK;
}

void spn__executor_stop(spn__executor_t *ex) {
  if (ex->efd < 0)
    return;
  spn__cmd_t *c = calloc(1, sizeof *c);
  SPN_ASSERT(c);
  c->type = SPN__CMD_STOP;
  spn__executor_post(ex, c);
  pthread_join(ex->thread, NULL);
  /* Commands posted after STOP (none in a correct shutdown) are dropped. */
  for (spn__cmd_t *n = ex->head; n;) {
    spn__cmd_t *next = n->next;
    spn__job_unref(&n->job);
    free(n);
    n = next;
  }
  pthread_mutex_destroy(&ex->mu);
  close(ex->efd);
  ex->efd = -1;
  free(ex->actors);
  ex->actors = NULL;
}
