/* test-loader.c — the plugin loader against fake plugins that each break
 * one rule of spindle/plugin.h (tests/runtime/fakes). Every refusal must
 * come back with the right status, a message naming the file and the rule,
 * and leave the registry as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <unistd.h>
#include <cmocka.h>

#include "spec-internal.h"

static const char *fake_dir(void) {
  const char *d = getenv("SPINDLE_FAKE_PLUGIN_DIR");
  assert_non_null(d);
  return d;
}

static void fake_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/libspindle-%s.so", fake_dir(), name);
}

#define assert_has(hay, needle)                                                  \
  do {                                                                           \
    if (!strstr((hay), (needle)))                                                \
      fail_msg("expected \"%s\" in message: %s", (needle), (hay));               \
  } while (0)

static int setup(void **state) {
  unsetenv("SPINDLE_PLUGIN_PATH");
  spn__registry_t *reg = NULL;
  if (spn__registry_new(&reg, NULL) != SPN_OK)
    return -1;
  *state = reg;
  return 0;
}

static int teardown(void **state) {
  spn__registry_t *reg = *state;
  spn__registry_free(&reg);
  return 0;
}

static void good_plugin_registers_its_kinds(void **state) {
  spn__registry_t *reg = *state;
  char path[1024];
  fake_path(path, sizeof path, "src");
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__registry_load_file(reg, NULL, path, &err), SPN_OK);
  assert_int_equal(spn__registry_count(reg), 2);
  assert_true(spn__registry_has_plugin(reg, "src"));
  const char *origin = NULL;
  const spn_stage_kind_t *k = spn__registry_find(reg, "fake_src", &origin);
  assert_non_null(k);
  assert_string_equal(origin, path);
  assert_int_equal(k->n_outputs, 1);
  assert_string_equal(k->outputs[0].type, "video");
  assert_string_equal(k->schema[0].key, "frames");
  k = spn__registry_find(reg, "fake_sink", NULL);
  assert_non_null(k);
  assert_int_equal(k->n_inputs, 1);
  assert_ptr_equal(spn__registry_at(reg, 1, NULL), k);
  assert_null(spn__registry_at(reg, 2, NULL));
  assert_null(spn__registry_find(reg, "nope", NULL));
}

static void fini_runs_once_when_the_registry_is_freed(void **state) {
  (void)state;
  char path[1024];
  fake_path(path, sizeof path, "src");
  /* Hold our own reference so the counter survives the registry's dlclose. */
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(dl);
  void *sym = dlsym(dl, "fake_fini_calls");
  assert_non_null(sym);
  int (*calls)(void);
  memcpy(&calls, &sym, sizeof calls);
  int before = calls();
  spn__registry_t *reg = NULL;
  assert_int_equal(spn__registry_new(&reg, NULL), SPN_OK);
  assert_int_equal(spn__registry_load_file(reg, NULL, path, NULL), SPN_OK);
  assert_int_equal(calls(), before);
  spn__registry_free(&reg);
  assert_null(reg);
  assert_int_equal(calls(), before + 1);
  dlclose(dl);
}

/* Load a fake that must be refused; check code, file and rule. */
static void expect_refusal(spn__registry_t *reg, const char *name, int32_t code, const char *rule) {
  char path[1024];
  fake_path(path, sizeof path, name);
  size_t before = spn__registry_count(reg);
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn__registry_load_file(reg, NULL, path, &err);
  if (rc != code)
    fail_msg("%s: expected %s, got %s: %s", name, spn_err_name(code), spn_err_name(rc), err.msg);
  assert_int_equal(err.code, code);
  char file[256];
  snprintf(file, sizeof file, "libspindle-%s.so", name);
  assert_has(err.msg, file);
  assert_has(err.msg, rule);
  assert_int_equal(spn__registry_count(reg), before);
  assert_false(spn__registry_has_plugin(reg, name));
}

static void wrong_abi_major_is_refused(void **state) {
  expect_refusal(*state, "abimajor", SPN_EABI, "rule: ABI major must match");
}

static void newer_abi_minor_is_refused(void **state) {
  expect_refusal(*state, "abiminor", SPN_EABI, "rule: ABI minor must not be newer");
}

static void oversized_descriptor_is_refused(void **state) {
  expect_refusal(*state, "bigstruct", SPN_EABI, "rule: struct_size");
}

static void missing_symbol_is_refused(void **state) {
  expect_refusal(*state, "nosym", SPN_EABI, "rule: descriptor symbol");
  spn_error_t err = SPN_ERROR_INIT;
  char path[1024];
  fake_path(path, sizeof path, "nosym");
  spn__registry_load_file(*state, NULL, path, &err);
  assert_has(err.msg, "spindle_plugin_nosym_desc");
}

static void name_file_mismatch_is_refused(void **state) {
  expect_refusal(*state, "misnamed", SPN_EABI, "rule: name must match the file");
  spn_error_t err = SPN_ERROR_INIT;
  char path[1024];
  fake_path(path, sizeof path, "misnamed");
  spn__registry_load_file(*state, NULL, path, &err);
  assert_has(err.msg, "\"someone_else\"");
}

static void failing_init_is_refused_with_its_message(void **state) {
  expect_refusal(*state, "initfail", SPN_EUNSUPPORTED, "rule: init must succeed");
  spn_error_t err = SPN_ERROR_INIT;
  char path[1024];
  fake_path(path, sizeof path, "initfail");
  spn__registry_load_file(*state, NULL, path, &err);
  assert_has(err.msg, "no licence key found");
}

static void build_signature_mismatch_is_refused(void **state) {
  expect_refusal(*state, "badsig", SPN_EABI, "rule: build signature");
}

/* A plugin built against another CUDA major than this host's is refused,
 * and the message names both majors; one built against the host's own major
 * (present only in CUDA builds) loads. */
static void other_cuda_major_is_refused(void **state) {
  spn__registry_t *reg = *state;
  const char *dir = getenv("SPINDLE_FAKE_CUDA_PLUGIN_DIR");
  assert_non_null(dir);
  char path[1024];
  snprintf(path, sizeof path, "%s/libspindle-cudaother.so", dir);
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn__registry_load_file(reg, NULL, path, &err);
  if (rc != SPN_EABI)
    fail_msg("cudaother: expected SPN_EABI, got %s: %s", spn_err_name(rc), err.msg);
  assert_has(err.msg, "libspindle-cudaother.so");
  assert_has(err.msg, "rule: build signature");
  assert_has(err.msg, "CUDA ");
  assert_int_equal(spn__registry_count(reg), 0);
  assert_false(spn__registry_has_plugin(reg, "cudaother"));
  snprintf(path, sizeof path, "%s/libspindle-cudasame.so", dir);
  if (access(path, F_OK) == 0) {
    spn_error_t e2 = SPN_ERROR_INIT;
    rc = spn__registry_load_file(reg, NULL, path, &e2);
    if (rc != SPN_OK)
      fail_msg("cudasame: expected it to load, got %s: %s", spn_err_name(rc), e2.msg);
    assert_true(spn__registry_has_plugin(reg, "cudasame"));
  }
}

static void nonzero_reserved_is_refused(void **state) {
  expect_refusal(*state, "reserved", SPN_EABI, "rule: reserved zero");
}

static void duplicate_kind_is_refused_naming_both_files(void **state) {
  spn__registry_t *reg = *state;
  char path[1024];
  fake_path(path, sizeof path, "src");
  assert_int_equal(spn__registry_load_file(reg, NULL, path, NULL), SPN_OK);
  expect_refusal(reg, "dupkind", SPN_EEXIST, "rule: duplicate kind");
  spn_error_t err = SPN_ERROR_INIT;
  char dup[1024];
  fake_path(dup, sizeof dup, "dupkind");
  spn__registry_load_file(reg, NULL, dup, &err);
  assert_has(err.msg, "libspindle-src.so"); /* who has it already */
  assert_has(err.msg, "\"fake_src\"");
  /* The first plugin's kind is untouched. */
  const char *origin = NULL;
  assert_non_null(spn__registry_find(reg, "fake_src", &origin));
  assert_string_equal(origin, path);
}

static void malformed_kinds_are_refused(void **state) {
  expect_refusal(*state, "badschema", SPN_EABI, "rule: kind schema");
  expect_refusal(*state, "smallkind", SPN_EABI, "rule: kind struct_size");
  /* init ignored the refusal of its second kind and returned OK: the whole
   * plugin is refused, and its first (valid) kind is gone again. */
  expect_refusal(*state, "ignores", SPN_EABI, "rule: kind callbacks");
  assert_null(spn__registry_find(*state, "fake_ignores", NULL));
}

static void bad_file_names_and_missing_files(void **state) {
  spn__registry_t *reg = *state;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__registry_load_file(reg, NULL, "/nowhere/libfoo.so", &err), SPN_EABI);
  assert_has(err.msg, "/nowhere/libfoo.so");
  assert_has(err.msg, "rule: file name");
  assert_int_equal(spn__registry_load_file(reg, NULL, "/nowhere/libspindle-Bad.so", &err), SPN_EABI);
  assert_has(err.msg, "rule: file name");
  assert_int_equal(spn__registry_load_file(reg, NULL, "/nowhere/libspindle-gone.so", &err), SPN_ENOENT);
  assert_has(err.msg, "/nowhere/libspindle-gone.so");
}

static void same_file_twice_is_one_load_a_namesake_is_refused(void **state) {
  spn__registry_t *reg = *state;
  char path[1024];
  fake_path(path, sizeof path, "src");
  assert_int_equal(spn__registry_load_file(reg, NULL, path, NULL), SPN_OK);
  /* the same file again (a folder listed twice): nothing to do */
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__registry_load_file(reg, NULL, path, &err), SPN_OK);
  assert_int_equal(spn__registry_count(reg), 2);
  /* another file of the same name */
  char dir[] = "/tmp/spindle-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char copy[1200], cmd[2600];
  snprintf(copy, sizeof copy, "%s/libspindle-src.so", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(spn__registry_load_file(reg, NULL, copy, &err), SPN_EEXIST);
  assert_has(err.msg, copy);
  assert_has(err.msg, "already loaded from");
  assert_has(err.msg, "rule: duplicate plugin");
  assert_int_equal(spn__registry_count(reg), 2);
  unlink(copy);
  rmdir(dir);
}

/* A runtime's table whose register_kind is its own (it cannot know the
 * loader's plugin handle): the loader hands init a copy that registers. */
static int32_t foreign_register(spn_plugin_t *p, const spn_stage_kind_t *k, spn_error_t *err) {
  return spn_error_set(err, SPN_ESTATE, "not here");
}
static const char *foreign_name(spn_stage_t *s) { return "foreign"; }

static void a_runtime_table_gets_a_working_register_kind(void **state) {
  spn__registry_t *reg = *state;
  spn_host_api_t host = *spn__loader_host_api();
  host.register_kind = foreign_register;
  host.stage_get_name = foreign_name;
  char path[1024];
  fake_path(path, sizeof path, "src");
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__registry_load_file(reg, &host, path, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(spn__registry_count(reg), 2);
}

/* ABI 1.1: whatever table a caller passes — none, the loader's two-member
 * one, one with a short struct_size — init sees the complete table. */
static void init_always_gets_the_complete_host_table(void **state) {
  char path[1024];
  fake_path(path, sizeof path, "fulltable");
  spn_error_t err = SPN_ERROR_INIT;
  spn__registry_t *regs[3] = {NULL};
  spn_host_api_t small = *spn__loader_host_api();
  small.struct_size = offsetof(spn_host_api_t, stage_get_data);
  const spn_host_api_t *tables[3] = {NULL, spn__loader_host_api(), &small};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(spn__registry_new(&regs[i], NULL), SPN_OK);
    if (spn__registry_load_file(regs[i], tables[i], path, &err) != SPN_OK)
      fail_msg("table %d: %s", i, err.msg);
    spn__registry_free(&regs[i]);
  }
  (void)state;
}

static void two_registries_are_independent(void **state) {
  (void)state;
  char path[1024];
  fake_path(path, sizeof path, "src");
  spn__registry_t *a = NULL, *b = NULL;
  assert_int_equal(spn__registry_new(&a, NULL), SPN_OK);
  assert_int_equal(spn__registry_new(&b, NULL), SPN_OK);
  assert_int_equal(spn__registry_load_file(a, NULL, path, NULL), SPN_OK);
  assert_int_equal(spn__registry_load_file(b, NULL, path, NULL), SPN_OK);
  spn__registry_free(&a);
  const spn_stage_kind_t *k = spn__registry_find(b, "fake_src", NULL);
  assert_non_null(k);
  assert_string_equal(k->schema[0].key, "frames"); /* still mapped */
  spn__registry_free(&b);
}

static void search_path_loads_a_folder_and_reports_the_first_refusal(void **state) {
  spn__registry_t *reg = *state;
  const char *dirs[] = {"/nonexistent-spindle-dir", fake_dir()};
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn__registry_load_search_path(reg, NULL, dirs, 2, NULL, 0, &err);
  assert_int_equal(rc, SPN_EABI);
  /* Files load in name order: abimajor is the first, and refused. */
  assert_has(err.msg, "libspindle-abimajor.so");
  /* dupkind (loaded before src) took "fake_src", so src was refused as a
   * duplicate and never registered fake_sink; everything valid loaded. */
  const char *origin = NULL;
  assert_non_null(spn__registry_find(reg, "fake_src", &origin));
  assert_has(origin, "libspindle-dupkind.so");
  assert_null(spn__registry_find(reg, "fake_sink", NULL));
  assert_true(spn__registry_has_plugin(reg, "dupkind"));
  assert_false(spn__registry_has_plugin(reg, "src"));
  /* A second walk skips what is loaded and shadowed names stay as they are. */
  size_t n = spn__registry_count(reg);
  spn__registry_load_search_path(reg, NULL, dirs, 2, NULL, 0, NULL);
  assert_int_equal(spn__registry_count(reg), n);
}

static void environment_path_is_searched(void **state) {
  spn__registry_t *reg = *state;
  setenv("SPINDLE_PLUGIN_PATH", fake_dir(), 1);
  spn__registry_load_search_path(reg, NULL, NULL, 0, NULL, 0, NULL);
  unsetenv("SPINDLE_PLUGIN_PATH");
  assert_true(spn__registry_has_plugin(reg, "dupkind"));
}

/* spn__spec_load: the config's [plugins] path (relative to the config's
 * folder) joins the search path before stages are read. */
static void spec_load_searches_the_configs_plugin_path(void **state) {
  spn__registry_t *reg = *state;
  char dir[] = "/tmp/spindle-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char cmd[2600], conf[1200], src[1024];
  fake_path(src, sizeof src, "src");
  snprintf(cmd, sizeof cmd, "mkdir '%s/plug' && cp '%s' '%s/plug/'", dir, src, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(conf, sizeof conf, "%s/p.toml", dir);
  FILE *f = fopen(conf, "w");
  assert_non_null(f);
  fputs("[plugins]\npath = \"plug\"\n[[stage]]\nname = \"s\"\nkind = \"fake_src\"\nframes = 4\n"
        "[[stage]]\nname = \"k\"\nkind = \"fake_sink\"\ninputs = [\"s\"]\n",
        f);
  fclose(f);
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  const char *set[] = {"s.frames=9"};
  if (spn__spec_load(reg, NULL, NULL, 0, conf, NULL, 0, set, 1, &spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(spec->n_stages, 2);
  assert_int_equal(*(int64_t *)spec->stages[0].config, 9);
  assert_int_equal(spec->n_plugin_paths, 1);
  char want[1200];
  snprintf(want, sizeof want, "%s/plug", dir);
  assert_string_equal(spec->plugin_paths[0], want);
  const char *origin = NULL;
  spn__registry_find(reg, "fake_src", &origin);
  assert_has(origin, want);
  spn__spec_free(&spec);
  /* From a string: the name gives the folder; errors keep positions. */
  const char *text = "[[stage]]\nname = \"s\"\nkind = \"nope\"\n";
  assert_int_equal(spn__spec_load(reg, NULL, NULL, 0, conf, text, strlen(text), NULL, 0, &spec, &err), SPN_ECONFIG);
  assert_has(err.msg, "p.toml:3:8: stage \"s\": unknown stage kind \"nope\"");
  assert_int_equal(spn__spec_load(reg, NULL, NULL, 0, "/nowhere/x.toml", NULL, 0, NULL, 0, &spec, &err), SPN_ENOENT);
  assert_has(err.msg, "/nowhere/x.toml");
  snprintf(cmd, sizeof cmd, "rm -r '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* Kinds added directly get the same checks as kinds from plugins. */
static int32_t gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) { return SPN_EOS; }

static void directly_added_kinds_are_checked(void **state) {
  spn__registry_t *reg = *state;
  static const spn_port_t out[] = {{"out", "video"}};
  spn_stage_kind_t k = SPN_STAGE_KIND_INIT;
  k.name = "builtin";
  k.outputs = out;
  k.n_outputs = 1;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "rule: kind callbacks");
  k.generate = gen;
  k.n_outputs = 2; /* outputs has one entry, but the port check sees out[1] */
  k.outputs = (const spn_port_t[]){{"a", "video"}, {"a", "audio"}};
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "two outputs named \"a\"");
  k.outputs = out;
  k.n_outputs = 1;
  k.reserved[0] = &k;
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "rule: reserved zero");
  k.reserved[0] = NULL;
  k.name = "has.dot";
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "rule: kind name");
  k.name = "builtin";
  static const spn_config_field_t reserved_key[] = {{.key = "device", .type = SPN_CONFIG_STRING}, {0}};
  k.schema = reserved_key;
  k.config_size = sizeof(char *);
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "reserved for the host");
  static const spn_config_field_t bad_default[] = {
      {.key = "n", .type = SPN_CONFIG_INT, .def_int = 50, .min = 0, .max = 10}, {0}};
  k.schema = bad_default;
  k.config_size = sizeof(int64_t);
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_EABI);
  assert_has(err.msg, "default 50 is outside [0, 10]");
  k.schema = NULL;
  k.config_size = 0;
  assert_int_equal(spn__registry_add_kind(reg, &k, "test", &err), SPN_OK);
  assert_int_equal(spn__registry_add_kind(reg, &k, "test2", &err), SPN_EEXIST);
  assert_has(err.msg, "already registered by test");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(good_plugin_registers_its_kinds, setup, teardown),
      cmocka_unit_test(fini_runs_once_when_the_registry_is_freed),
      cmocka_unit_test_setup_teardown(wrong_abi_major_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(other_cuda_major_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(newer_abi_minor_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(oversized_descriptor_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(missing_symbol_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(name_file_mismatch_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(failing_init_is_refused_with_its_message, setup, teardown),
      cmocka_unit_test_setup_teardown(build_signature_mismatch_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(nonzero_reserved_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(duplicate_kind_is_refused_naming_both_files, setup, teardown),
      cmocka_unit_test_setup_teardown(malformed_kinds_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_file_names_and_missing_files, setup, teardown),
      cmocka_unit_test_setup_teardown(same_file_twice_is_one_load_a_namesake_is_refused, setup, teardown),
      cmocka_unit_test(init_always_gets_the_complete_host_table),
      cmocka_unit_test_setup_teardown(a_runtime_table_gets_a_working_register_kind, setup, teardown),
      cmocka_unit_test(two_registries_are_independent),
      cmocka_unit_test_setup_teardown(search_path_loads_a_folder_and_reports_the_first_refusal, setup, teardown),
      cmocka_unit_test_setup_teardown(environment_path_is_searched, setup, teardown),
      cmocka_unit_test_setup_teardown(spec_load_searches_the_configs_plugin_path, setup, teardown),
      cmocka_unit_test_setup_teardown(directly_added_kinds_are_checked, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
