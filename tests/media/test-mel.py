#!/usr/bin/env python3
"""The Wav2Lip mel spectrogram (spn-audio, via mel-dump) against a NumPy
reference written here from the definitions: pre-emphasis, reflect-padded
centred STFT with a periodic Hann window, Slaney mel filterbank (librosa's
formula, htk=False, norm='slaney'), Wav2Lip's level normalisation.

Usage: test-mel.py MEL-DUMP [WAV ...]   (16-bit PCM WAVs at 16 kHz mono)
Fails when the max abs error exceeds 1e-3 on any signal.
"""
import os
import subprocess
import sys
import tempfile
import wave

import numpy as np

SR, N_FFT, HOP, WIN, N_MELS, FMIN, FMAX = 16000, 800, 200, 800, 80, 55.0, 7600.0


def hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-12) / min_log_hz) / logstep, f / f_sp)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank():
    fftfreqs = np.linspace(0, SR / 2, 1 + N_FFT // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(FMIN), hz_to_mel(FMAX), N_MELS + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    weights = np.zeros((N_MELS, len(fftfreqs)))
    for i in range(N_MELS):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:N_MELS + 2] - mel_f[:N_MELS]))[:, None]
    return weights


def reference(x):
    x = x.astype(np.float64)
    y = np.concatenate([x[:1], x[1:] - 0.97 * x[:-1]])
    yp = np.pad(y, N_FFT // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN) / WIN)  # periodic Hann
    n_frames = 1 + len(y) // HOP
    frames = np.stack([yp[i * HOP:i * HOP + N_FFT] * window for i in range(n_frames)], axis=1)
    mag = np.abs(np.fft.rfft(frames, axis=0))
    m = mel_filterbank() @ mag
    s = 20 * np.log10(np.maximum(1e-5, m)) - 20
    out = np.clip((2 * 4.0) * ((s - -100) / 100) - 4.0, -4.0, 4.0)
    # the short form given in spindle/audio.h must be the same function
    short = np.clip(1.6 * np.log10(np.maximum(1e-5, m)) + 2.4, -4, 4)
    assert np.max(np.abs(out - short)) < 1e-9, "the two forms of the normalisation disagree"
    return out


def read_wav(path):
    with wave.open(path, "rb") as w:
        assert w.getframerate() == SR and w.getnchannels() == 1 and w.getsampwidth() == 2, path
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def signals(wavs):
    rng = np.random.default_rng(1234)
    t = np.arange(int(SR * 2.37)) / SR  # odd length: not a multiple of the hop
    tones = 0.4 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1375.5 * t) \
        + 0.1 * np.sin(2 * np.pi * 6100 * t)
    yield "tones+noise", (tones + 0.05 * rng.standard_normal(len(t))).astype(np.float32)
    sweep = 0.5 * np.sin(2 * np.pi * (100 * t + 1500 * t * t))
    yield "chirp+quiet noise", (sweep + 0.001 * rng.standard_normal(len(t))).astype(np.float32)
    silence = np.zeros(SR // 2, dtype=np.float32)
    silence[4000:4100] = 0.9  # a click in silence: exercises the -4 floor
    yield "click in silence", silence
    for w in wavs:
        yield os.path.basename(w), read_wav(w)


def main():
    dump, wavs = sys.argv[1], sys.argv[2:]
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        for name, x in signals(wavs):
            inp, outp = os.path.join(d, "in.f32"), os.path.join(d, "out.f32")
            x.astype("<f4").tofile(inp)
            subprocess.run([dump, inp, outp], check=True, timeout=60)
            got = np.fromfile(outp, dtype="<f4")
            ref = reference(x)
            assert got.size == ref.size, f"{name}: {got.size} values, expected {ref.shape}"
            got = got.reshape(ref.shape)
            err = float(np.max(np.abs(got - ref)))
            print(f"# {name}: {len(x)} samples, {ref.shape[1]} frames, "
                  f"range [{ref.min():.2f}, {ref.max():.2f}], max |err| = {err:.2e}")
            worst = max(worst, err)
            if err > 1e-3:
                print(f"FAIL {name}: max abs error {err} > 1e-3")
                return 1
    print(f"# worst max |err| = {worst:.2e} (limit 1e-3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
