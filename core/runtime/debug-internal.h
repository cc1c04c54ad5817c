/* debug-internal.h — back-end entry points for tests and benchmarks.
 *
 * Hidden like every spn__ name (libspindle exports only its public spn_ API;
 * tests/runtime/test-exports.py checks it): tests and benchmarks that
 * instantiate pipelines from specs built in C or read the runtime's debug
 * counters link the library's objects (extract_all_objects). Never installed. */
#ifndef SPINDLE_DEBUG_INTERNAL_H
#define SPINDLE_DEBUG_INTERNAL_H

#include "spec-internal.h"
#include "spindle/device.h"

/* Instantiate a validated spec. take_spec: the pipeline frees it with
 * spn__spec_free; otherwise the caller keeps it alive until
 * spn_pipeline_free. Ownership: caller owns *out. Thread: any. */
int32_t spn__pipeline_new_from_spec(spn_runtime_t *rt, spn__pipeline_spec_t *spec, bool take_spec,
                                    spn_pipeline_t **out, spn_error_t *err);
/* Largest number of counted messages ever in flight on one link into stage
 * `to_stage` (index in the spec); *capacity gets the links' bound. */
int64_t spn__pipeline_max_in_flight(spn_pipeline_t *pipe, uint32_t to_stage, uint32_t *capacity);
/* Messages that reached stage `stage` ahead of their seq and waited in its
 * re-ordering buffer (all replicas). */
int64_t spn__pipeline_reordered(spn_pipeline_t *pipe, uint32_t stage);
/* Number of replicas (actors) of a stage. */
uint32_t spn__pipeline_replicas(spn_pipeline_t *pipe, uint32_t stage);
/* Device i of the runtime (NULL past the end). Ownership: borrowed. */
spn_device_t *spn__runtime_device(spn_runtime_t *rt, uint32_t i);
/* Test hook: watch the runtime's devices (emulated cpu:N ones too) with the
 * NVML library at `nvml_lib` (a fake one in tests), device i known by
 * bus_ids[i] (NULL: not watched), polled every interval_ms on the loop. A
 * device it reports unhealthy is quarantined as a GPU would be. Refused
 * (SPN_EEXIST) when the runtime already watches (it has CUDA devices and
 * NVML). Thread: any, before the first job that should see it. */
int32_t spn__runtime_watch_health(spn_runtime_t *rt, const char *nvml_lib, const char *const *bus_ids,
                                  uint32_t interval_ms, spn_error_t *err);
/* The host table plugins get from this runtime. */
const spn_host_api_t *spn__runtime_host_api(spn_runtime_t *rt);

#endif
