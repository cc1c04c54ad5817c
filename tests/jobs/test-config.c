/* test-config.c — loading the server config: the shipped configs/server.toml
 * and configs that must be refused with file:line:col. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobs-internal.h"

static void test_shipped_config(void **state) {
  (void)state;
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  assert_non_null(root);
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/server.toml", root);
  spn_server_config_t c;
  spn_server_config_defaults(&c);
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_server_config_load(&c, path, &err);
  if (rc)
    fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, SPN_OK);
  assert_string_equal(c.bind, "tcp://127.0.0.1:7700");
  assert_string_equal(c.db_path, "spindle-jobs.db");
  assert_int_equal(c.workers, 2);
  assert_int_equal(c.max_msg_size, 1048576);
  assert_int_equal(c.lease_ms, 3000);
  assert_int_equal(c.heartbeat_ms, 1000);
  assert_int_equal(c.max_attempts, 3);
  assert_int_equal(c.backoff_base_ms, 1000);
  assert_int_equal(c.backoff_max_ms, 60000);
  assert_int_equal(c.queue_wait_s, 300);
  assert_int_equal(c.keep_ended_s, 7 * 86400);
  assert_int_equal(c.n_pipelines, 1);
  assert_string_equal(c.pipelines[0], "copy");
  assert_int_equal(c.input_roots.n, 1);
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_string_equal(c.input_roots.dirs[0], cwd);
  assert_false(c.sync_full);
  assert_string_equal(c.devices, "auto");
  assert_int_equal(c.n_pipeline_defs, 1);
  assert_string_equal(c.pipeline_defs[0].name, "synthetic");
  /* relative to the server config's folder */
  snprintf(path, sizeof path, "%s/configs/synthetic-job.toml", root);
  assert_string_equal(c.pipeline_defs[0].config, path);
  spn_server_config_clear(&c);
}

static int32_t load_str(const char *toml, spn_error_t *err) {
  char path[] = "/tmp/spn-server-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, toml, strlen(toml)), (ssize_t)strlen(toml));
  close(fd);
  spn_server_config_t c;
  spn_server_config_defaults(&c);
  int32_t rc = spn_server_config_load(&c, path, err);
  spn_server_config_clear(&c);
  unlink(path);
  return rc;
}

static void test_refusals(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(load_str("[server]\nworkers = 2\nwokers = 3\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":3:1: unknown key \"server.wokers\""));
  assert_int_equal(load_str("[queue]\nlease_ms = \"long\"\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":2:12: queue.lease_ms: expected integer, got string"));
  assert_int_equal(load_str("[queue]\nmax_attempts = 0\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "queue.max_attempts: 0 is outside [1, 100]"));
  assert_int_equal(load_str("[queue]\nwait_s = 100000\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "queue.wait_s: 100000 is outside [0, 86400]"));
  assert_int_equal(load_str("[queue]\nwait_s = 0\n", &err), SPN_OK);
  assert_int_equal(load_str("[queue]\nkeep_ended_s = 400000000\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "queue.keep_ended_s: 400000000 is outside [0, 315360000]"));
  assert_int_equal(load_str("[queue]\nkeep_ended_s = 0\n", &err), SPN_OK);
  assert_int_equal(load_str("[nope]\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":1:2: unknown section \"nope\""));
  assert_int_equal(load_str("[paths]\ninput_roots = [\"/no/such/dir\"]\n", &err), SPN_ENOENT);
  assert_non_null(strstr(err.msg, ":2:16: paths.input_roots: root /no/such/dir"));
  assert_int_equal(load_str("[server\n", &err), SPN_EPARSE);
  assert_int_equal(load_str("[queue]\nbackoff_base_ms = 5000\nbackoff_max_ms = 10\n", &err), SPN_ECONFIG);
  assert_int_equal(load_str("[[pipeline]]\nname = \"a\"\nconfig = \"a.toml\"\n[[pipeline]]\nname = \"b\"\n", &err),
                   SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":4:1: [[pipeline]] needs name = \"...\" and config"));
  assert_int_equal(load_str("[[pipeline]]\nname = \"a\"\nconfg = \"a.toml\"\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":3:1: unknown key \"confg\" in [[pipeline]]"));
  assert_int_equal(load_str("[[pipeline]]\nname = 3\nconfig = \"a.toml\"\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, ":2:8: pipeline.name: expected string, got integer"));
  assert_int_equal(load_str("[pipeline]\nname = \"a\"\n", &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "must be an array of tables ([[pipeline]])"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shipped_config),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
