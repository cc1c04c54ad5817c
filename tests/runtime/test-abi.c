/* test-abi.c — the plugin ABI's layout, pinned. Every struct that crosses
 * the plugin boundary is checked for its size and the offset of every
 * member on LP64 (the offsets below are counted by hand from plugin.h and
 * tensor.h). A change that moves a member — instead of appending at the end
 * — fails to compile here, before a plugin built against the old header
 * reads garbage. The runtime tests check what the ..._INIT macros set. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "spindle/plugin.h"

#if UINTPTR_MAX == 0xffffffffffffffffu
#define AT(T, m, off) _Static_assert(offsetof(T, m) == (off), #T "." #m " moved")
#define SIZE(T, n) _Static_assert(sizeof(T) == (n), "sizeof(" #T ") changed")

SIZE(spn_tensor_t, 128);
AT(spn_tensor_t, struct_size, 0); AT(spn_tensor_t, dtype, 4); AT(spn_tensor_t, ndim, 8);
AT(spn_tensor_t, device_kind, 12); AT(spn_tensor_t, device_index, 16); AT(spn_tensor_t, reserved0, 20);
AT(spn_tensor_t, shape, 24); AT(spn_tensor_t, data, 88); AT(spn_tensor_t, reserved, 96);

SIZE(spn_envelope_t, 48);
AT(spn_envelope_t, struct_size, 0); AT(spn_envelope_t, flags, 4); AT(spn_envelope_t, job_id, 8);
AT(spn_envelope_t, stream, 16); AT(spn_envelope_t, reserved0, 20); AT(spn_envelope_t, seq, 24);
AT(spn_envelope_t, pts, 32); AT(spn_envelope_t, total, 40);

SIZE(spn_item_t, 168);
AT(spn_item_t, struct_size, 0); AT(spn_item_t, kind, 4); AT(spn_item_t, name, 8); AT(spn_item_t, tensor, 16);
AT(spn_item_t, buffer, 144); AT(spn_item_t, meta, 152); AT(spn_item_t, meta_size, 160);

SIZE(spn_face_t, 68);
AT(spn_face_t, score, 16); AT(spn_face_t, landmarks, 20); AT(spn_face_t, track_id, 60); AT(spn_face_t, reserved, 64);

SIZE(spn_config_field_t, 72);
AT(spn_config_field_t, key, 0); AT(spn_config_field_t, type, 8); AT(spn_config_field_t, flags, 12);
AT(spn_config_field_t, offset, 16); AT(spn_config_field_t, doc, 24); AT(spn_config_field_t, def_str, 32);
AT(spn_config_field_t, def_int, 40); AT(spn_config_field_t, def_float, 48); AT(spn_config_field_t, min, 56);
AT(spn_config_field_t, max, 64);

SIZE(spn_port_t, 16);

SIZE(spn_job_info_t, 32);
AT(spn_job_info_t, job_id, 8); AT(spn_job_info_t, config, 16); AT(spn_job_info_t, priority, 24);
AT(spn_job_info_t, reserved1, 28);

SIZE(spn_stage_kind_t, 240);
AT(spn_stage_kind_t, struct_size, 0); AT(spn_stage_kind_t, reserved0, 4); AT(spn_stage_kind_t, name, 8);
AT(spn_stage_kind_t, doc, 16); AT(spn_stage_kind_t, schema, 24); AT(spn_stage_kind_t, config_size, 32);
AT(spn_stage_kind_t, inputs, 40); AT(spn_stage_kind_t, n_inputs, 48); AT(spn_stage_kind_t, n_outputs, 52);
AT(spn_stage_kind_t, outputs, 56); AT(spn_stage_kind_t, device_need, 64); AT(spn_stage_kind_t, max_batch, 68);
AT(spn_stage_kind_t, max_delay_ms, 72); AT(spn_stage_kind_t, reserved1, 76); AT(spn_stage_kind_t, create, 80);
AT(spn_stage_kind_t, preload, 88); AT(spn_stage_kind_t, job_open, 96); AT(spn_stage_kind_t, generate, 104);
AT(spn_stage_kind_t, process, 112); AT(spn_stage_kind_t, flush, 120); AT(spn_stage_kind_t, job_close, 128);
AT(spn_stage_kind_t, destroy, 136); AT(spn_stage_kind_t, reserved, 144);
/* ABI 1.1: memory kinds and formats */
AT(spn_stage_kind_t, input_caps, 208); AT(spn_stage_kind_t, output_caps, 216); AT(spn_stage_kind_t, port_caps, 224);
AT(spn_stage_kind_t, flags, 232); /* appended after the first 1.1 layout (232 bytes), which still loads */

SIZE(spn_port_caps_t, 32);
AT(spn_port_caps_t, struct_size, 0); AT(spn_port_caps_t, mem_kinds, 4); AT(spn_port_caps_t, pixel_formats, 8);
AT(spn_port_caps_t, sample_formats, 12); AT(spn_port_caps_t, sample_rate, 16); AT(spn_port_caps_t, channels, 20);
AT(spn_port_caps_t, reserved, 24);
SIZE(spn_port_format_t, 32);
AT(spn_port_format_t, mem_kind, 4); AT(spn_port_format_t, pixel_format, 8); AT(spn_port_format_t, sample_format, 12);
AT(spn_port_format_t, sample_rate, 16); AT(spn_port_format_t, channels, 20); AT(spn_port_format_t, reserved, 24);

SIZE(spn_host_api_t, 480);
AT(spn_host_api_t, struct_size, 0); AT(spn_host_api_t, abi_major, 4); AT(spn_host_api_t, abi_minor, 8);
AT(spn_host_api_t, reserved0, 12); AT(spn_host_api_t, register_kind, 16); AT(spn_host_api_t, plugin_set_data, 24);
AT(spn_host_api_t, stage_get_data, 32); AT(spn_host_api_t, stage_get_name, 40);
AT(spn_host_api_t, stage_get_device, 48); AT(spn_host_api_t, stage_get_stream, 56);
AT(spn_host_api_t, stage_get_threads, 64); AT(spn_host_api_t, log, 72); AT(spn_host_api_t, progress, 80);
AT(spn_host_api_t, fail_job, 88); AT(spn_host_api_t, job_cancelled, 96); AT(spn_host_api_t, buffer_new, 104);
AT(spn_host_api_t, buffer_data, 112); AT(spn_host_api_t, buffer_size, 120); AT(spn_host_api_t, buffer_ref, 128);
AT(spn_host_api_t, buffer_unref, 136); AT(spn_host_api_t, msg_new, 144); AT(spn_host_api_t, msg_new_from, 152);
AT(spn_host_api_t, msg_free, 160); AT(spn_host_api_t, msg_envelope, 168); AT(spn_host_api_t, msg_item_count, 176);
AT(spn_host_api_t, msg_item, 184); AT(spn_host_api_t, msg_find, 192); AT(spn_host_api_t, msg_add_tensor, 200);
AT(spn_host_api_t, msg_add_meta, 208); AT(spn_host_api_t, emit, 216); AT(spn_host_api_t, model_load, 224);
AT(spn_host_api_t, model_release, 232); AT(spn_host_api_t, model_io_count, 240); AT(spn_host_api_t, model_io, 248);
AT(spn_host_api_t, model_run, 256); AT(spn_host_api_t, model_free_outputs, 264); AT(spn_host_api_t, reserved, 272);
/* ABI 1.1: host access and helpers */
AT(spn_host_api_t, msg_clone, 400); AT(spn_host_api_t, msg_replace_tensor, 408);
AT(spn_host_api_t, msg_replace_meta, 416);

SIZE(spn_stage_head_t, 16);
AT(spn_stage_head_t, struct_size, 0); AT(spn_stage_head_t, reserved0, 4); AT(spn_stage_head_t, host, 8);
/* ABI 1.1: memory kinds and formats */
AT(spn_host_api_t, buffer_new_kind, 424); AT(spn_host_api_t, buffer_mem_kind, 432);
AT(spn_host_api_t, buffer_device, 440); AT(spn_host_api_t, buffer_set_ready, 448);
AT(spn_host_api_t, buffer_event, 456); AT(spn_host_api_t, stage_port_format, 464);
/* ABI 1.1: counted copies */
AT(spn_host_api_t, buffer_copy, 472);

SIZE(spn_plugin_desc_t, 128);
AT(spn_plugin_desc_t, struct_size, 0); AT(spn_plugin_desc_t, abi_major, 4); AT(spn_plugin_desc_t, abi_minor, 8);
AT(spn_plugin_desc_t, sig_pointer_size, 12); AT(spn_plugin_desc_t, sig_cuda_major, 16);
AT(spn_plugin_desc_t, reserved0, 20); AT(spn_plugin_desc_t, name, 24); AT(spn_plugin_desc_t, version, 32);
AT(spn_plugin_desc_t, license, 40); AT(spn_plugin_desc_t, init, 48); AT(spn_plugin_desc_t, fini, 56);
AT(spn_plugin_desc_t, reserved, 64);
#endif

/* The loader reads struct_size/abi_major/abi_minor of a descriptor from any
 * ABI version at these offsets: they may never move, whatever the width. */
_Static_assert(offsetof(spn_plugin_desc_t, abi_major) == 4 && offsetof(spn_plugin_desc_t, abi_minor) == 8,
               "descriptor version fields moved");

static void init_macros_fill_what_the_loader_checks(void **state) {
  (void)state;
  spn_plugin_desc_t d = SPN_PLUGIN_DESC_INIT;
  assert_int_equal(d.struct_size, sizeof d);
  assert_int_equal(d.abi_major, SPN_PLUGIN_ABI_MAJOR);
  assert_int_equal(d.abi_minor, SPN_PLUGIN_ABI_MINOR);
  assert_int_equal(d.sig_pointer_size, sizeof(void *));
  assert_int_equal(d.sig_cuda_major, 0);
  assert_null(d.name);
  spn_stage_kind_t k = SPN_STAGE_KIND_INIT;
  assert_int_equal(k.struct_size, sizeof k);
  assert_int_equal(k.device_need, SPN_NEED_CPU);
  assert_int_equal(k.max_batch, 1);
  for (size_t i = 0; i < 8; i++)
    assert_null(k.reserved[i]);
  /* ABI 1.1: SPN_STAGE_KIND fills struct_size and keeps what it is given. */
  static int32_t (*const proc)(spn_stage_t *, void *, spn_msg_t **, void **, size_t, spn_error_t *) = NULL;
  spn_stage_kind_t k11 = SPN_STAGE_KIND(.name = "k", .max_batch = 4, .process = proc);
  assert_int_equal(k11.struct_size, sizeof k11);
  assert_string_equal(k11.name, "k");
  assert_int_equal(k11.max_batch, 4);
  assert_int_equal(k11.device_need, 0); /* the host reads 0 as SPN_NEED_CPU */
  assert_int_equal(SPN_PLUGIN_ABI_MINOR, 1);
  spn_tensor_t t = SPN_TENSOR_INIT;
  assert_int_equal(t.struct_size, sizeof t);
}

static int32_t fake_copy(spn_stage_t *s, uint64_t job, spn_buffer_t *d, size_t doff, spn_buffer_t *src, size_t soff,
                         size_t n, spn_error_t *err) {
  (void)s, (void)job, (void)d, (void)doff, (void)src, (void)soff, (void)n, (void)err;
  return SPN_OK;
}

/* A plugin built against this header, on a host whose table ends before
 * buffer_copy (an earlier 1.1 host), must see it missing. */
static void a_table_that_ends_before_a_member_does_not_have_it(void **state) {
  (void)state;
  spn_host_api_t h;
  memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  assert_false(SPN_HOST_HAS(&h, buffer_copy)); /* present but NULL */
  h.buffer_copy = fake_copy;
  assert_true(SPN_HOST_HAS(&h, buffer_copy));
  h.struct_size = offsetof(spn_host_api_t, buffer_copy); /* the table before it was appended */
  assert_false(SPN_HOST_HAS(&h, buffer_copy));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(init_macros_fill_what_the_loader_checks),
      cmocka_unit_test(a_table_that_ends_before_a_member_does_not_have_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
