/* cli-jobs.c — the job service from the command line: `spindle serve`,
 * `spindle worker`, and the client commands `submit`, `status`, `watch`,
 * `cancel`, `jobs`, plus `keygen` for CURVE key pairs.
 *
 * Client exit codes follow the job's outcome: 0 succeeded, 1 failed, 2 usage,
 * 3 cancelled, 4 dead (retries exhausted), 5 the gateway refused the request
 * or could not be reached.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "cli.h"
#include "jobs-internal.h"
#include "spindle/client.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_CANCELLED = 3, EXIT_DEAD = 4, EXIT_GATEWAY = 5 };

#define DEFAULT_GATEWAY "tcp://127.0.0.1:7700"

static int usage_err(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "spindle %s: ", cmd);
  fprintf(stderr, fmt, arg ? arg : "");
  fprintf(stderr, "\n'spindle %s --help' for options.\n", cmd);
  return EXIT_USAGE;
}

static bool parse_u32(const char *s, uint32_t *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || end == s || v > UINT32_MAX || s[0] == '-')
    return false;
  *out = (uint32_t)v;
  return true;
}

/* Read "key=VALUE" from a key file written by `spindle keygen`. */
static int read_key(const char *path, const char *key, char out[41]) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "spindle: key file %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[256];
  size_t kl = strlen(key);
  int found = -1;
  while (fgets(line, sizeof line, f)) {
    /* "key=VALUE", or for public keys a bare 40-character line (.pub files) */
    const char *val = !strncmp(line, key, kl) && line[kl] == '=' ? line + kl + 1
                      : !strcmp(key, "public") && line[0] != '#' && strcspn(line, "\r\n") == 40 ? line
                                                                                               : NULL;
    if (val && strlen(val) >= 40) {
      memcpy(out, val, 40);
      out[40] = '\0';
      found = 0;
      break;
    }
  }
  fclose(f);
  if (found < 0)
    fprintf(stderr, "spindle: key file %s: no \"%s=\" line with a 40-character key\n", path, key);
  return found;
}

/* ---- keygen ---- */

static int cmd_keygen(int argc, char **argv) {
  static const char usage[] = "usage: spindle keygen NAME\n  writes NAME.key (public and secret) and NAME.pub\n";
  static const struct option opts[] = {SPN_CLI_HELP_OPT, {0}};
  const char *name = NULL;
  spn_cli_getopt_t g = {.cmd = "keygen"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      fputs(usage, stdout);
      return EXIT_OK;
    }
    if (c != SPN_CLI_ARG || name) {
      if (c == SPN_CLI_ARG)
        fputs(usage, stderr);
      return EXIT_USAGE;
    }
    name = g.arg;
  }
  if (!name) {
    fputs(usage, stderr);
    return EXIT_USAGE;
  }
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    fprintf(stderr, "spindle keygen: %s\n", zmq_strerror(zmq_errno()));
    return EXIT_FAILED;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s.key", name);
  mode_t old = umask(077);
  FILE *f = fopen(path, "w");
  umask(old);
  if (!f || fprintf(f, "# Spindle CURVE key pair; keep secret\npublic=%s\nsecret=%s\n", pub, sec) < 0 ||
      fclose(f) != 0) {
    fprintf(stderr, "spindle keygen: %s: %s\n", path, strerror(errno));
    return EXIT_FAILED;
  }
  snprintf(path, sizeof path, "%s.pub", name);
  f = fopen(path, "w");
  if (!f || fprintf(f, "%s\n", pub) < 0 || fclose(f) != 0) {
    fprintf(stderr, "spindle keygen: %s: %s\n", path, strerror(errno));
    return EXIT_FAILED;
  }
  printf("%s\n", pub);
  return EXIT_OK;
}

/* ---- runners: real pipelines on a runtime, then the built-in test ones ---- */

typedef struct runners {
  spn_runtime_t *rt;
  spn_job_runner_t test, pipes;
  bool have_test, have_pipes;
} runners_t;

/* The test runner always; with pipeline defs also a runtime (plugins from
 * --plugin-path, $SPINDLE_PLUGIN_PATH, the build tree when run uninstalled)
 * and every pipeline loaded, models preloaded. Returns the runner to use or
 * NULL after printing why. */
static const spn_job_runner_t *runners_start(runners_t *r, const char *cmd, const spn_test_runner_config_t *tc,
                                             const spn_pipeline_def_t *defs, size_t n_defs,
                                             const char *const *plugin_paths, size_t n_plugin_paths,
                                             const char *devices, const char *log_level) {
  memset(r, 0, sizeof *r);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_test_runner_new(tc, &r->test, &err) < 0) {
    fprintf(stderr, "spindle %s: %s\n", cmd, err.msg);
    return NULL;
  }
  r->have_test = true;
  if (!n_defs)
    return &r->test;
  /* Reuse the pipeline commands' option handling (build-tree stages). */
  char **av = calloc(2 * n_plugin_paths + 5, sizeof *av);
  if (!av)
    return NULL;
  int ac = 0;
  av[ac++] = (char *)cmd;
  for (size_t i = 0; i < n_plugin_paths; i++) {
    av[ac++] = (char *)"--plugin-path";
    av[ac++] = (char *)plugin_paths[i];
  }
  if (devices) {
    av[ac++] = (char *)"--devices";
    av[ac++] = (char *)devices;
  }
  if (log_level) {
    av[ac++] = (char *)"--log-level";
    av[ac++] = (char *)log_level;
  }
  static const char *const allowed[] = {"plugin-path", "devices", "log-level", NULL};
  spn_cli_opts_t o;
  int rc = spn_cli_parse(ac, av, allowed, &o);
  free(av);
  if (rc == 0)
    rc = spn_cli_runtime(&o, true, &r->rt);
  spn_cli_opts_free(&o);
  if (rc != 0)
    return NULL;
  if (spn_pipeline_runner_new(r->rt, defs, n_defs, &r->test, &r->pipes, &err) < 0) {
    fprintf(stderr, "spindle %s: %s\n", cmd, err.msg);
    return NULL;
  }
  r->have_pipes = true;
  return &r->pipes;
}

/* How long a stopped run may stay inside a stage's call before it is
 * abandoned (spn__pipeline_runner_set_cancel_grace). */
static void runners_cancel_grace(runners_t *r, uint32_t seconds) {
  if (r->have_pipes)
    spn__pipeline_runner_set_cancel_grace(&r->pipes, seconds);
}

static void runners_stop(runners_t *r) {
  /* A run was abandoned inside a stage's call: that thread cannot be
   * joined, so the runtime is left to the process's exit. */
  bool wedged = r->have_pipes && spn__pipeline_runner_wedged(&r->pipes);
  if (r->have_pipes)
    spn_pipeline_runner_free(&r->pipes);
  if (!wedged)
    spn_runtime_free(&r->rt);
  if (r->have_test)
    spn_test_runner_free(&r->test);
  memset(r, 0, sizeof *r);
}

/* ---- serve ---- */

static const char serve_help[] =
    "usage: spindle serve [--config FILE] [options]\n"
    "Run the job gateway with in-process workers. Flags override the config file.\n"
    "  --config FILE        server TOML (configs/server.toml)\n"
    "  --bind EP            ZeroMQ endpoint, e.g. tcp://127.0.0.1:7700 (port * = any)\n"
    "  --db PATH            queue database (SQLite)\n"
    "  --queue URL          share a Redis queue instead: redis://HOST[:PORT][/DB] or unix:///PATH\n"
    "  --queue-auth-file F  Redis AUTH: \"PASSWORD\" or \"USER PASSWORD\" on the first line\n"
    "  --queue-wait S       Redis not answering at start: wait up to S s, not ready meanwhile\n"
    "                       (default 300; 0: stop at once)\n"
    "  --drain-grace-s N    SIGTERM: running jobs get N s to finish (0: stop at once)\n"
    "  --workers N          in-process worker threads (0: remote workers only)\n"
    "  --root DIR           allow job inputs and outputs under DIR (repeatable)\n"
    "  --input-root DIR / --output-root DIR\n"
    "  --lease-ms N --heartbeat-ms N --max-attempts N --backoff-ms N --backoff-max-ms N\n"
    "  --job-timeout S      a job's attempt may run S s unless the job says (0: no limit)\n"
    "  --keep-ended S       delete a job S s after it ended (default 604800, 7 days; 0: keep all)\n"
    "  --cancel-grace S     a cancelled or timed-out attempt still inside a stage's call after S s\n"
    "                       is abandoned and the in-process workers stop (default 120; 0: wait)\n"
    "  --max-msg BYTES      largest message accepted (ZMQ_MAXMSGSIZE)\n"
    "  --curve-keyfile F    enable CURVE with this server key pair (spindle keygen)\n"
    "  --curve-clients DIR  allowed client public keys, one file each\n"
    "  --curve-workers DIR  keys allowed to act as workers (then client keys cannot)\n"
    "  --pipeline NAME      refuse to start unless NAME can run (repeatable)\n"
    "  --plugin-path DIR    search DIR for stage plugins (repeatable)\n"
    "  --devices SPEC       runtime devices: auto, cpu, cpu:N, cuda, cuda:0,1\n"
    "  --log-level L        the pipelines' log: debug, info (default), warn or error; debug\n"
    "                       shows what the runtime and the stages log as they go\n"
    "  --http HOST:PORT     serve /healthz, /readyz and /metrics (Prometheus)\n"
    "  --chunk-bytes N --chunk-delay-ms N --exec-log FILE   test runner settings\n";

enum {
  O_CONFIG = 256, O_PLUGIN_PATH, O_DEVICES, O_BIND, O_DB, O_QUEUE, O_QUEUE_AUTH, O_QUEUE_PREFIX, O_DRAIN_GRACE,
  O_EXEC_LOG, O_CURVE_KEYFILE, O_CURVE_CLIENTS, O_CURVE_WORKERS, O_HTTP, O_WORKERS, O_LEASE_MS, O_HEARTBEAT_MS,
  O_MAX_ATTEMPTS, O_BACKOFF_MS, O_BACKOFF_MAX_MS, O_MAX_MSG, O_CHUNK_BYTES, O_CHUNK_DELAY_MS, O_ROOT,
  O_INPUT_ROOT, O_OUTPUT_ROOT, O_PIPELINE, O_CONNECT, O_NAME, O_SLOTS, O_SERVER_KEY_FILE, O_TIMEOUT_MS, O_GATEWAY_WAIT,
  O_WAIT, O_INPUT, O_OUTPUT, O_PARAM, O_PRIORITY, O_DEADLINE, O_SEGMENTS, O_SEGMENT_SECONDS,
  O_IDEMPOTENCY_KEY, O_JSON, O_STATE, O_LIMIT, O_QUEUE_WAIT, O_JOB_TIMEOUT, O_CANCEL_GRACE,
  O_KEEP_ENDED, O_LOG_LEVEL,
};
#define REQ(name, id) {name, required_argument, NULL, id}

static const struct option serve_opts[] = {
    REQ("config", O_CONFIG), REQ("plugin-path", O_PLUGIN_PATH), REQ("devices", O_DEVICES), REQ("bind", O_BIND),
    REQ("db", O_DB), REQ("queue", O_QUEUE), REQ("queue-auth-file", O_QUEUE_AUTH),
    REQ("queue-prefix", O_QUEUE_PREFIX), REQ("queue-wait", O_QUEUE_WAIT), REQ("drain-grace-s", O_DRAIN_GRACE),
    REQ("exec-log", O_EXEC_LOG), REQ("job-timeout", O_JOB_TIMEOUT), REQ("cancel-grace", O_CANCEL_GRACE),
    REQ("keep-ended", O_KEEP_ENDED),
    REQ("curve-keyfile", O_CURVE_KEYFILE), REQ("curve-clients", O_CURVE_CLIENTS),
    REQ("curve-workers", O_CURVE_WORKERS), REQ("http", O_HTTP), REQ("workers", O_WORKERS),
    REQ("lease-ms", O_LEASE_MS), REQ("heartbeat-ms", O_HEARTBEAT_MS), REQ("max-attempts", O_MAX_ATTEMPTS),
    REQ("backoff-ms", O_BACKOFF_MS), REQ("backoff-max-ms", O_BACKOFF_MAX_MS), REQ("max-msg", O_MAX_MSG),
    REQ("chunk-bytes", O_CHUNK_BYTES), REQ("chunk-delay-ms", O_CHUNK_DELAY_MS), REQ("root", O_ROOT),
    REQ("input-root", O_INPUT_ROOT), REQ("output-root", O_OUTPUT_ROOT), REQ("pipeline", O_PIPELINE),
    REQ("log-level", O_LOG_LEVEL), SPN_CLI_HELP_OPT, {0}};

/* One parsed option of serve: flags are applied after --config is loaded. */
typedef struct given {
  int c;
  const char *v, *name;
} given_t;

static int cmd_serve(int argc, char **argv) {
  spn_server_config_t cfg;
  spn_server_config_defaults(&cfg);
  spn_error_t err = SPN_ERROR_INIT;
  int rc = EXIT_FAILED;
  const char *config = NULL, *log_level = NULL;
  const char **plugin_paths = calloc((size_t)argc, sizeof *plugin_paths);
  given_t *given = calloc((size_t)argc, sizeof *given);
  size_t n_plugin_paths = 0, n_given = 0;
  runners_t runners = {0};
  if (!plugin_paths || !given)
    goto out;
  spn_cli_getopt_t g = {.cmd = "serve"};
  for (int c; (c = spn_cli_next(&g, argc, argv, serve_opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      fputs(serve_help, stdout);
      rc = EXIT_OK;
      goto out;
    }
    if (c == SPN_CLI_BAD) {
      rc = EXIT_USAGE;
      goto out;
    }
    if (c == SPN_CLI_ARG) {
      rc = usage_err("serve", "unexpected argument \"%s\"", g.arg);
      goto out;
    }
    if (c == O_CONFIG)
      config = g.arg;
    given[n_given++] = (given_t){c, g.arg, g.name};
  }
  if (config && spn_server_config_load(&cfg, config, &err) < 0) {
    fprintf(stderr, "spindle serve: %s\n", err.msg);
    goto out;
  }
  for (size_t i = 0; i < n_given; i++) {
    const char *v = given[i].v;
    uint32_t *u = NULL;
    char **str = NULL;
    spn_roots_t *roots[2] = {NULL, NULL};
    switch (given[i].c) {
    case O_CONFIG: break;
    case O_LOG_LEVEL: {
      int32_t level = 0;
      if (spn_cli_log_level("serve", v, &level) != 0) {
        rc = EXIT_USAGE;
        goto out;
      }
      log_level = v;
      break;
    }
    case O_PLUGIN_PATH: plugin_paths[n_plugin_paths++] = v; break;
    case O_DEVICES: str = &cfg.devices; break;
    case O_BIND: str = &cfg.bind; break;
    case O_DB: str = &cfg.db_path; break;
    case O_QUEUE: str = &cfg.queue_url; break;
    case O_QUEUE_AUTH: str = &cfg.queue_auth_file; break;
    case O_QUEUE_PREFIX: str = &cfg.queue_prefix; break;
    case O_QUEUE_WAIT: u = &cfg.queue_wait_s; break;
    case O_JOB_TIMEOUT: u = &cfg.job_timeout_s; break;
    case O_CANCEL_GRACE: u = &cfg.cancel_grace_s; break;
    case O_KEEP_ENDED: u = &cfg.keep_ended_s; break;
    case O_DRAIN_GRACE: u = &cfg.drain_grace_s; break;
    case O_EXEC_LOG: str = &cfg.exec_log; break;
    case O_CURVE_KEYFILE: str = &cfg.curve_key_file; break;
    case O_CURVE_CLIENTS: str = &cfg.curve_clients_dir; break;
    case O_CURVE_WORKERS: str = &cfg.curve_workers_dir; break;
    case O_HTTP: str = &cfg.http; break;
    case O_WORKERS: u = &cfg.workers; break;
    case O_LEASE_MS: u = &cfg.lease_ms; break;
    case O_HEARTBEAT_MS: u = &cfg.heartbeat_ms; break;
    case O_MAX_ATTEMPTS: u = &cfg.max_attempts; break;
    case O_BACKOFF_MS: u = &cfg.backoff_base_ms; break;
    case O_BACKOFF_MAX_MS: u = &cfg.backoff_max_ms; break;
    case O_MAX_MSG: u = &cfg.max_msg_size; break;
    case O_CHUNK_BYTES: u = &cfg.chunk_bytes; break;
    case O_CHUNK_DELAY_MS: u = &cfg.chunk_delay_ms; break;
    case O_ROOT: roots[0] = &cfg.input_roots; roots[1] = &cfg.output_roots; break;
    case O_INPUT_ROOT: roots[0] = &cfg.input_roots; break;
    case O_OUTPUT_ROOT: roots[1] = &cfg.output_roots; break;
    case O_PIPELINE: {
      char **nv = realloc(cfg.pipelines, (cfg.n_pipelines + 1) * sizeof *nv);
      if (!nv || !(nv[cfg.n_pipelines] = strdup(v))) {
        if (nv)
          cfg.pipelines = nv;
        goto out;
      }
      cfg.pipelines = nv;
      cfg.n_pipelines++;
      break;
    }
    default: goto out;
    }
    if (str) {
      free(*str);
      if (!(*str = strdup(v)))
        goto out;
    }
    if (u && !parse_u32(v, u)) {
      rc = usage_err("serve", "--%s needs a non-negative integer", given[i].name);
      goto out;
    }
    /* the range a config file's key has holds for its flag too */
    if (u && spn_server_config_check_field(&cfg, u, given[i].name, &err) < 0) {
      rc = usage_err("serve", "%s", err.msg);
      goto out;
    }
    for (int k = 0; k < 2; k++)
      if (roots[k] && spn__roots_add(roots[k], v, &err) < 0) {
        fprintf(stderr, "spindle serve: %s\n", err.msg);
        goto out;
      }
  }
  if (!cfg.bind && !(cfg.bind = strdup(DEFAULT_GATEWAY)))
    goto out;
  /* A queue URL implies the Redis backend. */
  if (cfg.queue_url && !cfg.queue_backend && !(cfg.queue_backend = strdup("redis")))
    goto out;
  if (!cfg.db_path && !(cfg.db_path = strdup("spindle-jobs.db")))
    goto out;
  if (cfg.curve_key_file) {
    char sec[41];
    if (read_key(cfg.curve_key_file, "secret", sec) < 0)
      goto out;
    free(cfg.curve_secret);
    if (!(cfg.curve_secret = strdup(sec)))
      goto out;
  }
  if (cfg.input_roots.n == 0 || cfg.output_roots.n == 0)
    fprintf(stderr, "spindle serve: warning: no input or output roots configured; every job with "
                    "files will be refused\n");
  cfg.ready_fd = STDOUT_FILENO;
  spn_test_runner_config_t rc_cfg = {.chunk_bytes = cfg.chunk_bytes,
                                     .chunk_delay_ms = cfg.chunk_delay_ms,
                                     .exec_log = cfg.exec_log};
  /* Every pipeline is loaded (models preloaded) before the gateway binds,
   * so it never reports ready (stdout line, /readyz) before they are. */
  const spn_job_runner_t *runner = runners_start(&runners, "serve", &rc_cfg, cfg.pipeline_defs,
                                                 cfg.n_pipeline_defs, plugin_paths, n_plugin_paths, cfg.devices,
                                                 log_level);
  if (!runner)
    goto out;
  runners_cancel_grace(&runners, cfg.cancel_grace_s);
  /* Loaded pipelines are listed in HELLO like the required ones. */
  for (size_t i = 0; i < cfg.n_pipeline_defs; i++) {
    char **nv = realloc(cfg.pipelines, (cfg.n_pipelines + 1) * sizeof *nv);
    if (!nv)
      goto out;
    cfg.pipelines = nv;
    if (!(cfg.pipelines[cfg.n_pipelines] = strdup(cfg.pipeline_defs[i].name)))
      goto out;
    cfg.n_pipelines++;
  }
  spn_server_t *s = NULL;
  if (spn_server_new(&cfg, runner, &s, &err) < 0) {
    fprintf(stderr, "spindle serve: %s\n", err.msg);
    goto out;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (spn_server_run(s, &err) < 0)
    fprintf(stderr, "spindle serve: %s\n", err.msg);
  else
    rc = EXIT_OK;
  spn_server_free(&s);
out:
  runners_stop(&runners);
  spn_server_config_clear(&cfg);
  free(plugin_paths);
  free(given);
  return rc;
}

/* ---- worker ---- */

/* SIGTERM drains (a second one stops at once); SIGINT stops at once. */
static volatile int worker_stop, worker_stop_now;
static void on_stop_signal(int sig) {
  if (sig == SIGINT || worker_stop)
    worker_stop_now = 1;
  worker_stop = 1;
}

static int cmd_worker(int argc, char **argv) {
  spn_worker_config_t wc = {.slots = 1, .heartbeat_ms = 1000, .max_msg_size = 1 << 20, .stop = &worker_stop,
                            .stop_now = &worker_stop_now, .drain_grace_s = 30, .lease_ms = 3000};
  const char *queue = NULL, *queue_auth = NULL, *queue_prefix = NULL;
  bool drain_set = false, lease_set = false, wait_set = false, grace_set = false;
  uint32_t cancel_grace = 120;
  spn_test_runner_config_t trc = {.chunk_bytes = 65536};
  const char *keyfile = NULL, *server_key_file = NULL, *config = NULL, *devices = NULL, *log_level = NULL;
  const char *plugin_paths[16];
  size_t n_plugin_paths = 0;
  static const struct option opts[] = {
      REQ("connect", O_CONNECT), REQ("queue", O_QUEUE), REQ("queue-auth-file", O_QUEUE_AUTH),
      REQ("queue-prefix", O_QUEUE_PREFIX), REQ("queue-wait", O_QUEUE_WAIT), REQ("drain-grace-s", O_DRAIN_GRACE),
      REQ("lease-ms", O_LEASE_MS), REQ("cancel-grace", O_CANCEL_GRACE),
      REQ("name", O_NAME), REQ("http", O_HTTP), REQ("slots", O_SLOTS), REQ("heartbeat-ms", O_HEARTBEAT_MS),
      REQ("chunk-bytes", O_CHUNK_BYTES), REQ("chunk-delay-ms", O_CHUNK_DELAY_MS), REQ("exec-log", O_EXEC_LOG),
      REQ("curve-keyfile", O_CURVE_KEYFILE), REQ("server-key-file", O_SERVER_KEY_FILE),
      REQ("config", O_CONFIG), REQ("devices", O_DEVICES), REQ("plugin-path", O_PLUGIN_PATH),
      REQ("log-level", O_LOG_LEVEL), SPN_CLI_HELP_OPT, {0}};
  spn_cli_getopt_t g = {.cmd = "worker"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    const char *v = g.arg;
    bool ok = true;
    switch (c) {
    case 'h':
      printf("usage: spindle worker --connect tcp://HOST:PORT | --queue redis://HOST[:PORT][/DB]\n"
             "       [--slots N] [--name NAME] [--drain-grace-s N] [--lease-ms N]\n"
             "       [--cancel-grace S]   a stopped job still inside a stage's call after S s\n"
             "                            is abandoned and the worker exits 1 (default 120; 0: wait)\n"
             "       [--queue-auth-file F] [--queue-prefix P] [--queue-wait S]\n"
             "       [--config SERVER.toml] [--plugin-path DIR]... [--devices SPEC]\n"
             "       [--log-level debug|info|warn|error]   the pipelines' log (default info)\n"
             "       [--heartbeat-ms N] [--curve-keyfile F --server-key-file F]\n"
             "       [--http HOST:PORT]   serve /healthz, /readyz and /metrics (Prometheus)\n"
             "       [--chunk-bytes N] [--chunk-delay-ms N] [--exec-log FILE]\n");
      return EXIT_OK;
    case SPN_CLI_BAD: return EXIT_USAGE;
    case SPN_CLI_ARG: return usage_err("worker", "unexpected argument \"%s\"", v);
    case O_CONNECT: wc.connect = v; break;
    case O_QUEUE: queue = v; break;
    case O_QUEUE_AUTH: queue_auth = v; break;
    case O_QUEUE_PREFIX: queue_prefix = v; break;
    case O_QUEUE_WAIT: ok = parse_u32(v, &wc.queue_wait_s); wait_set = true; break;
    case O_DRAIN_GRACE: ok = parse_u32(v, &wc.drain_grace_s); drain_set = true; break;
    case O_CANCEL_GRACE: ok = parse_u32(v, &cancel_grace); grace_set = true; break;
    case O_LEASE_MS: ok = parse_u32(v, &wc.lease_ms); lease_set = true; break;
    case O_NAME: wc.name = v; break;
    case O_HTTP: wc.http = v; break;
    case O_SLOTS: ok = parse_u32(v, &wc.slots); break;
    case O_HEARTBEAT_MS: ok = parse_u32(v, &wc.heartbeat_ms); break;
    case O_CHUNK_BYTES: ok = parse_u32(v, &trc.chunk_bytes); break;
    case O_CHUNK_DELAY_MS: ok = parse_u32(v, &trc.chunk_delay_ms); break;
    case O_EXEC_LOG: trc.exec_log = v; break;
    case O_CURVE_KEYFILE: keyfile = v; break;
    case O_SERVER_KEY_FILE: server_key_file = v; break;
    case O_CONFIG: config = v; break;
    case O_DEVICES: devices = v; break;
    case O_LOG_LEVEL: {
      int32_t level = 0;
      if (spn_cli_log_level("worker", v, &level) != 0)
        return EXIT_USAGE;
      log_level = v;
      break;
    }
    case O_PLUGIN_PATH:
      if (n_plugin_paths == sizeof plugin_paths / sizeof plugin_paths[0])
        return usage_err("worker", "at most 16 --plugin-path%s", "");
      plugin_paths[n_plugin_paths++] = v;
      break;
    default: return EXIT_USAGE;
    }
    if (!ok)
      return usage_err("worker", "--%s needs a non-negative integer", g.name);
  }
  /* the ranges a config file's keys have hold for their flags too */
  const struct {
    const char *section, *key, *flag;
    uint32_t v;
  } ranged[] = {{"queue", "lease_ms", "lease-ms", wc.lease_ms},
                {"queue", "heartbeat_ms", "heartbeat-ms", wc.heartbeat_ms},
                {"queue", "wait_s", "queue-wait", wc.queue_wait_s},
                {"server", "drain_grace_s", "drain-grace-s", wc.drain_grace_s},
                {"server", "cancel_grace_s", "cancel-grace", cancel_grace},
                {"test_runner", "chunk_bytes", "chunk-bytes", trc.chunk_bytes},
                {"test_runner", "chunk_delay_ms", "chunk-delay-ms", trc.chunk_delay_ms}};
  for (size_t i = 0; i < sizeof ranged / sizeof ranged[0]; i++) {
    spn_error_t rerr = SPN_ERROR_INIT;
    if (spn_server_config_check_flag(ranged[i].section, ranged[i].key, ranged[i].flag, ranged[i].v, &rerr) < 0)
      return usage_err("worker", "%s", rerr.msg);
  }
  if (!wc.connect == !queue)
    return usage_err("worker", "give one of --connect (a gateway) or --queue (a shared Redis queue)%s", "");
  char pub[41], sec[41], srv[41];
  if (keyfile || server_key_file) {
    if (!keyfile || !server_key_file)
      return usage_err("worker", "CURVE needs both --curve-keyfile and --server-key-file%s", "");
    if (read_key(keyfile, "public", pub) < 0 || read_key(keyfile, "secret", sec) < 0 ||
        read_key(server_key_file, "public", srv) < 0)
      return EXIT_USAGE;
    wc.curve_public = pub;
    wc.curve_secret = sec;
    wc.curve_server = srv;
  }
  struct sigaction sa = {.sa_handler = on_stop_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  spn_error_t err = SPN_ERROR_INIT;
  /* The pipelines of a server config ([[pipeline]], [server] devices): a
   * remote worker runs them on its own runtime, loaded before it connects. */
  spn_server_config_t sc;
  spn_server_config_defaults(&sc);
  if (config && spn_server_config_load(&sc, config, &err) < 0) {
    fprintf(stderr, "spindle worker: %s\n", err.msg);
    spn_server_config_clear(&sc);
    return EXIT_FAILED;
  }
  /* --queue: lease straight from the queue; [queue] settings of --config
   * (backoff, lease, prefix, auth) apply unless a flag says otherwise. */
  spn_queue_config_t qc = {.backend = "redis", .url = queue,
                           .auth_file = queue_auth ? queue_auth : sc.queue_auth_file,
                           .prefix = queue_prefix ? queue_prefix : sc.queue_prefix,
                           .backoff_base_ms = sc.backoff_base_ms, .backoff_max_ms = sc.backoff_max_ms};
  if (config && !lease_set)
    wc.lease_ms = sc.lease_ms;
  if (config && !drain_set)
    wc.drain_grace_s = sc.drain_grace_s;
  if (!wait_set)
    wc.queue_wait_s = sc.queue_wait_s; /* the config's, or the default */
  qc.connect_later = wc.queue_wait_s > 0;
  qc.lease_ms = wc.lease_ms;
  if (queue)
    wc.queue = &qc;
  runners_t runners;
  const spn_job_runner_t *runner = runners_start(&runners, "worker", &trc, sc.pipeline_defs, sc.n_pipeline_defs,
                                                 plugin_paths, n_plugin_paths, devices ? devices : sc.devices,
                                                 log_level);
  if (runner)
    runners_cancel_grace(&runners, grace_set ? cancel_grace : sc.cancel_grace_s);
  int rc = EXIT_OK;
  if (!runner) {
    rc = EXIT_FAILED;
  } else if ((queue ? spn_queue_worker_run(&wc, runner, &err) : spn_worker_run(&wc, runner, &err)) < 0) {
    fprintf(stderr, "spindle worker: %s\n", err.msg);
    rc = EXIT_FAILED;
  }
  runners_stop(&runners);
  spn_server_config_clear(&sc);
  return rc;
}

/* ---- client commands ---- */

typedef struct copts {
  const char *connect;
  spn_client_options_t o;
  char pub[41], sec[41], srv[41];
  /* watch, submit --wait: how long to go on while the gateway does not
   * answer (0: no limit), when given; else DEFAULT_GATEWAY_WAIT_S */
  uint32_t gateway_wait_s;
  bool gateway_wait_given;
} copts_t;

#define DEFAULT_GATEWAY_WAIT_S 600

#define CLIENT_OPTS                                                                                           \
  REQ("connect", O_CONNECT), REQ("timeout-ms", O_TIMEOUT_MS), REQ("curve-keyfile", O_CURVE_KEYFILE),           \
      REQ("server-key-file", O_SERVER_KEY_FILE), REQ("gateway-wait", O_GATEWAY_WAIT)

/* Take a common client option (c from CLIENT_OPTS): 1 if taken, 0 if not
 * one, or an exit code (> 1) after printing why. */
static int client_opt(copts_t *c, const char *cmd, int opt, const char *v) {
  switch (opt) {
  case O_CONNECT:
    c->connect = v;
    return 1;
  case O_TIMEOUT_MS: {
    uint32_t t;
    if (!parse_u32(v, &t) || t == 0 || t > INT32_MAX)
      return usage_err(cmd, "--timeout-ms needs a positive integer, got \"%s\"", v);
    c->o.timeout_ms = (int32_t)t;
    return 1;
  }
  case O_GATEWAY_WAIT:
    if (!parse_u32(v, &c->gateway_wait_s))
      return usage_err(cmd, "--gateway-wait needs seconds (0: no limit), got \"%s\"", v);
    c->gateway_wait_given = true;
    return 1;
  case O_CURVE_KEYFILE:
    if (read_key(v, "public", c->pub) < 0 || read_key(v, "secret", c->sec) < 0)
      return EXIT_USAGE;
    c->o.curve_public_key = c->pub;
    c->o.curve_secret_key = c->sec;
    return 1;
  case O_SERVER_KEY_FILE:
    if (read_key(v, "public", c->srv) < 0)
      return EXIT_USAGE;
    c->o.curve_server_key = c->srv;
    return 1;
  default:
    return 0;
  }
}

static const char *client_endpoint(const copts_t *c) {
  const char *ep = c->connect ? c->connect : getenv("SPINDLE_GATEWAY");
  return ep ? ep : DEFAULT_GATEWAY;
}

static int client_open(copts_t *c, const char *cmd, spn_client_t **out) {
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_client_new(client_endpoint(c), &c->o, out, &err) < 0) {
    fprintf(stderr, "spindle %s: %s\n", cmd, err.msg);
    return -1;
  }
  return 0;
}

static const char client_opts_help[] =
    "  --connect EP          gateway (default $SPINDLE_GATEWAY or " DEFAULT_GATEWAY ")\n"
    "  --timeout-ms N        per-request timeout\n"
    "  --gateway-wait S      watch, submit --wait: how long to go on while the gateway does not\n"
    "                        answer (default 600; 0: no limit)\n"
    "  --curve-keyfile F --server-key-file F   CURVE client keys\n";

static int outcome(spn_queue_state_t s) {
  switch (s) {
  case SPN_QSTATE_SUCCEEDED: return EXIT_OK;
  case SPN_QSTATE_CANCELLED: return EXIT_CANCELLED;
  case SPN_QSTATE_DEAD: return EXIT_DEAD;
  default: return EXIT_FAILED;
  }
}

typedef struct watch_ui {
  bool tty;
  double t0, last_print, rate_t; /* rate_t/rate_done: the first running event seen */
  uint64_t rate_done;
  bool rate_anchored;
  double fps;
  int last_state;
  uint64_t last_done;
  spn_client_t *cl;
  const char *cmd;
  bool waiting; /* said that no worker runs its pipeline */
  const char *endpoint;
  int64_t give_up_ms; /* 0: never */
  bool silent;        /* said that the gateway does not answer */
  int64_t gave_up;    /* ms it had not answered when we stopped; 0: we did not */
} watch_ui_t;

static int on_event(void *user, const spn_client_status_t *ev) {
  watch_ui_t *ui = user;
  double now = spn__mono_s();
  /* The gateway stopped answering (the same status comes again): say so
   * once, and when it is back; the job goes on in the queue either way. */
  int64_t unanswered = spn_client_unanswered_ms(ui->cl);
  if ((unanswered > 0) != ui->silent) {
    if (ui->tty && ui->last_state >= 0) {
      fprintf(stderr, "\r\033[K");
      ui->last_state = -1;
    }
    if (unanswered > 0)
      fprintf(stderr, "spindle %s: no answer from the gateway at %s for %.0f s; still trying (the job is in its "
              "queue and goes on; Ctrl-C stops watching, not the job)\n", ui->cmd, ui->endpoint,
              (double)unanswered / 1000.0);
    else
      fprintf(stderr, "spindle %s: the gateway at %s answers again\n", ui->cmd, ui->endpoint);
    ui->silent = unanswered > 0;
  }
  if (ui->give_up_ms && unanswered >= ui->give_up_ms) {
    ui->gave_up = unanswered;
    return 1;
  }
  if (unanswered > 0)
    return 0; /* nothing new about the job */
  /* fps: frames since the first running event over the time since then.
   * Rates between consecutive events are not used: events are batched on
   * their way here, so two arriving close together would claim a rate the
   * pipeline never had. The first 0.2 s shows no figure. */
  if (ev->state != SPN_QSTATE_RUNNING) { /* run again (another attempt): a rate of its own */
    ui->rate_anchored = false;
    ui->fps = 0;
  } else {
    if (!ui->rate_anchored) {
      ui->rate_anchored = true;
      ui->rate_done = ev->done;
      ui->rate_t = now;
    } else if (ev->done > ui->rate_done && now - ui->rate_t >= 0.2) {
      ui->fps = (double)(ev->done - ui->rate_done) / (now - ui->rate_t);
    }
  }
  /* Why a queued job waits, as it comes and goes: no worker that runs its
   * pipeline has been seen (the gateway tells within 5 s of a change), or
   * one is there again, busy; a job that starts needs no line. */
  char why[512];
  bool waiting = ev->state == SPN_QSTATE_QUEUED && spn_client_waiting(ui->cl, ev->id, why, sizeof why);
  if (waiting != ui->waiting && ev->state == SPN_QSTATE_QUEUED) {
    if (ui->tty && ui->last_state >= 0) {
      fprintf(stderr, "\r\033[K");
      ui->last_state = -1; /* the state line again, below this one */
    }
    if (waiting)
      fprintf(stderr, "spindle %s: job %lld is waiting: %s\n", ui->cmd, (long long)ev->id, why);
    else
      fprintf(stderr, "spindle %s: job %lld: a worker that runs pipeline \"%s\" is there now; the job is queued "
              "until one is free\n", ui->cmd, (long long)ev->id, ev->pipeline);
  }
  ui->waiting = waiting;
  bool state_changed = (int)ev->state != ui->last_state;
  if (ui->tty) {
    if (ev->state == SPN_QSTATE_RUNNING && ev->total > 0) {
      int width = 30, fill = (int)((double)ev->done / (double)ev->total * width);
      char bar[31];
      for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
      bar[width] = '\0';
      double eta = ui->fps > 0 ? (double)(ev->total - ev->done) / ui->fps : NAN;
      char fps[32] = "? fps";
      if (ui->fps > 0)
        snprintf(fps, sizeof fps, "%.1f fps", ui->fps);
      fprintf(stderr, "\r\033[Kjob %lld [%s] %llu/%llu frames  %s  ETA %s%.0fs", (long long)ev->id, bar,
              (unsigned long long)ev->done, (unsigned long long)ev->total, fps, isnan(eta) ? "?" : "",
              isnan(eta) ? 0.0 : eta);
    } else if (state_changed) {
      /* keep a finished progress bar on screen; state lines replace the rest */
      bool keep_bar = ui->last_state == SPN_QSTATE_RUNNING && ui->last_done > 0;
      fprintf(stderr, "%sjob %lld: %s", keep_bar ? "\n" : "\r\033[K", (long long)ev->id,
              spn_queue_state_name(ev->state));
    }
    if (spn_queue_state_terminal(ev->state))
      fprintf(stderr, "\n");
  } else if (state_changed || (ev->done != ui->last_done && now - ui->last_print >= 1.0) ||
             (ev->total && ev->done == ev->total && ev->done != ui->last_done)) {
    ui->last_print = now;
    /* no rate yet (the first 0.2 s, or a job that ran in less): none shown,
     * not "0.0 fps" */
    if (ev->state == SPN_QSTATE_RUNNING && ev->total && ui->fps > 0)
      fprintf(stderr, "job %lld: running %llu/%llu frames %.1f fps\n", (long long)ev->id,
              (unsigned long long)ev->done, (unsigned long long)ev->total, ui->fps);
    else if (ev->state == SPN_QSTATE_RUNNING && ev->total)
      fprintf(stderr, "job %lld: running %llu/%llu frames\n", (long long)ev->id, (unsigned long long)ev->done,
              (unsigned long long)ev->total);
    else
      fprintf(stderr, "job %lld: %s\n", (long long)ev->id, spn_queue_state_name(ev->state));
  }
  ui->last_state = (int)ev->state;
  ui->last_done = ev->done;
  return 0;
}

/* A reply (parsed as j, raw as text) printed as indented JSON, without the
 * request's "req". */
static void print_reply(cJSON *j, const char *text) {
  cJSON_DeleteItemFromObject(j, "req");
  char *pretty = j ? cJSON_Print(j) : NULL;
  printf("%s\n", pretty ? pretty : text);
  cJSON_free(pretty);
}

/* The gateway's STATUS reply for a job: its full job object (JSON). */
static int32_t request_status(spn_client_t *cl, int64_t id, char **reply, spn_error_t *err) {
  char type[17], body[64];
  snprintf(body, sizeof body, "{\"id\":%lld}", (long long)id);
  return spn_client_request(cl, "STATUS", body, type, reply, err);
}

/* A succeeded job's warnings (its status's "warnings"), one line each on
 * stderr: the job is done, but not quite as asked (a model replaced by a
 * built-in one, damaged input accepted). */
static void print_warnings(spn_client_t *cl, int64_t id, const char *cmd) {
  char *reply = NULL;
  if (request_status(cl, id, &reply, NULL) < 0)
    return;
  cJSON *j = cJSON_Parse(reply);
  const cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "warnings")) if (cJSON_IsString(it))
    fprintf(stderr, "spindle %s: job %lld warning: %s\n", cmd, (long long)id, it->valuestring);
  cJSON_Delete(j);
  free(reply);
}

static int watch_job(spn_client_t *cl, int64_t id, const char *cmd, const copts_t *co) {
  watch_ui_t ui = {.tty = isatty(STDERR_FILENO), .t0 = spn__mono_s(), .last_state = -1, .cl = cl, .cmd = cmd};
  ui.rate_t = ui.t0;
  ui.endpoint = client_endpoint(co);
  ui.give_up_ms = 1000 * (int64_t)(co->gateway_wait_given ? co->gateway_wait_s : DEFAULT_GATEWAY_WAIT_S);
  spn_client_status_t final;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_client_watch(cl, id, on_event, &ui, &final, &err) < 0) {
    fprintf(stderr, "spindle %s: job %lld: %s\n", cmd, (long long)id, err.msg);
    return EXIT_GATEWAY;
  }
  if (ui.gave_up) {
    fprintf(stderr, "spindle %s: job %lld: gave up after %.0f s without an answer from the gateway at %s "
            "(--gateway-wait); the job was %s when it last answered and stays in its queue: `spindle watch %lld` "
            "follows it again\n", cmd, (long long)id, (double)ui.gave_up / 1000.0, ui.endpoint,
            spn_queue_state_name(final.state), (long long)id);
    return EXIT_GATEWAY;
  }
  if (final.state != SPN_QSTATE_SUCCEEDED && final.reason[0])
    fprintf(stderr, "spindle %s: job %lld %s: %s\n", cmd, (long long)id,
            spn_queue_state_name(final.state), final.reason);
  if (final.state == SPN_QSTATE_SUCCEEDED)
    print_warnings(cl, id, cmd);
  printf("%lld %s\n", (long long)id, spn_queue_state_name(final.state));
  return outcome(final.state);
}

/* Make a path absolute without requiring it to exist (outputs). */
static char *absolute(const char *p) {
  if (p[0] == '/')
    return strdup(p);
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd))
    return NULL;
  size_t n = strlen(cwd) + strlen(p) + 2;
  char *r = malloc(n);
  if (r)
    snprintf(r, n, "%s/%s", cwd, p);
  return r;
}

static int add_io(spn_client_job_t *job, const char *v, bool input) {
  const char *eq = strchr(v, '=');
  if (!eq || eq == v || !eq[1])
    return -1;
  char name[128];
  snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
  char *p = absolute(eq + 1);
  int rc = !p ? -1
              : (input ? spn_client_job_input(job, name, p) : spn_client_job_output(job, name, p)) < 0 ? -1 : 0;
  free(p);
  return rc;
}

static const char submit_help[] =
    "usage: spindle submit PIPELINE --input NAME=PATH... --output NAME=PATH...\n"
    "       [--param K=V]... [--priority N] [--idempotency-key K] [--deadline S]\n"
    "       [--max-attempts N] [--timeout S] [--segments N | --segment-seconds S] [--wait]\n"
    "  --deadline S   a job still queued S seconds after the submission fails\n"
    "  --timeout S    an attempt that runs longer than S seconds is stopped and fails (then retried)\n";

static int cmd_submit(int argc, char **argv) {
  static const struct option opts[] = {
      CLIENT_OPTS, {"wait", no_argument, NULL, O_WAIT}, REQ("input", O_INPUT), REQ("output", O_OUTPUT),
      REQ("param", O_PARAM), REQ("priority", O_PRIORITY), REQ("max-attempts", O_MAX_ATTEMPTS),
      REQ("deadline", O_DEADLINE), REQ("segments", O_SEGMENTS), REQ("segment-seconds", O_SEGMENT_SECONDS),
      REQ("idempotency-key", O_IDEMPOTENCY_KEY), REQ("timeout", O_JOB_TIMEOUT), SPN_CLI_HELP_OPT, {0}};
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  given_t *given = calloc((size_t)argc, sizeof *given);
  spn_client_job_t *job = NULL;
  const char *pipeline = NULL;
  size_t n_given = 0;
  bool wait = false;
  int rc = EXIT_USAGE;
  if (!given)
    return EXIT_FAILED;
  spn_cli_getopt_t g = {.cmd = "submit"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      printf("%s%s"
             "Prints the job id. With --wait, follows the job (progress bar on a terminal)\n"
             "and exits 0 succeeded, 1 failed, 3 cancelled, 4 dead, 5 gateway error.\n",
             submit_help, client_opts_help);
      rc = EXIT_OK;
      goto out;
    }
    if (c == SPN_CLI_BAD)
      goto out;
    int t = client_opt(&co, "submit", c, g.arg);
    if (t > 1) {
      rc = t;
      goto out;
    }
    if (t)
      continue;
    if (c == O_WAIT) {
      wait = true;
    } else if (c == SPN_CLI_ARG) {
      if (pipeline) {
        rc = usage_err("submit", "one pipeline only (also got \"%s\")", g.arg);
        goto out;
      }
      pipeline = g.arg;
    } else {
      given[n_given++] = (given_t){c, g.arg, g.name};
    }
  }
  if (!pipeline) {
    fputs(submit_help, stderr);
    rc = usage_err("submit", "which pipeline?%s", "");
    goto out;
  }
  if (!(job = spn_client_job_new(pipeline))) {
    rc = EXIT_FAILED;
    goto out;
  }
  for (size_t i = 0; i < n_given; i++) {
    const char *v = given[i].v;
    /* one name twice (--input a=x --input a=y): the second would silently
     * replace the first; say so instead */
    const char *veq = strchr(v, '=');
    for (size_t k = 0; veq && k < i && (given[i].c == O_INPUT || given[i].c == O_OUTPUT || given[i].c == O_PARAM);
         k++) {
      const char *keq = strchr(given[k].v, '=');
      if (given[k].c == given[i].c && keq && keq - given[k].v == veq - v && !strncmp(given[k].v, v, (size_t)(veq - v))) {
        char what[160];
        snprintf(what, sizeof what, "--%s %.*s is given twice", given[i].name, (int)(veq - v), v);
        rc = usage_err("submit", "%s", what);
        goto out;
      }
    }
    switch (given[i].c) {
    case O_INPUT:
    case O_OUTPUT:
      if (add_io(job, v, given[i].c == O_INPUT) < 0) {
        rc = usage_err("submit", "expected NAME=PATH, got \"%s\"", v);
        goto out;
      }
      break;
    case O_PARAM: {
      const char *eq = strchr(v, '=');
      if (!eq || eq == v) {
        rc = usage_err("submit", "expected --param KEY=VALUE, got \"%s\"", v);
        goto out;
      }
      char key[128];
      snprintf(key, sizeof key, "%.*s", (int)(eq - v), v);
      spn_client_job_param(job, key, eq + 1);
      break;
    }
    case O_PRIORITY: {
      char *end;
      errno = 0;
      long p = strtol(v, &end, 10);
      if (*end || end == v || errno || p < INT32_MIN || p > INT32_MAX) {
        rc = usage_err("submit", "--priority needs an integer, got \"%s\"", v);
        goto out;
      }
      spn_client_job_priority(job, (int32_t)p);
      break;
    }
    case O_MAX_ATTEMPTS: {
      uint32_t n;
      if (!parse_u32(v, &n)) {
        rc = usage_err("submit", "--max-attempts needs an integer, got \"%s\"", v);
        goto out;
      }
      spn_client_job_max_attempts(job, n);
      break;
    }
    case O_DEADLINE:
    case O_JOB_TIMEOUT: {
      /* the ranges the gateway allows (docs/protocol.md, SUBMIT) */
      bool dl = given[i].c == O_DEADLINE;
      double d;
      if (spn_cli_seconds("submit", dl ? "deadline" : "timeout", v, 0, false, dl ? 365.0 * 86400 : 7.0 * 86400,
                          &d)) {
        rc = EXIT_USAGE;
        goto out;
      }
      (dl ? spn_client_job_deadline : spn_client_job_timeout)(job, d);
      break;
    }
    case O_SEGMENTS:
    case O_SEGMENT_SECONDS: {
      /* passed on as given: the gateway checks the value and names the field */
      char *end;
      double d = strtod(v, &end);
      if (*end || end == v) {
        rc = usage_err("submit", "--segments / --segment-seconds need a number, got \"%s\"", v);
        goto out;
      }
      if (given[i].c == O_SEGMENTS)
        spn_client_job_segments(job, d);
      else
        spn_client_job_segment_seconds(job, d);
      break;
    }
    case O_IDEMPOTENCY_KEY:
      spn_client_job_idempotency_key(job, v);
      break;
    default:
      goto out;
    }
  }
  spn_client_t *cl;
  if (client_open(&co, "submit", &cl) < 0) {
    rc = EXIT_GATEWAY;
    goto out;
  }
  int64_t id;
  bool existed;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_client_submit(cl, job, &id, &existed, &err) < 0) {
    fprintf(stderr, "spindle submit: %s\n", err.msg);
    rc = EXIT_GATEWAY;
  } else if (wait) {
    if (existed)
      fprintf(stderr, "spindle submit: idempotency key matched job %lld\n", (long long)id);
    fprintf(stderr, "job %lld submitted\n", (long long)id);
    rc = watch_job(cl, id, "submit", &co);
  } else {
    printf("%lld%s\n", (long long)id, existed ? " existed" : "");
    rc = EXIT_OK;
  }
  spn_client_free(&cl);
out:
  spn_client_job_free(&job);
  free(given);
  return rc;
}

/* status / watch / cancel: ID plus client options. */
static int id_cmd(int argc, char **argv, const char *cmd, copts_t *co, int64_t *id) {
  static const struct option opts[] = {CLIENT_OPTS, {"json", no_argument, NULL, O_JSON}, SPN_CLI_HELP_OPT, {0}};
  bool have = false;
  spn_cli_getopt_t g = {.cmd = cmd};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      printf("usage: spindle %s ID\n%s", cmd, client_opts_help);
      return EXIT_OK;
    }
    if (c == SPN_CLI_BAD)
      return EXIT_USAGE;
    int t = client_opt(co, cmd, c, g.arg);
    if (t > 1)
      return t;
    if (t)
      continue;
    if (c == O_JSON) {
      if (strcmp(cmd, "status") != 0)
        return usage_err(cmd, "unknown option '--json'%s", "");
      continue; /* status prints JSON either way; the flag is accepted for scripts */
    }
    char *end;
    errno = 0;
    long long v = strtoll(g.arg, &end, 10);
    if (*end || end == g.arg || errno || v <= 0 || have)
      return usage_err(cmd, "expected one job id, got \"%s\"", g.arg);
    *id = v;
    have = true;
  }
  if (!have)
    return usage_err(cmd, "expected a job id%s", "");
  return -1;
}

static int cmd_status(int argc, char **argv) {
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  int64_t id;
  int r = id_cmd(argc, argv, "status", &co, &id);
  if (r >= 0)
    return r;
  spn_client_t *cl;
  if (client_open(&co, "status", &cl) < 0)
    return EXIT_GATEWAY;
  char *reply = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int rc = EXIT_OK;
  if (request_status(cl, id, &reply, &err) < 0) {
    fprintf(stderr, "spindle status: %s\n", err.msg);
    rc = EXIT_GATEWAY;
  } else {
    cJSON *j = cJSON_Parse(reply);
    print_reply(j, reply);
    cJSON_Delete(j);
    free(reply);
  }
  spn_client_free(&cl);
  return rc;
}

static int cmd_watch(int argc, char **argv) {
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  int64_t id;
  int r = id_cmd(argc, argv, "watch", &co, &id);
  if (r >= 0)
    return r;
  spn_client_t *cl;
  if (client_open(&co, "watch", &cl) < 0)
    return EXIT_GATEWAY;
  int rc = watch_job(cl, id, "watch", &co);
  spn_client_free(&cl);
  return rc;
}

static int cmd_cancel(int argc, char **argv) {
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  int64_t id;
  int r = id_cmd(argc, argv, "cancel", &co, &id);
  if (r >= 0)
    return r;
  spn_client_t *cl;
  if (client_open(&co, "cancel", &cl) < 0)
    return EXIT_GATEWAY;
  spn_queue_state_t st;
  spn_error_t err = SPN_ERROR_INIT;
  int rc = EXIT_OK;
  if (spn_client_cancel(cl, id, &st, &err) < 0) {
    fprintf(stderr, "spindle cancel: %s\n", err.msg);
    rc = EXIT_GATEWAY;
  } else {
    printf("%lld %s\n", (long long)id, st == SPN_QSTATE_RUNNING ? "cancelling" : spn_queue_state_name(st));
  }
  spn_client_free(&cl);
  return rc;
}

/* One row of LIST's reply. REASON: why it failed, or, for a queued job
 * that no worker will take yet, that it waits (its status says more). */
static void list_row(const cJSON *j) {
  const cJSON *reason = cJSON_GetObjectItemCaseSensitive(j, "reason");
  const char *why = cJSON_IsString(reason) ? reason->valuestring
                    : cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "waiting")) ? "waiting: no worker runs this pipeline"
                                                                                      : "";
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state"), *pl = cJSON_GetObjectItemCaseSensitive(j, "pipeline");
  printf("%-8.0f %-10s %-12s %3.0f/%-3.0f %8.0f/%-8.0f %8.2f  %s\n",
         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "id")), cJSON_IsString(st) ? st->valuestring : "?",
         cJSON_IsString(pl) ? pl->valuestring : "", cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "attempts")),
         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "max_attempts")),
         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "done")),
         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "total")),
         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "compute_s")), why);
}

static int cmd_jobs(int argc, char **argv) {
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  int32_t state = -1;
  uint32_t limit = 100;
  static const struct option opts[] = {CLIENT_OPTS, REQ("state", O_STATE), REQ("limit", O_LIMIT), SPN_CLI_HELP_OPT,
                                       {0}};
  spn_cli_getopt_t g = {.cmd = "jobs"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    const char *v = g.arg;
    if (c == 'h') {
      printf("usage: spindle jobs [--state S] [--limit N]\n%s", client_opts_help);
      return EXIT_OK;
    }
    if (c == SPN_CLI_BAD)
      return EXIT_USAGE;
    int t = client_opt(&co, "jobs", c, v);
    if (t > 1)
      return t;
    if (t)
      continue;
    if (c == O_STATE) {
      if ((state = spn_queue_state_parse(v)) < 0)
        return usage_err("jobs", "unknown state \"%s\"", v);
    } else if (c == O_LIMIT) {
      if (!parse_u32(v, &limit) || limit == 0 || limit > 1000)
        return usage_err("jobs", "--limit needs 1-1000, got \"%s\"", v);
    } else {
      return usage_err("jobs", "unexpected argument \"%s\"", v);
    }
  }
  spn_client_t *cl;
  if (client_open(&co, "jobs", &cl) < 0)
    return EXIT_GATEWAY;
  printf("%-8s %-10s %-12s %7s %17s %8s  %s\n", "ID", "STATE", "PIPELINE", "TRIES", "PROGRESS",
         "CPU_S", "REASON");
  spn_error_t err = SPN_ERROR_INIT;
  int rc = EXIT_OK;
  char body[96], type[17], *reply = NULL;
  snprintf(body, sizeof body, "{\"limit\":%u%s%s%s}", limit ? limit : 100, state >= 0 ? ",\"state\":\"" : "",
           state >= 0 ? spn_queue_state_name((spn_queue_state_t)state) : "", state >= 0 ? "\"" : "");
  if (spn_client_request(cl, "LIST", body, type, &reply, &err) < 0) {
    fprintf(stderr, "spindle jobs: %s\n", err.msg);
    rc = EXIT_GATEWAY;
  } else {
    cJSON *r = cJSON_Parse(reply);
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(r, "jobs")) list_row(it);
    cJSON_Delete(r);
  }
  free(reply);
  spn_client_free(&cl);
  return rc;
}

static int cmd_workers(int argc, char **argv) {
  copts_t co = {.o = SPN_CLIENT_OPTIONS_INIT};
  bool json = false;
  static const struct option opts[] = {CLIENT_OPTS, {"json", no_argument, NULL, O_JSON}, SPN_CLI_HELP_OPT, {0}};
  spn_cli_getopt_t g = {.cmd = "workers"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      printf("usage: spindle workers [--json]\n%s"
             "Lists the workers (what each runs, slots, jobs running): the gateway's own\n"
             "slots and remote workers and, on a Redis queue, every other gateway's and\n"
             "every stateless worker, a worker that stopped without draining as gone for\n"
             "10 min. Then each pipeline with when a worker that runs it was last there.\n",
             client_opts_help);
      return EXIT_OK;
    }
    if (c == SPN_CLI_BAD)
      return EXIT_USAGE;
    int t = client_opt(&co, "workers", c, g.arg);
    if (t > 1)
      return t;
    if (t)
      continue;
    if (c == O_JSON)
      json = true;
    else
      return usage_err("workers", "unexpected argument \"%s\"", g.arg);
  }
  spn_client_t *cl;
  if (client_open(&co, "workers", &cl) < 0)
    return EXIT_GATEWAY;
  spn_error_t err = SPN_ERROR_INIT;
  char type[17], *reply = NULL;
  int rc = EXIT_OK;
  if (spn_client_request(cl, "WORKERS", "{}", type, &reply, &err) < 0) {
    fprintf(stderr, "spindle workers: %s\n", err.msg);
    rc = EXIT_GATEWAY;
  } else {
    cJSON *r = cJSON_Parse(reply);
    if (json) {
      print_reply(r, reply);
    } else {
      const cJSON *w, *p, *it, *mine = cJSON_GetObjectItemCaseSensitive(r, "gateway");
      printf("%-28s %-7s %5s %8s  %s\n", "WORKER", "KIND", "SLOTS", "RUNNING", "PIPELINES");
      cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(r, "workers")) {
        const cJSON *pl = cJSON_GetObjectItemCaseSensitive(w, "pipelines");
        char names[512] = "";
        size_t at = 0;
        if (cJSON_IsNull(pl))
          snprintf(names, sizeof names, "any");
        cJSON_ArrayForEach(it, pl) if (cJSON_IsString(it) && at < sizeof names) {
          int k = snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", it->valuestring);
          at += k > 0 ? (size_t)k : 0;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(w, "name"), *kind = cJSON_GetObjectItemCaseSensitive(w, "kind");
        const cJSON *gw = cJSON_GetObjectItemCaseSensitive(w, "gateway");
        /* where it is, when not this gateway's; then its state */
        char note[256] = "";
        size_t nl = 0;
        bool ours = cJSON_IsString(gw) && cJSON_IsString(mine) && !strcmp(gw->valuestring, mine->valuestring);
        if (cJSON_IsString(gw) && !ours && cJSON_IsString(kind) && !strcmp(kind->valuestring, "local"))
          nl += (size_t)snprintf(note + nl, sizeof note - nl, " (another gateway)");
        else if (cJSON_IsString(gw) && !ours)
          nl += (size_t)snprintf(note + nl, sizeof note - nl, " (via %.120s)", gw->valuestring);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "gone"))) {
          char a[40];
          spn__say_duration(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(w, "last_heard_ms")) / 1000.0, a,
                            sizeof a);
          snprintf(note + nl, sizeof note - nl, " (gone: last heard %s ago)", a);
        } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "draining"))) {
          snprintf(note + nl, sizeof note - nl, " (draining)");
        }
        printf("%-28s %-7s %5.0f %8.0f  %s%s\n", cJSON_IsString(name) ? name->valuestring : "?",
               cJSON_IsString(kind) ? kind->valuestring : "?",
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(w, "slots")),
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(w, "running")), names, note);
      }
      /* a worker is there when one was recorded within three rounds */
      printf("\n%-28s %s\n", "PIPELINE", "A WORKER THAT RUNS IT");
      cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(r, "pipelines")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(p, "worker_seen_ms_ago");
        char when[64] = "none (never seen)";
        if (cJSON_IsNumber(ms) && ms->valuedouble <= SPN_PRESENCE_STALE_MS) {
          snprintf(when, sizeof when, "yes");
        } else if (cJSON_IsNumber(ms)) {
          char a[40];
          spn__say_duration(ms->valuedouble / 1000.0, a, sizeof a);
          snprintf(when, sizeof when, "none (last seen %s ago)", a);
        }
        printf("%-28s %s\n", cJSON_IsString(name) ? name->valuestring : "?", when);
      }
    }
    cJSON_Delete(r);
  }
  free(reply);
  spn_client_free(&cl);
  return rc;
}

int spn_cli_serve(int argc, char **argv) { return cmd_serve(argc, argv); }
int spn_cli_workers(int argc, char **argv) { return cmd_workers(argc, argv); }
int spn_cli_worker(int argc, char **argv) { return cmd_worker(argc, argv); }
int spn_cli_submit(int argc, char **argv) { return cmd_submit(argc, argv); }
int spn_cli_status(int argc, char **argv) { return cmd_status(argc, argv); }
int spn_cli_watch(int argc, char **argv) { return cmd_watch(argc, argv); }
int spn_cli_cancel(int argc, char **argv) { return cmd_cancel(argc, argv); }
int spn_cli_jobs(int argc, char **argv) { return cmd_jobs(argc, argv); }
int spn_cli_keygen(int argc, char **argv) { return cmd_keygen(argc, argv); }
