#!/usr/bin/env python3
"""The facedetect stage on a GPU against the same stage on the CPU (suite gpu).

harness-driver (argv[2]) runs the vision plugin's (argv[1]) facedetect kind
on the CPU and with SPINDLE_DRIVER_DEVICES=cuda:0, on the same frames, with
the RetinaFace stand-in of fake_models (its landmarks carry the channel means
of the engine's input, so they check the GPU's fit-and-normalise kernel) at
the frame's size (candidates picked on the GPU, the default, and with
gpu_decode = false, decoded on the host) and stretched to another input
size, and with the Haar cascade when one is installed. Checked:
  - the same faces (boxes and scores within 1e-3, landmarks within 0.05 px:
    the kernel repeats the CPU's arithmetic, the model runs fp32 on both
    sides, only the engine's reductions sum in another order);
  - on the GPU the host frame was uploaded once and replaced the message's
    frame: the stage emits it in device memory (the driver copies it back),
    byte for byte the input;
  - a malformed frame fails its job only.
Exit 77 without a CUDA device (or without onnx).
"""
import json
import os
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
CASCADES = ['/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml',
            '/usr/share/opencv/haarcascades/haarcascade_frontalface_default.xml']


def check(cond, label):
    global passed, failed
    print(('ok   ' if cond else 'FAIL ') + label)
    passed += bool(cond)
    failed += not cond


def drive(tmp, W, H, config, frames, devices=None, batch=2):
    env = dict(os.environ)
    if devices:
        env['SPINDLE_DRIVER_DEVICES'] = devices
    out = subprocess.run([HOST, PLUGIN, 'facedetect', str(W), str(H), str(batch), tmp] + config + ['--'] + frames,
                         capture_output=True, text=True, timeout=300, env=env)
    return out.returncode, [json.loads(l) for l in out.stdout.splitlines() if l.startswith('{')], out.stderr


def main():
    W, H = 200, 150
    with tempfile.TemporaryDirectory() as tmp:
        frame = np.random.default_rng(5).integers(0, 256, size=(H, W, 3), dtype=np.uint8)
        p = os.path.join(tmp, 'f.rgb')
        frame.tofile(p)
        probe = os.path.join(tmp, 'probe')
        os.makedirs(probe)
        rc, lines, _ = drive(probe, W, H, [], [f'1:{p}'], devices='cuda:0')
        ce = lines[0].get('create_error', '') if lines else ''
        if rc == 0 and ce and 'cuda' in ce.lower():
            print(f'skip: no CUDA device here ({ce})')
            return 77
        cases = []
        same = os.path.join(tmp, 'rf-same.onnx')
        fake_models.retinaface(same, W, H)
        cases.append(('retinaface at the frame size', [f'model = "{same}"', 'detector = "retinaface"',
                                                       'precision = "fp32"']))
        # the same, with the raw outputs copied back and decoded on the host
        # (the default picks the candidates on the GPU: cuda/kernels/detect.cu)
        cases.append(('retinaface at the frame size, host decode', [f'model = "{same}"', 'detector = "retinaface"',
                                                                    'precision = "fp32"', 'gpu_decode = false']))
        small = os.path.join(tmp, 'rf-small.onnx')
        fake_models.retinaface(small, 160, 96)
        cases.append(('retinaface stretched to 160x96', [f'model = "{small}"', 'detector = "retinaface"',
                                                        'input_width = 160', 'input_height = 96',
                                                        'precision = "fp32"']))
        cascade = next((c for c in CASCADES if os.path.exists(c)), None)
        if cascade:
            cases.append(('haar cascade', [f'cascade = "{cascade}"']))
        for label, cfg in cases:
            res = {}
            for dev in ('cpu', 'cuda:0'):
                d = os.path.join(tmp, f'{len(res)}-{label.split()[0]}-{label.split()[-1]}-{dev.replace(":", "")}')
                os.makedirs(d)
                res[dev] = drive(d, W, H, cfg, [f'1:{p}', f'1:{p}', '2:bad'],
                                 devices=None if dev == 'cpu' else dev)
            (rc_c, lc, ec), (rc_g, lg, eg) = res['cpu'], res['cuda:0']
            check(rc_c == 0 and rc_g == 0, f'{label}: both runs exit 0 (cpu {rc_c}, gpu {rc_g}) {eg.strip()[-300:]}')
            fc = [l['faces'] for l in lc if l.get('job') == 1]
            fg = [l['faces'] for l in lg if l.get('job') == 1]
            # boxes, score, track: 1e-3; landmarks 0.05 px (the stand-in's carry 25.6 x the input's
            # channel means, which the GPU's reduction sums in another order: 2e-3 of a level)
            def close(fa, fb):
                return max(abs(x - y) for x, y in zip(fa[:6], fb[:6])) < 1e-3 and \
                    max(abs(x - y) for x, y in zip(fa[6:], fb[6:])) < 0.05
            ok = len(fc) == 2 and len(fg) == 2 and all(
                len(a) == len(b) and all(close(fa, fb) for fa, fb in zip(a, b)) for a, b in zip(fc, fg))
            check(ok, f'{label}: the same faces on both ({fc} vs {fg})')
            if label.startswith('retinaface'):
                check(all(len(f) == 1 for f in fg), f'{label}: the stand-in\'s face was found on the GPU')
            files = [l.get('file') for l in lg if l.get('job') == 1 and l.get('frame')]
            check(all(l.get('device_kind') == 1 for l in lg if l.get('job') == 1 and l.get('frame')),
                  f'{label}: the GPU instance emits the frame in device memory')
            same_bytes = len(files) == 2 and all(
                np.array_equal(np.fromfile(f, np.uint8).reshape(H, W, 3), frame) for f in files)
            check(same_bytes, f'{label}: the frame leaves the GPU instance intact (copied back from the device)')
            check(any(l.get('failed') == 2 for l in lg) and {'eos': 1} in lg,
                  f'{label}: the bad frame failed job 2 only on the GPU')
        # A batch-axis model: five distinct frames of two jobs in one engine
        # run (padded to 8 on the GPU), the candidates of all five picked by
        # one kernel and split by image; each frame's faces must be the CPU's
        # (the landmarks carry each frame's own channel means).
        bmodel = os.path.join(tmp, 'rf-batch.onnx')
        fake_models.retinaface(bmodel, W, H, batch=True)
        rng = np.random.default_rng(17)
        args = []
        for i in range(5):
            pi = os.path.join(tmp, f'b{i}.rgb')
            rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8).tofile(pi)
            args.append(f'{1 + i % 2}:{pi}')
        cfg = [f'model = "{bmodel}"', 'detector = "retinaface"', 'precision = "fp32"']
        res = {}
        for dev in ('cpu', 'cuda:0'):
            d = os.path.join(tmp, f'batch-{dev.replace(":", "")}')
            os.makedirs(d)
            env_dev = None if dev == 'cpu' else dev
            res[dev] = drive(d, W, H, cfg, args, devices=env_dev, batch=8)
        (rc_c, lc, _), (rc_g, lg, eg) = res['cpu'], res['cuda:0']
        fc = {(l['job'], l['seq']): l.get('faces') for l in lc if 'seq' in l}
        fg = {(l['job'], l['seq']): l.get('faces') for l in lg if 'seq' in l}
        ok = rc_c == 0 and rc_g == 0 and len(fc) == 5 and fc.keys() == fg.keys() and all(
            len(fc[k]) == len(fg[k]) == 1 and
            max(abs(x - y) for x, y in zip(fc[k][0][:6], fg[k][0][:6])) < 1e-3 and
            max(abs(x - y) for x, y in zip(fc[k][0][6:], fg[k][0][6:])) < 0.05 for k in fc)
        check(ok, f'batched: five frames in one run, the same faces on both ({fc} vs {fg}) {eg.strip()[-300:]}')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
