/* cost.c — `cost`, a stage that burns a configured amount of CPU per item.
 *
 * For tests and benchmarks of scheduling, batching and back-pressure: it
 * forwards each message after `us` microseconds of busy work (timed) or
 * `iterations` rounds of a fixed arithmetic loop (untimed, so the same work
 * on any machine). It spins rather than sleeps: a sleeping stage would not
 * show what an executor does with a busy one. With `sleep = true` it sleeps
 * the `us` instead: a slow stage for tests of job mechanics (leases, kills,
 * progress) that leaves the CPU to whatever else the machine runs. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "spindle/plugin.h"


typedef struct cost_config {
  int64_t us;
  int64_t iterations;
  bool sleep;
} cost_config_t;

static const spn_config_field_t cost_schema[] = {
    {.key = "us", .type = SPN_CONFIG_INT, .offset = offsetof(cost_config_t, us),
     .doc = "busy CPU time per message, in microseconds", .def_int = 100, .min = 0, .max = 10e6},
    {.key = "iterations", .type = SPN_CONFIG_INT, .offset = offsetof(cost_config_t, iterations),
     .doc = "if > 0: rounds of a fixed arithmetic loop per message instead of `us`", .def_int = 0, .min = 0,
     .max = 1e12},
    {.key = "sleep", .type = SPN_CONFIG_BOOL, .offset = offsetof(cost_config_t, sleep),
     .doc = "sleep the `us` instead of spinning (a slow stage that leaves the CPU idle)", .def_int = 0},
    {0},
};

static const spn_port_t cost_inputs[] = {{.name = "in", .type = "any"}};
static const spn_port_t cost_outputs[] = {{.name = "out", .type = "any"}};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A dependency chain the compiler cannot fold away (volatile sink). */
static void burn_iterations(int64_t n) {
  volatile uint64_t sink;
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (int64_t i = 0; i < n; i++)
    x = x * 6364136223846793005u + 1442695040888963407u;
  sink = x;
  (void)sink;
}

static int32_t cost_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  cost_config_t *c = malloc(sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "cost: out of memory");
  *c = *(const cost_config_t *)config;
  *state = c;
  return SPN_OK;
}

static void cost_destroy(spn_stage_t *stage, void *state) { free(state); }

static int32_t cost_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                            spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const cost_config_t *c = state;
  for (size_t i = 0; i < n; i++) {
    if (c->iterations > 0) {
      burn_iterations(c->iterations);
    } else if (c->us > 0 && c->sleep) {
      struct timespec ts = {.tv_sec = (time_t)(c->us / 1000000), .tv_nsec = (long)(c->us % 1000000) * 1000};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    } else if (c->us > 0) {
      double end = now_us() + (double)c->us;
      while (now_us() < end)
        ;
    }
    int32_t rc = host->emit(stage, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t cost_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "cost",
      .doc = "forwards messages after a configured amount of busy CPU work",
      .schema = cost_schema,
      .config_size = sizeof(cost_config_t),
      .inputs = cost_inputs,
      .n_inputs = 1,
      .outputs = cost_outputs,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = cost_create,
      .process = cost_process,
      .destroy = cost_destroy,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(cost, .version = "1.0", .license = "Apache-2.0", .init = cost_init)
