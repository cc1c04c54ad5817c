#!/usr/bin/env python3
"""configs/lipsync.toml's detect-and-sync part on a GPU against the CPU,
frame by frame, at the crop (suite gpu).

  test-lipsync-crop-gpu.py SPINDLE MAKE_MODEL_SCRIPT SOURCE_ROOT

The issue's bar for lipsync: within 2 levels inside the crop, identical
outside. configs/lipsync.toml is cut after its lipsync stage (the superres
after it changes every pixel; enhance-gpu and lipsync-pipeline-gpu hold the
whole files to PSNR >= 40 dB) and given three sinks: the synced frames, the
decoded frames and the faces (metasink). It runs with --devices cpu and with
--devices cuda (SPINDLE_TEST_GPU_DEVICES overrides the second, e.g. "cpu" to
check the test itself), with the detector and Wav2Lip at fp32 on both, and
software decode on both (so that "identical outside" holds to the byte:
NVDEC's RGB is the CPU decode's within 1 level, which media-gpu checks).
Per frame:
  - the GPU's faces are the CPU's within 0.05 px;
  - outside the CPU's crop (the smoothed box rounded, plus Wav2Lip's pads,
    grown by 1 px for a box rounding the other way on the GPU) both outputs
    equal the decoded frame byte for byte;
  - inside it the GPU's output is within 2 levels of the CPU's;
and most frames were synced (differ from the decoded frame in the crop), so
the comparison is not between two untouched copies.
Exits 77 without a CUDA device or without the onnx package.
SPINDLE_TEST_DURATION shortens the 2 s of video (the runs on the fake GPU of
tests/gpu/host-emu, whose convolutions are naive loops).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np


def derive(config, out):
    text = open(config).read()
    cut = text.index('[[stage]]\nname = "sr"')
    head = text[:cut]
    head = re.sub(r'(?m)^video = "encode\.path"\n', '', head)
    head = re.sub(r'(?m)^soundtrack = .*"encode\.audio_path".*\n', '', head)
    assert '"encode.' not in head, 'the cut config still names the encoder'
    head = head.replace('"../', '"' + os.path.dirname(os.path.dirname(os.path.abspath(config))) + '/')
    head += ('[[stage]]\nname = "synced"\nkind = "filesink"\ninputs = ["lips.video"]\n\n'
             '[[stage]]\nname = "decoded"\nkind = "filesink"\ninputs = ["decode.video"]\n\n'
             '[[stage]]\nname = "boxes"\nkind = "metasink"\ninputs = ["faces.faces"]\n')
    open(out, 'w').write(head)
    pads = {k: int(re.search(rf'(?m)^pad_{k} = (\d+)', text).group(1)) for k in ('top', 'bottom', 'left', 'right')}
    return pads


def main():
    spindle, script, src = sys.argv[1], sys.argv[2], sys.argv[3]
    gpu = os.environ.get('SPINDLE_TEST_GPU_DEVICES', 'cuda')
    duration = os.environ.get('SPINDLE_TEST_DURATION', '2')
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, 'w2l.onnx')
        r = subprocess.run([sys.executable, script, model, '--arch', 'wav2lip', '--width', '0.25'],
                           stdout=subprocess.DEVNULL)
        if r.returncode == 77:
            print('skip: no onnx package')
            return 77
        assert r.returncode == 0, 'model generation failed'
        cfg = os.path.join(tmp, 'cut.toml')
        pads = derive(os.path.join(src, 'configs', 'lipsync.toml'), cfg)
        res = {}
        for side, dev in (('gpu', gpu), ('cpu', 'cpu')):
            d = os.path.join(tmp, side)
            os.makedirs(d)
            args = [spindle, 'run', cfg, '--devices', dev, '--set', f'decode.duration={duration}', '--set',
                    f'lips.model={model}', '--set', 'faces.precision=fp32', '--set', 'lips.precision=fp32',
                    '--set', 'decode.hwaccel=none', '--set', f'synced.path={d}/synced.rgb', '--set',
                    f'decoded.path={d}/decoded.rgb', '--set', f'boxes.path={d}/faces.jsonl', '--log-format', 'json']
            r = subprocess.run(args, capture_output=True, text=True, timeout=500)
            if side == 'gpu' and r.returncode != 0 and re.search(
                    r'no CUDA device|CUDA engine backend is not built', r.stderr):
                print('skip: no CUDA device')
                return 77
            assert r.returncode == 0, f'{side} ({dev}): exit {r.returncode}\n{r.stderr[-3000:]}'
            summary = json.loads(r.stdout.strip().splitlines()[-1])
            faces = [json.loads(l) for l in open(f'{d}/faces.jsonl')]
            res[side] = (summary, faces, np.fromfile(f'{d}/synced.rgb', np.uint8),
                         np.fromfile(f'{d}/decoded.rgb', np.uint8))
        (sg, fg, og, dg), (sc, fc, oc, dc) = res['gpu'], res['cpu']
        n = sc['frames']
        assert n and sg['frames'] == n, f"frames: gpu {sg['frames']}, cpu {n}"
        assert og.size == oc.size == dg.size == dc.size and oc.size % n == 0, 'output sizes differ'
        assert np.array_equal(dg, dc), 'the two software decodes differ'
        W = H = int(round((oc.size // n // 3) ** 0.5))
        assert W * H * 3 * n == oc.size, 'frames are not square (the sample is 320x320)'
        og, oc, dec = (a.reshape(n, H, W, 3).astype(np.int16) for a in (og, oc, dc))
        assert len(fg) == len(fc) == n, f'face lines: gpu {len(fg)}, cpu {len(fc)}'
        synced = worst = 0
        for i in range(n):
            a, b = fc[i]['faces'], fg[i]['faces']
            assert len(a) == len(b), f'frame {i}: {len(b)} faces on the GPU, {len(a)} on the CPU'
            for p, q in zip(a, b):
                diff = max(abs(x - y) for x, y in zip(p['box'], q['box']))
                assert diff < 0.05, f'frame {i}: boxes {q["box"]} (gpu) vs {p["box"]} (cpu)'
            inside = np.zeros((H, W), bool)
            for p in a:
                x0, y0, x1, y1 = (int(np.floor(v + 0.5)) for v in p['box'])
                x0, y0 = max(0, x0 - pads['left'] - 1), max(0, y0 - pads['top'] - 1)
                x1, y1 = min(W, x1 + pads['right'] + 1), min(H, y1 + pads['bottom'] + 1)
                inside[y0:y1, x0:x1] = True
            out = ~inside
            assert np.array_equal(oc[i][out], dec[i][out]), f'frame {i}: the CPU changed pixels outside the crop'
            if not np.array_equal(og[i][out], dec[i][out]):
                ys, xs = np.nonzero((og[i] != dec[i]).any(axis=2) & out)
                raise AssertionError(f'frame {i}: the GPU changed {ys.size} pixels outside the crop, '
                                     f'e.g. ({xs[0]}, {ys[0]})')
            d = np.abs(og[i] - oc[i])[inside]
            m = int(d.max()) if d.size else 0
            worst = max(worst, m)
            assert m <= 2, f'frame {i}: the GPU is {m} levels from the CPU inside the crop'
            synced += bool(a) and not np.array_equal(oc[i][inside], dec[i][inside])
        assert synced >= n // 2, f'only {synced} of {n} frames were synced'
        print(f'ok: {n} frames, {synced} synced; inside the crop at most {worst} levels apart, '
              f'outside identical to the decoded frame ({gpu} vs cpu)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
