/* convert.c — host-side tensor conversions for device backends: fp32 <->
 * fp16 (IEEE binary16, round to nearest even, with subnormals, infinities
 * and NaN kept) and NCHW <-> NHWC layout changes. Device backends convert
 * weights once at load with these; tests check them on the CPU. */
#include <string.h>

#include "engine-internal.h"

uint16_t spn_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (e == 0xff) /* inf, or NaN kept quiet with its top payload bit */
    return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
  int32_t he = (int32_t)e - 127 + 15;
  if (he >= 0x1f)
    return (uint16_t)(sign | 0x7c00u); /* overflow: inf */
  if (he <= 0) {
    if (he < -10)
      return (uint16_t)sign; /* below half the smallest subnormal: zero */
    /* Subnormal: shift the full mantissa (implicit 1 included) into place,
     * rounding to nearest even on the bits shifted out. */
    uint32_t m = man | 0x800000u;
    int shift = 14 - he;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
      h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)he << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
    h++; /* may carry into the exponent, up to inf: correct */
  return (uint16_t)(sign | h);
}

float spn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (man << 13);
  } else if (e == 0) {
    if (!man) {
      x = sign;
    } else { /* subnormal: normalise */
      int s = 0;
      while (!(man & 0x400u)) {
        man <<= 1;
        s++;
      }
      x = sign | ((uint32_t)(127 - 15 + 1 - s) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    x = sign | ((e - 15 + 127) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

void spn_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = spn_f32_to_f16(src[i]);
}

void spn_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = spn_f16_to_f32(src[i]);
}

void spn_nchw_to_nhwc(const void *src, void *dst, size_t es, int64_t N, int64_t C, int64_t HW) {
  const uint8_t *s = src;
  uint8_t *d = dst;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t i = 0; i < HW; i++)
        memcpy(d + (size_t)((n * HW + i) * C + c) * es, s + (size_t)((n * C + c) * HW + i) * es, es);
}

void spn_nhwc_to_nchw(const void *src, void *dst, size_t es, int64_t N, int64_t C, int64_t HW) {
  const uint8_t *s = src;
  uint8_t *d = dst;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t i = 0; i < HW; i++)
        memcpy(d + (size_t)((n * C + c) * HW + i) * es, s + (size_t)((n * HW + i) * C + c) * es, es);
}
