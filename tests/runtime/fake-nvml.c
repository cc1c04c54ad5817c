/* fake-nvml.c — a stand-in for libnvidia-ml.so.1 with the entry points the
 * GPU health monitor uses, so its NVML path is tested without a GPU.
 *
 * Devices are known by the bus ids "0000:0N:00.0" for N = 1..4. The test
 * drives it through fake_nvml_push_xid (queue a critical-XID event) and
 * fake_nvml_set_lost (the device answers "GPU is lost"), and checks
 * fake_nvml_inits (init/shutdown balance) and fake_nvml_registered;
 * fake_nvml_reset heals every device and empties the event queue. State is
 * process-global: it is a test double for a process-global library. */
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  int index;
  int lost;
  int registered;
} fake_dev_t;

typedef struct {
  void *device;
  unsigned long long type, data;
  unsigned gpu_instance, compute_instance;
} fake_event_t;

static fake_dev_t devs[4] = {{1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}};
static fake_event_t queue[16];
static int q_head, q_len, inits, set_token;

EXPORT unsigned nvmlInit_v2(void);
EXPORT unsigned nvmlShutdown(void);
EXPORT unsigned nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev);
EXPORT unsigned nvmlEventSetCreate(void **set);
EXPORT unsigned nvmlDeviceRegisterEvents(void *dev, unsigned long long types, void *set);
EXPORT unsigned nvmlEventSetWait_v2(void *set, fake_event_t *data, unsigned timeout_ms);
EXPORT unsigned nvmlEventSetFree(void *set);
EXPORT unsigned nvmlDeviceGetMinorNumber(void *dev, unsigned *minor);
EXPORT void fake_nvml_push_xid(int n, unsigned long long xid);
EXPORT void fake_nvml_set_lost(int n);
EXPORT int fake_nvml_inits(void);
EXPORT int fake_nvml_registered(int n);
EXPORT void fake_nvml_reset(void);

unsigned nvmlInit_v2(void) {
  inits++;
  return 0;
}
unsigned nvmlShutdown(void) {
  inits--;
  return 0;
}
unsigned nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev) {
  for (int i = 0; i < 4; i++) {
    char want[16] = "0000:0N:00.0";
    want[6] = (char)('0' + devs[i].index);
    if (!strcmp(bus, want)) {
      *dev = &devs[i];
      return 0;
    }
  }
  return 6; /* NVML_ERROR_NOT_FOUND */
}
unsigned nvmlEventSetCreate(void **set) {
  *set = &set_token;
  return 0;
}
unsigned nvmlDeviceRegisterEvents(void *dev, unsigned long long types, void *set) {
  if (set != &set_token || types != 8)
    return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  ((fake_dev_t *)dev)->registered = 1;
  return 0;
}
unsigned nvmlEventSetWait_v2(void *set, fake_event_t *data, unsigned timeout_ms) {
  (void)timeout_ms;
  if (set != &set_token)
    return 2;
  if (!q_len)
    return 10; /* NVML_ERROR_TIMEOUT */
  *data = queue[q_head];
  q_head = (q_head + 1) % 16;
  q_len--;
  return 0;
}
unsigned nvmlEventSetFree(void *set) { return set == &set_token ? 0 : 2; }
unsigned nvmlDeviceGetMinorNumber(void *dev, unsigned *minor) {
  fake_dev_t *d = dev;
  if (d->lost)
    return 15; /* NVML_ERROR_GPU_IS_LOST */
  *minor = (unsigned)d->index;
  return 0;
}
void fake_nvml_push_xid(int n, unsigned long long xid) {
  fake_event_t ev = {&devs[n - 1], 8, xid, 0, 0};
  queue[(q_head + q_len) % 16] = ev;
  q_len++;
}
void fake_nvml_set_lost(int n) { devs[n - 1].lost = 1; }
int fake_nvml_inits(void) { return inits; }
int fake_nvml_registered(int n) { return devs[n - 1].registered; }
void fake_nvml_reset(void) {
  for (int i = 0; i < 4; i++)
    devs[i].lost = devs[i].registered = 0;
  q_head = q_len = 0;
}
