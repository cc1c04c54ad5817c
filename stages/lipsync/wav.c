/* wav.c — RIFF/WAVE parsing to mono float, and a windowed-sinc resampler.
 *
 * The parser trusts nothing in the file: every read is checked against the
 * bytes left, sizes are 64-bit before they are added, and a chunk that runs
 * past the end is an error (except the data chunk, see wav.h). Chunks other
 * than "fmt " and "data" are skipped. The resampler precomputes one row of
 * filter taps per phase of the rate ratio (in/out reduced by their gcd), so
 * the inner loop is a dot product; the taps come from a Kaiser-windowed sinc
 * (beta 8.6) whose cut-off is the lower of the two Nyquist frequencies.
 */
#include "wav.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

enum { WAV_PCM = 1, WAV_FLOAT = 3, WAV_EXTENSIBLE = 0xFFFE };

int32_t spn_wav_parse(const uint8_t *d, size_t len, const char *name, spn_wav_t *out, spn_error_t *err) {
  memset(out, 0, sizeof *out);
  if (!name)
    name = "wav";
  if (len < 12 || memcmp(d, "RIFF", 4) != 0 || memcmp(d + 8, "WAVE", 4) != 0)
    return spn_error_set(err, SPN_EMEDIA,
                         "%s: byte 0: not a RIFF/WAVE file (the speech is read as WAV: PCM or float; make one with "
                         "`ffmpeg -i FILE -vn -ac 1 -ar 16000 speech.wav`)",
                         name);
  bool have_fmt = false, have_data = false;
  uint16_t tag = 0, channels = 0, bits = 0, align = 0;
  uint32_t rate = 0;
  size_t data_off = 0, data_len = 0, fmt_off = 0;
  size_t pos = 12;
  while (pos + 8 <= len && !(have_fmt && have_data)) {
    const uint8_t *c = d + pos;
    uint64_t size = rd32(c + 4);
    size_t body = pos + 8;
    if (memcmp(c, "data", 4) == 0) {
      have_data = true;
      data_off = body;
      data_len = size <= len - body ? (size_t)size : len - body; /* streamed files: to the end */
    } else {
      if (size > len - body)
        return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: chunk \"%.4s\" of %llu bytes runs past the end (%zu)",
                             name, pos, (const char *)c, (unsigned long long)size, len);
      if (memcmp(c, "fmt ", 4) == 0) {
        if (size < 16)
          return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: fmt chunk of %llu bytes (at least 16)", name, pos,
                               (unsigned long long)size);
        const uint8_t *f = d + body;
        fmt_off = body;
        tag = rd16(f);
        channels = rd16(f + 2);
        rate = rd32(f + 4);
        align = rd16(f + 12);
        bits = rd16(f + 14);
        if (tag == WAV_EXTENSIBLE) {
          if (size < 40)
            return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: extensible fmt chunk of %llu bytes (at least 40)",
                                 name, pos, (unsigned long long)size);
          tag = rd16(f + 24); /* the sub-format GUID starts with the format tag */
        }
        have_fmt = true;
      }
    }
    if (have_data && !have_fmt)
      return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: data chunk before the fmt chunk", name, pos);
    pos = body + (size_t)size + (size & 1); /* chunks are padded to even sizes */
    if (pos < body)
      break;
  }
  if (!have_fmt)
    return spn_error_set(err, SPN_EMEDIA, "%s: no fmt chunk", name);
  if (!have_data)
    return spn_error_set(err, SPN_EMEDIA, "%s: no data chunk", name);
  if (tag != WAV_PCM && tag != WAV_FLOAT)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: byte %zu: format tag %u (only PCM 1 and IEEE float 3)", name,
                         fmt_off, tag);
  bool ok_bits = tag == WAV_PCM ? (bits == 8 || bits == 16 || bits == 24 || bits == 32) : (bits == 32 || bits == 64);
  if (!ok_bits)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: byte %zu: %u bits per %s sample", name, fmt_off + 14, bits,
                         tag == WAV_PCM ? "integer" : "float");
  if (channels < 1 || channels > 256)
    return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: %u channels", name, fmt_off + 2, channels);
  if (rate < 1 || rate > 1000000)
    return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: sample rate %u Hz", name, fmt_off + 4, rate);
  if (align != (uint32_t)channels * bits / 8)
    return spn_error_set(err, SPN_EMEDIA, "%s: byte %zu: block align %u, want %u channels x %u bits", name,
                         fmt_off + 12, align, channels, bits);
  size_t n = data_len / align;
  float *s = malloc((n ? n : 1) * sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory for %zu samples", name, n);
  const uint8_t *p = d + data_off;
  const size_t bps = bits / 8;
  for (size_t i = 0; i < n; i++) {
    double acc = 0;
    for (uint16_t ch = 0; ch < channels; ch++, p += bps) {
      double v;
      if (tag == WAV_FLOAT) {
        if (bits == 32) {
          float f;
          memcpy(&f, p, 4);
          v = f;
        } else {
          double g;
          memcpy(&g, p, 8);
          v = g;
        }
      } else if (bits == 8) {
        v = ((int)p[0] - 128) / 128.0;
      } else if (bits == 16) {
        v = (int16_t)rd16(p) / 32768.0;
      } else if (bits == 24) {
        int32_t x = (int32_t)((uint32_t)p[0] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 24) >> 8;
        v = x / 8388608.0;
      } else {
        v = (int32_t)rd32(p) / 2147483648.0;
      }
      acc += v;
    }
    s[i] = (float)(acc / channels);
  }
  out->sample_rate = (int32_t)rate;
  out->channels = channels;
  out->bits = bits;
  out->n = (int64_t)n;
  out->samples = s;
  return SPN_OK;
}

int32_t spn_wav_read(const char *path, spn_wav_t *out, spn_error_t *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f)
    return spn_error_set(err, errno == ENOENT ? SPN_ENOENT : SPN_EIO, "%s: %s", path, strerror(errno));
  int32_t rc = SPN_OK;
  uint8_t *buf = NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    rc = spn_error_set(err, SPN_EIO, "%s: cannot seek: %s", path, strerror(errno));
    goto out_file;
  }
  long sz = ftell(f);
  if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
    rc = spn_error_set(err, SPN_EIO, "%s: cannot size the file: %s", path, strerror(errno));
    goto out_file;
  }
  buf = malloc(sz ? (size_t)sz : 1);
  if (!buf) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for %ld bytes", path, sz);
    goto out_file;
  }
  if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    rc = spn_error_set(err, SPN_EIO, "%s: short read", path);
    goto out_buf;
  }
  rc = spn_wav_parse(buf, (size_t)sz, path, out, err);
out_buf:
  free(buf);
out_file:
  fclose(f);
  return rc;
}

void spn_wav_release(spn_wav_t *w) {
  if (!w)
    return;
  free(w->samples);
  memset(w, 0, sizeof *w);
}

/* Modified Bessel function of the first kind, order 0 (power series). */
static double bessel_i0(double x) {
  double sum = 1.0, term = 1.0, q = x * x / 4.0;
  for (int k = 1; k < 64; k++) {
    term *= q / ((double)k * k);
    sum += term;
    if (term < sum * 1e-17)
      break;
  }
  return sum;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int32_t spn_audio_resample(const float *in, int64_t n, int32_t in_rate, int32_t out_rate, float **out,
                           int64_t *n_out, spn_error_t *err) {
  *out = NULL;
  *n_out = 0;
  if (in_rate <= 0 || out_rate <= 0 || n < 0 || (n && !in))
    return spn_error_set(err, SPN_EINVAL, "resample: rates %d -> %d Hz, %lld samples", in_rate, out_rate,
                         (long long)n);
  int64_t m = n * out_rate / in_rate;
  float *o = malloc((m ? (size_t)m : 1) * sizeof *o);
  if (!o)
    return spn_error_set(err, SPN_ENOMEM, "resample: out of memory for %lld samples", (long long)m);
  if (in_rate == out_rate) {
    if (n)
      memcpy(o, in, (size_t)n * sizeof *o);
    *out = o;
    *n_out = n;
    return SPN_OK;
  }
  const double fc = out_rate < in_rate ? (double)out_rate / in_rate : 1.0; /* cut-off, input Nyquist = 1 */
  const int64_t half = (int64_t)ceil(32.0 / fc);                           /* taps a side */
  const int64_t taps = 2 * half;
  const int64_t g = gcd64(in_rate, out_rate);
  const int64_t P = out_rate / g; /* phases: output j and j + P share their fraction */
  if (P > 100000 || (double)P * (double)taps > 2e8) {
    free(o);
    return spn_error_set(err, SPN_EUNSUPPORTED, "resample: %d -> %d Hz needs %lld filter phases", in_rate, out_rate,
                         (long long)P);
  }
  double *w = malloc((size_t)(P * taps) * sizeof *w);
  if (!w) {
    free(o);
    return spn_error_set(err, SPN_ENOMEM, "resample: out of memory for the filter");
  }
  const double beta = 8.6, i0b = bessel_i0(beta);
  for (int64_t p = 0; p < P; p++) {
    double frac = (double)((p * in_rate) % out_rate) / out_rate;
    for (int64_t k = 0; k < taps; k++) {
      double x = (double)(k - half + 1) - frac; /* tap k reads in[base + k - half + 1] */
      double r = x / half;
      double win = fabs(r) >= 1.0 ? 0.0 : bessel_i0(beta * sqrt(1.0 - r * r)) / i0b;
      double a = M_PI * fc * x;
      double sinc = fabs(a) < 1e-12 ? 1.0 : sin(a) / a;
      w[p * taps + k] = fc * sinc * win;
    }
  }
  for (int64_t j = 0; j < m; j++) {
    int64_t base = j * in_rate / out_rate;
    const double *wp = w + (j % P) * taps;
    int64_t first = base - half + 1;
    double acc = 0;
    int64_t k0 = first < 0 ? -first : 0;
    int64_t k1 = first + taps > n ? n - first : taps;
    for (int64_t k = k0; k < k1; k++)
      acc += wp[k] * in[first + k];
    o[j] = (float)acc;
  }
  free(w);
  *out = o;
  *n_out = m;
  return SPN_OK;
}
