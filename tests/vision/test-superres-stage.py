#!/usr/bin/env python3
"""The superres stage (libspindle-vision.so) driven through the plugin ABI.

stage-host (argv[2]) loads the plugin (argv[1]); its stand-in engine runs a
"model" that blurs each channel with a 3x3 box (zero padding) and upsamples x2
(nearest). The stage must turn the u8 RGB frame into float, tile it (tiles of
64 with 2 pixels of context: 12 engine runs for a 200x150 frame), stitch, and
turn it back into u8 — and the result must equal the same operator applied
to the whole frame in NumPy (no seams). Other items travel along, a "faces"
item scaled by 2; a malformed frame fails its job only; an unknown model fails
create naming it.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

PLUGIN, HOST = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(cond, label):
    global passed, failed
    print(('ok   ' if cond else 'FAIL ') + label)
    passed += bool(cond)
    failed += not cond


def reference(frame):
    x = frame.astype(np.float32) / np.float32(255.0)
    h, w, _ = x.shape
    p = np.zeros((h + 2, w + 2, 3), np.float32)
    p[1:-1, 1:-1] = x
    acc = np.zeros_like(x)
    for dy in range(3):
        for dx in range(3):
            acc += p[dy:dy + h, dx:dx + w]
    y = acc / np.float32(9.0)
    y = np.repeat(np.repeat(y, 2, axis=0), 2, axis=1)
    return (np.clip(y, 0, 1) * np.float32(255.0) + np.float32(0.5)).astype(np.uint8)


def main():
    W, H = 200, 150
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        frames = []
        for k in range(2):
            f = rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)
            f[40:90, 60:140] = 255  # flat areas that saturate
            p = os.path.join(tmp, f'in{k}.rgb')
            f.tofile(p)
            frames.append((f, p))
        args = [HOST, PLUGIN, 'superres', str(W), str(H), '2', tmp, 'model=fake-sr-x2', 'tile=64', 'tile_pad=2',
                '--', f'1:{frames[0][1]}+faces', '2:bad', f'1:{frames[1][1]}', '1:eos']
        out = subprocess.run(args, capture_output=True, text=True, timeout=120)
        check(out.returncode == 0, f'host ran the stage (exit {out.returncode}) {out.stderr.strip()}')
        lines = [json.loads(l) for l in out.stdout.splitlines()]
        emitted = [l for l in lines if 'job' in l]
        fails = [l for l in lines if 'failed' in l]
        check(len(fails) == 1 and fails[0]['failed'] == 2 and '(H,W,3) u8' in fails[0]['msg'],
              f'the malformed frame fails its job only: {fails}')
        check('model calls: 24' in out.stderr, f'12 tiles per frame ran on the engine ({out.stderr.strip()})')
        ups = [l for l in emitted if l['frame'] is not None]
        check(len(ups) == 2 and all(l['frame'] == [2 * H, 2 * W] for l in ups),
              f'two frames upscaled to {2 * H}x{2 * W}')
        for l, (f, _) in zip(ups, frames):
            got = np.fromfile(l['file'], np.uint8).reshape(2 * H, 2 * W, 3)
            ref = reference(f)
            diff = np.abs(got.astype(int) - ref.astype(int))
            check(diff.max() <= 1 and (diff == 0).mean() >= 0.999,
                  f'frame {l["seq"]}: tiled = untiled reference (max diff {diff.max()}, '
                  f'{(diff == 0).mean() * 100:.3f}% identical)')
        first = ups[0] if ups else {}
        faces = first.get('faces') or []
        check(len(faces) == 1 and faces[0][:4] == [20, 40, 60, 80] and faces[0][5] == 7 and
              faces[0][6] == 2 and faces[0][7] == 20,
              f'"faces" travels along, scaled by 2: {faces}')
        eos = [l for l in emitted if l['frame'] is None]
        check(len(eos) == 1 and eos[0]['job'] == 1 and eos[0]['seq'] == 2, 'end-of-stream message forwarded')

        out = subprocess.run([HOST, PLUGIN, 'superres', str(W), str(H), '1', tmp, 'model=missing-model.onnx', '--',
                              f'1:{frames[0][1]}'], capture_output=True, text=True, timeout=60)
        line = json.loads(out.stdout.splitlines()[0]) if out.stdout else {}
        check('create_error' in line and 'missing-model.onnx' in line['create_error'],
              f'an unknown model fails create naming it: {line}')
    print(f'superres-stage: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
