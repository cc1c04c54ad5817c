/* fake-internal.h — what the fake CUDA runtime (cuda-fake.cpp) shares with
 * the fake cuDNN and cuBLASLt (cudnn-fake.cpp, cublaslt-fake.cpp): work
 * handed to a stream, and a check that a pointer is "device" memory.
 * Test code only (tests/gpu/host-emu/README). */
#ifndef SPN_TEST_FAKE_INTERNAL_H
#define SPN_TEST_FAKE_INTERNAL_H

#include <stddef.h>

#include <functional>

#include <cuda_runtime_api.h>

/* Run fn on stream s: at once, or, while s captures a CUDA Graph, at each
 * launch of that graph (what fn reads and writes is read then). */
void spn_emu_stream_do(cudaStream_t s, std::function<void()> fn);

/* Whether s is the null/legacy/per-thread stream or one made and not yet
 * destroyed. */
bool spn_emu_stream_alive(cudaStream_t s);

/* Whether [p, p + n) lies in one device allocation made by the fake (or
 * n == 0 and p is in one). */
bool spn_emu_is_device(const void *p, size_t n);

/* One line on stderr naming a misuse the real library would refuse (the
 * call then fails as it would). */
void spn_emu_complain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
