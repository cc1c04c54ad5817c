#!/usr/bin/env python3
"""The superres stage (libspindle-vision.so) driven by the stage harness.

harness-driver (argv[2]) runs the plugin's (argv[1]) superres kind on the
real runtime through spindle/harness.h, with a tiny ONNX model run by the
real engine (fake_models.sr_x2): it blurs each channel with a 3x3 box (zero
padding) and upsamples x2 (nearest). The stage must turn the u8 RGB frame into
float, tile it (tiles of 64 with 2 pixels of context: 12 engine runs for a
200x150 frame, as its debug log counts them), stitch, and turn it back into
u8 — and the result must equal the same operator applied to the whole frame
in NumPy (no seams). Other items travel along, a "faces" item scaled by 2;
end of stream comes through; a malformed frame fails its job only; an unknown
model fails create naming it. Exit 77 only if the onnx package is missing.

region = "faces": outside the face box grown by face_margin the output equals
a bilinear x2 upscale (half-pixel centres, edge clamped, computed here in
NumPy) exactly; inside it, away from the feather band, it equals the model
run on the crop alone (bit for bit the stage run on the crop as a frame, and
the NumPy operator within rounding); a frame without faces is the bilinear
upscale only.

The shipped lipsync config's tile_pad: the embedded ESPCN tiled with it
equals the untiled output, and with one pixel less it does not.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import fake_models
except ImportError as e:
    print(f'skip: {e}')
    sys.exit(77)

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


def bilinear2(frame):
    """x2 bilinear resize with pixel centres at +0.5 (cv2.INTER_LINEAR). At
    scale 2 the weights are 1/4 and 3/4, so every value is a multiple of 1/16
    and the result is exact in any arithmetic; rounding: half away from zero."""
    x = frame.astype(np.float64)

    def axis(a, n, ax):
        d = np.arange(2 * n)
        s = (d + 0.5) / 2 - 0.5
        i = np.floor(s).astype(int)
        w = s - i
        i0, i1 = np.clip(i, 0, n - 1), np.clip(i + 1, 0, n - 1)
        shape = [1, 1, 1]
        shape[ax] = -1
        w = w.reshape(shape)
        return np.take(a, i0, axis=ax) * (1 - w) + np.take(a, i1, axis=ax) * w

    h, w, _ = x.shape
    y = axis(axis(x, w, 1), h, 0)
    return np.floor(np.clip(y, 0, 255) + 0.5).astype(np.uint8)


def drive(tmp, W, H, batch, config, frames, env=None):
    """Run the superres kind through the harness; (exit code, JSON lines, stderr)."""
    out = subprocess.run([HOST, PLUGIN, 'superres', str(W), str(H), str(batch), tmp] + config + ['--'] + frames,
                         capture_output=True, text=True, timeout=120,
                         env=dict(env or os.environ, SPINDLE_DRIVER_LOG='debug'))
    return out.returncode, [json.loads(l) for l in out.stdout.splitlines()], out.stderr


def model_runs(stderr):
    """{(job, seq): engine runs} from the stage's debug log."""
    return {(1, int(m.group(1))): int(m.group(2))
            for m in re.finditer(r'superres: frame (\d+): (\d+) model runs', stderr)}


def create_error(lines):
    return lines[0].get('create_error', '') if lines else ''


def faces_mode(tmp, frames, W, H, model):
    f, path = frames[0]
    rc, lines, err = drive(tmp, W, H, 2, [f'model = "{model}"', 'tile = 16', 'tile_pad = 2', 'region = "faces"',
                                          'face_margin = 0.25', 'feather = 4'], [f'1:{path}+faces', f'1:{path}'])
    check(rc == 0 and not create_error(lines), f'faces mode: the harness ran the stage (exit {rc}) {lines[:1]}')
    ups = [l for l in lines if l.get('frame')]
    check(len(ups) == 2 and all(l['frame'] == [2 * H, 2 * W] for l in ups), 'faces mode: two frames at 2x')
    check({'eos': 1} in lines, 'faces mode: end of stream came through')
    if len(ups) != 2:
        return
    bil = bilinear2(f)
    # harness-driver's face: box (10,20)-(30,40); margin 0.25 of 20 px = 5 px each side
    x0, y0, x1, y1 = 5, 15, 35, 45
    got = np.fromfile(ups[0]['file'], np.uint8).reshape(2 * H, 2 * W, 3)
    outside = np.ones((2 * H, 2 * W), bool)
    outside[2 * y0:2 * y1, 2 * x0:2 * x1] = False
    check(np.array_equal(got[outside], bil[outside]),
          f'faces mode: outside the grown box = bilinear upscale exactly '
          f'(max diff {np.abs(got[outside].astype(int) - bil[outside]).max()})')
    # The model on the crop alone: the stage run on the crop as a whole frame
    # (same tiles, so the engine sees the same inputs) and the NumPy operator.
    crop = os.path.join(tmp, 'crop.rgb')
    np.ascontiguousarray(f[y0:y1, x0:x1]).tofile(crop)
    cdir = os.path.join(tmp, 'crop')
    os.makedirs(cdir, exist_ok=True)
    rc, clines, _ = drive(cdir, x1 - x0, y1 - y0, 1, [f'model = "{model}"', 'tile = 16', 'tile_pad = 2'],
                          [f'1:{crop}'])
    cups = [l for l in clines if l.get('frame')]
    check(rc == 0 and len(cups) == 1, f'faces mode: the crop ran as a frame (exit {rc})')
    if cups:
        model_crop = np.fromfile(cups[0]['file'], np.uint8).reshape(2 * (y1 - y0), 2 * (x1 - x0), 3)
        inner = got[2 * y0 + 4:2 * y1 - 4, 2 * x0 + 4:2 * x1 - 4]
        check(np.array_equal(inner, model_crop[4:-4, 4:-4]),
              f'faces mode: inside the box (off the feather) = the model on the crop '
              f'(max diff {np.abs(inner.astype(int) - model_crop[4:-4, 4:-4]).max()})')
        ref = reference(f[y0:y1, x0:x1])
        d = np.abs(model_crop.astype(int) - ref.astype(int))
        check(d.max() <= 1 and (d == 0).mean() >= 0.999,
              f'faces mode: the model on the crop = the NumPy operator on the crop (max diff {d.max()})')
    check(not np.array_equal(got[2 * y0:2 * y1, 2 * x0:2 * x1], bil[2 * y0:2 * y1, 2 * x0:2 * x1]),
          'faces mode: the face region differs from the bilinear upscale')
    check(ups[0]['faces'] and ups[0]['faces'][0][:4] == [20, 40, 60, 80], 'faces mode: "faces" scaled by 2')
    nofaces = np.fromfile(ups[1]['file'], np.uint8).reshape(2 * H, 2 * W, 3)
    check(np.array_equal(nofaces, bil), 'faces mode: a frame without faces = bilinear upscale only')
    runs = model_runs(err)
    check(runs == {(1, 0): 4, (1, 1): 0}, f'faces mode: the model ran on the 30x30 crop only, 4 tiles of 16, '
          f'and not at all on the frame without faces ({runs})')
    rc, lines, _ = drive(tmp, W, H, 2, [f'model = "{model}"', 'region = "eyes"'], [f'1:{path}'])
    line = lines[0] if lines else {}
    check('create_error' in line and 'region' in line['create_error'] and 'eyes' in line['create_error'],
          f'an unknown region fails create naming it: {line}')


def shipped_pad(tmp, W, H, frames):
    """configs/lipsync.toml's superres (the embedded ESPCN, its tile_pad)
    tiled at 48 gives the untiled output, and one pixel less of context
    does not: the shipped pad is the model's receptive radius, no less."""
    import tomllib
    src = os.environ.get('SPINDLE_SOURCE_ROOT') or os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
    with open(os.path.join(src, 'configs', 'lipsync.toml'), 'rb') as f:
        sr = next(s for s in tomllib.load(f)['stage'] if s['kind'] == 'superres')
    model = os.path.normpath(os.path.join(src, 'configs', sr['model']))
    pad = int(sr.get('tile_pad', 10))

    def run(tile, p):
        rc, lines, _ = drive(tmp, W, H, 1, [f'model = "{model}"', f'tile = {tile}', f'tile_pad = {p}'],
                             [f'1:{frames[0][1]}'])
        ups = [l for l in lines if l.get('frame')]
        check(rc == 0 and len(ups) == 1, f'ESPCN, tile {tile}, pad {p}: ran (exit {rc}, {lines[:1]})')
        return np.fromfile(ups[0]['file'], np.uint8).astype(int) if ups else np.zeros(1, int)

    whole = run(8192, 0)
    d = np.abs(run(48, pad) - whole)
    check(d.max() <= 1 and (d == 0).mean() >= 0.999,
          f'lipsync.toml: ESPCN in tiles of 48 with its tile_pad {pad} = untiled (max diff {d.max()}, '
          f'{(d == 0).mean() * 100:.3f}% identical)')
    d = np.abs(run(48, pad - 1) - whole)
    check(d.max() > 2, f'ESPCN with tile_pad {pad - 1} shows seams (max diff {d.max()}): {pad} is its radius')


def main():
    W, H = 200, 150
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, 'fake-sr-x2.onnx')
        fake_models.sr_x2(model)
        frames = []
        for k in range(2):
            f = rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)
            f[40:90, 60:140] = 255  # flat areas that saturate
            p = os.path.join(tmp, f'in{k}.rgb')
            f.tofile(p)
            frames.append((f, p))
        rc, lines, err = drive(tmp, W, H, 2, [f'model = "{model}"', 'tile = 64', 'tile_pad = 2'],
                               [f'1:{frames[0][1]}+faces', '2:bad', f'1:{frames[1][1]}'])
        check(rc == 0 and not create_error(lines), f'the harness ran the stage (exit {rc}) {lines[:1]}')
        emitted = [l for l in lines if 'job' in l]
        fails = [l for l in lines if 'failed' in l]
        check(len(fails) == 1 and fails[0]['failed'] == 2 and '(H,W,3) u8' in fails[0]['msg'],
              f'the malformed frame fails its job only: {fails}')
        runs = model_runs(err)
        check(runs == {(1, 0): 12, (1, 1): 12}, f'12 tiles per frame ran on the engine ({runs})')
        ups = [l for l in emitted if l['frame'] is not None]
        check(len(ups) == 2 and all(l['frame'] == [2 * H, 2 * W] and l['job'] == 1 for l in ups),
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
              faces[0][6] == 2 and faces[0][15] == 20,
              f'"faces" travels along, scaled by 2: {faces}')
        check({'eos': 1} in lines and len(emitted) == 2, 'end of stream came through after the two frames')

        rc, lines, _ = drive(tmp, W, H, 1, ['model = "missing-model.onnx"'], [f'1:{frames[0][1]}'])
        line = lines[0] if lines else {}
        check('create_error' in line and 'missing-model.onnx' in line['create_error'],
              f'an unknown model fails create naming it: {line}')
        # A model name not fetched with model_optional: the embedded espcn-x2,
        # which only upscales by 2, so scale = 4 must be refused, not run at 2x.
        env = dict(os.environ, SPINDLE_MODEL_PATH=os.path.join(tmp, 'no-models'), HOME=tmp)
        env.pop('XDG_DATA_HOME', None)
        rc, lines, _ = drive(tmp, W, H, 1, ['model = "realesr-animevideov3-x4"', 'model_optional = true',
                                            'scale = 4'], [f'1:{frames[0][1]}'], env=env)
        line = lines[0] if lines else {}
        check('create_error' in line and 'upscales by 2, not 4' in line['create_error'],
              f'optional model not fetched with scale 4: refused, not run at 2x: {line}')
        rc, lines, _ = drive(tmp, W, H, 1, ['model = "realesr-animevideov3-x4"'], [f'1:{frames[0][1]}'], env=env)
        line = lines[0] if lines else {}
        check('create_error' in line and 'spindle model fetch realesr-animevideov3-x4' in line['create_error'],
              f'required model not fetched: create fails saying how to fetch it: {line}')
        faces_mode(tmp, frames, W, H, model)
        shipped_pad(tmp, W, H, frames)
    print(f'superres-stage: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
