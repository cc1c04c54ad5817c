/* fake-plugin.c — one source, many deliberately broken plugins for the
 * loader tests (the Vulkan loader's approach). meson builds it once per
 * FAKE_MODE as libspindle-FAKE_NAME.so; each mode breaks exactly one rule
 * of spindle/plugin.h, so a test that loads it proves that rule is
 * enforced and named. */
#include "spindle/plugin.h"

#include <stddef.h>

#define FAKE_GOOD 0
#define FAKE_ABI_MAJOR 1
#define FAKE_ABI_MINOR 2
#define FAKE_BIG_STRUCT 3
#define FAKE_NO_SYMBOL 4
#define FAKE_MISNAMED 5
#define FAKE_INIT_FAILS 6
#define FAKE_BAD_SIGNATURE 7
#define FAKE_DUP_KIND 8
#define FAKE_BAD_SCHEMA 9
#define FAKE_RESERVED 10
#define FAKE_IGNORES_REFUSAL 11
#define FAKE_SMALL_KIND 12
#define FAKE_WANTS_FULL_TABLE 13 /* not a broken rule: init refuses a partial host table */

#define CAT3_(a, b, c) a##b##c
#define CAT3(a, b, c) CAT3_(a, b, c)
#define STR_(x) #x
#define STR(x) STR_(x)

typedef struct fake_config {
  int64_t frames;
  char *label;
} fake_config_t;

__attribute__((unused)) static const spn_config_field_t fake_schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .offset = offsetof(fake_config_t, frames), .doc = "frames",
     .def_int = 3, .min = 0, .max = 100},
#if FAKE_MODE == FAKE_BAD_SCHEMA
    /* offset past the end of the config struct */
    {.key = "label", .type = SPN_CONFIG_STRING, .offset = sizeof(fake_config_t) + 8, .doc = "label"},
#else
    {.key = "label", .type = SPN_CONFIG_STRING, .offset = offsetof(fake_config_t, label), .doc = "label"},
#endif
    {0},
};

__attribute__((unused)) static const spn_port_t fake_out[] = {{.name = "video", .type = "video"}};

__attribute__((unused)) static int32_t fake_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) { return SPN_EOS; }

__attribute__((unused)) static int32_t fake_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                            spn_error_t *err) {
  return SPN_OK;
}

static int fini_calls;
SPN_PLUGIN_EXPORT int fake_fini_calls(void);
SPN_PLUGIN_EXPORT int fake_fini_calls(void) { return fini_calls; }
static void fake_fini(void *data) {
  (void)data;
  fini_calls++;
}

static int32_t fake_init(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err) {
#if FAKE_MODE == FAKE_WANTS_FULL_TABLE
  /* ABI 1.1: init gets the complete table, every member callable. */
  if (host->struct_size < sizeof *host)
    return spn_error_set(err, SPN_EABI, "host table of %u bytes, this plugin knows %zu", host->struct_size,
                         sizeof *host);
  for (size_t off = offsetof(spn_host_api_t, register_kind); off < sizeof *host; off += sizeof(void *)) {
    if (off >= offsetof(spn_host_api_t, reserved) && off < offsetof(spn_host_api_t, msg_clone))
      continue; /* the reserved slots */
    void *fn;
    memcpy(&fn, (const char *)host + off, sizeof fn);
    if (!fn)
      return spn_error_set(err, SPN_EABI, "host table member at offset %zu is NULL", off);
  }
#endif
#if FAKE_MODE == FAKE_INIT_FAILS
  return spn_error_set(err, SPN_EUNSUPPORTED, "no licence key found");
#else
  static spn_stage_kind_t kind = SPN_STAGE_KIND_INIT;
#if FAKE_MODE == FAKE_DUP_KIND
  kind.name = "fake_src"; /* the good plugin's kind */
#else
  kind.name = "fake_" STR(FAKE_NAME);
#endif
#if FAKE_MODE == FAKE_SMALL_KIND
  kind.struct_size = 16;
#endif
  kind.doc = "a fake source";
  kind.schema = fake_schema;
  kind.config_size = sizeof(fake_config_t);
  kind.outputs = fake_out;
  kind.n_outputs = 1;
  kind.generate = fake_generate;
  int32_t rc = host->register_kind(plugin, &kind, err);
#if FAKE_MODE == FAKE_IGNORES_REFUSAL
  (void)rc;
  static spn_stage_kind_t bad = SPN_STAGE_KIND_INIT;
  bad.name = "fake_no_generate"; /* a source without generate: refused */
  host->register_kind(plugin, &bad, err);
  return SPN_OK;
#else
  if (rc != SPN_OK)
    return rc;
#if FAKE_MODE == FAKE_GOOD
  static const spn_port_t in[] = {{.name = "in", .type = "any"}};
  static spn_stage_kind_t sink = SPN_STAGE_KIND_INIT;
  sink.name = "fake_sink";
  sink.inputs = in;
  sink.n_inputs = 1;
  sink.process = fake_process;
  rc = host->register_kind(plugin, &sink, err);
#endif
  return rc;
#endif
#endif
}

#if FAKE_MODE == FAKE_NO_SYMBOL
/* exports a descriptor under the wrong symbol name */
SPN_PLUGIN_DEFINE(something_else, .version = "1", .init = fake_init, .fini = fake_fini)
#else
SPN_PLUGIN_EXPORT const spn_plugin_desc_t *CAT3(spindle_plugin_, FAKE_NAME, _desc)(void);
SPN_PLUGIN_EXPORT const spn_plugin_desc_t *CAT3(spindle_plugin_, FAKE_NAME, _desc)(void) {
  static spn_plugin_desc_t desc = SPN_PLUGIN_DESC_INIT;
  desc.name = STR(FAKE_NAME);
  desc.version = "1.0";
  desc.license = "Apache-2.0";
  desc.init = fake_init;
  desc.fini = fake_fini;
#if FAKE_MODE == FAKE_ABI_MAJOR
  desc.abi_major = SPN_PLUGIN_ABI_MAJOR + 1;
#elif FAKE_MODE == FAKE_ABI_MINOR
  desc.abi_minor = SPN_PLUGIN_ABI_MINOR + 1;
#elif FAKE_MODE == FAKE_BIG_STRUCT
  desc.struct_size = sizeof(spn_plugin_desc_t) + 16;
#elif FAKE_MODE == FAKE_MISNAMED
  desc.name = "someone_else";
#elif FAKE_MODE == FAKE_BAD_SIGNATURE
  desc.sig_pointer_size = 4;
#elif FAKE_MODE == FAKE_RESERVED
  desc.reserved[3] = &desc;
#endif
  return &desc;
}
#endif
