/* A stand-in for libnvidia-ml.so.1 with the query entry points the gateway's
 * metrics read (core/jobs/observe.c): two devices whose utilisation, memory
 * in use and temperature change on every read, so a scrape test can see the
 * device families move without a GPU. Loaded through $SPINDLE_NVML_LIBRARY. */
#include <stdatomic.h>

typedef struct {
  unsigned gpu, memory;
} util_t;
typedef struct {
  unsigned long long total, free, used;
} mem_t;

static int devs[2];
static atomic_uint reads;

__attribute__((visibility("default"))) unsigned nvmlInit_v2(void) { return 0; }
__attribute__((visibility("default"))) unsigned nvmlShutdown(void) { return 0; }
__attribute__((visibility("default"))) unsigned nvmlDeviceGetCount_v2(unsigned *n) {
  *n = 2;
  return 0;
}
__attribute__((visibility("default"))) unsigned nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
  if (i >= 2)
    return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *h = &devs[i];
  return 0;
}
__attribute__((visibility("default"))) unsigned nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
  unsigned r = atomic_fetch_add(&reads, 1);
  u->gpu = (unsigned)(10 * (1 + (int *)h - devs) + r % 50);
  u->memory = u->gpu / 2;
  return 0;
}
__attribute__((visibility("default"))) unsigned nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  unsigned r = atomic_fetch_add(&reads, 1);
  m->total = 16ULL << 30;
  m->used = (1ULL << 30) + (unsigned long long)r * (1 << 20) + (unsigned long long)((int *)h - devs);
  m->free = m->total - m->used;
  return 0;
}
__attribute__((visibility("default"))) unsigned nvmlDeviceGetTemperature(void *h, unsigned sensor, unsigned *t) {
  if (sensor != 0)
    return 2;
  *t = 40 + (unsigned)((int *)h - devs) + atomic_fetch_add(&reads, 1) % 30;
  return 0;
}
