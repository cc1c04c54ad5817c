#!/usr/bin/env python3
"""The facedetect stage (libspindle-vision.so) driven by the stage harness.

harness-driver (argv[2]) runs the plugin's (argv[1]) facedetect kind on the
real runtime through spindle/harness.h and prints what the stage emits.
Frames: the astronaut moving right 4-6 px per frame (job 1, with one frame
where she is gone; its end of stream must come through), a second job run at
the same time (batches of 3 may mix them), and a job whose frame is malformed.
Expected boxes: OpenCV's detectMultiScale on the same frames (grey via
cv2.cvtColor), averaged over each job's last (up to) 5 detections — so the test
checks the plugin, the Haar port and the per-job smoothing together. The model
path runs a tiny ONNX stand-in for RetinaFace on the real engine
(fake_models.retinaface). Exit 77 only if cv2 or onnx is not importable.
"""
import json
import re
import os
import subprocess
import sys
import tempfile

try:
    import cv2
    import numpy as np
    if not hasattr(cv2, 'CascadeClassifier'):
        raise ImportError('cv2 without CascadeClassifier')
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def first_existing(cands):
    for c in cands:
        if c and os.path.exists(c):
            return c
    return None


def main():
    cascade = first_existing(['/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml',
                              os.path.join(getattr(getattr(cv2, 'data', None), 'haarcascades', ''),
                                           'haarcascade_frontalface_default.xml')])
    astro_path = first_existing([os.path.join(d, 'astronaut.png') for d in
                                 [os.environ.get('SKIMAGE_DATA'), '/usr/lib/python3/dist-packages/skimage/data']
                                 if d])
    if not cascade or not astro_path:
        print('FAIL: cascade or astronaut.png not found (install opencv-data and python3-skimage)')
        sys.exit(1)
    astro = cv2.imread(astro_path, cv2.IMREAD_COLOR)[:, :, ::-1]  # RGB
    W, H = 640, 512
    clf = cv2.CascadeClassifier(cascade)

    def frame(dx):
        f = np.full((H, W, 3), 70, np.uint8)
        if dx is not None:
            f[:, dx:dx + 512] = astro[:, :min(512, W - dx)]
        return f

    job1 = [0, 4, 8, 12, 18, 24, 28, None, 32]
    job2 = [100, 106]
    with tempfile.TemporaryDirectory() as tmp:
        raw = {}
        ref = {}
        for dx in sorted(set(d for d in job1 + job2 if d is not None)) + [None]:
            f = frame(dx)
            p = os.path.join(tmp, f'f{dx}.rgb')
            f.tofile(p)
            raw[dx] = p
            g = cv2.cvtColor(f, cv2.COLOR_RGB2GRAY)
            ref[dx] = [list(map(float, r)) for r in clf.detectMultiScale(g, 1.1, 3)]
        check(all(len(ref[d]) == 1 for d in job1 + job2 if d is not None) and ref[None] == [],
              'OpenCV finds exactly one face on every astronaut frame and none on the blank one')
        args = []
        # Three jobs run together: job 1's frames, job 2's two frames and job 3's bad frame.
        order = [(1, job1[0]), (1, job1[1]), (2, job2[0]), (1, job1[2]), (3, 'bad'), (1, job1[3]), (2, job2[1])] + \
                [(1, d) for d in job1[4:]]
        for job, d in order:
            args.append(f'{job}:{d if d == "bad" else raw[d]}')
        out = subprocess.run([HOST, PLUGIN, 'facedetect', str(W), str(H), '3', tmp, f'cascade = "{cascade}"', '--'] +
                             args, capture_output=True, text=True, timeout=120)
        check(out.returncode == 0, f'the harness ran the stage (exit {out.returncode}) {out.stderr.strip()}')
        lines = [json.loads(l) for l in out.stdout.splitlines()]
        emitted = [l for l in lines if 'job' in l]
        fails = [l for l in lines if 'failed' in l]
        check(len(fails) == 1 and fails[0]['failed'] == 3 and 'frame 0' in fails[0]['msg'] and
              '(H,W,3) u8' in fails[0]['msg'],
              f'the malformed frame fails its job only: {fails}')
        check(len(emitted) == len(order) - 1, f'{len(emitted)} messages emitted for {len(order) - 1} good ones')

        def expect(seq_boxes):
            """Per job: mean of the last <= 5 detected boxes, as (x0,y0,x1,y1)."""
            hist, want = [], []
            for b in seq_boxes:
                if b is None:
                    want.append([])
                    continue
                x, y, w, h = b
                hist.append((x, y, x + w, y + h))
                last = hist[-5:]
                want.append([[sum(v[i] for v in last) / len(last) for i in range(4)]])
            return want

        for job, frames in ((1, job1), (2, job2)):
            got = [l for l in emitted if l['job'] == job and l['faces'] is not None]
            want = expect([ref[d][0] if d is not None else None for d in frames])
            ok = len(got) == len(want)
            worst = 0.0
            ids = set()
            for g, w in zip(got, want):
                ok = ok and len(g['faces']) == len(w)
                for gf, wf in zip(g['faces'], w):
                    worst = max(worst, max(abs(a - b) for a, b in zip(gf[:4], wf)))
                    ids.add(gf[5])
            check(ok and worst <= 1e-3 and len(ids) == 1,
                  f'job {job}: {len(got)} frames, boxes = 5-frame means of OpenCV boxes (max diff {worst:.2g}), '
                  f'one track {sorted(ids)}')
        seqs = [l['seq'] for l in emitted if l['job'] == 1]
        check({'eos': 1} in lines and {'eos': 2} in lines and seqs == list(range(len(job1))),
              f'every frame of job 1 in order ({seqs}), then the end of stream of jobs 1 and 2')

        out = subprocess.run([HOST, PLUGIN, 'facedetect', str(W), str(H), '1', tmp,
                              'cascade = "' + os.path.join(tmp, 'missing.xml') + '"', '--', f'1:{raw[0]}'],
                             capture_output=True, text=True, timeout=60)
        line = json.loads(out.stdout.splitlines()[0]) if out.stdout else {}
        check('create_error' in line and 'missing.xml' in line['create_error'],
              f'a missing cascade fails create naming the file: {line}')
        # Model path: the RetinaFace stand-in on the real engine, on a 200x150 frame.
        fw, fh = 200, 150
        model = os.path.join(tmp, 'fake-retinaface.onnx')
        fake_models.retinaface(model, fw, fh)
        f = np.random.default_rng(3).integers(0, 256, size=(fh, fw, 3), dtype=np.uint8)
        p = os.path.join(tmp, 'small.rgb')
        f.tofile(p)
        out = subprocess.run([HOST, PLUGIN, 'facedetect', str(fw), str(fh), '2', tmp, f'model = "{model}"',
                              'detector = "retinaface"', '--', f'1:{p}', f'1:{p}'],
                             capture_output=True, text=True, timeout=60)
        check(out.returncode == 0, f'model-backed facedetect ran (exit {out.returncode}) {out.stderr.strip()}')
        lines = [json.loads(l) for l in out.stdout.splitlines() if '"job"' in l]
        # The anchor the stand-in makes confident: stride 32, row 2, col 3, min_size 256,
        # a box centred on ((3 + 0.5) * 32, (2 + 0.5) * 32), landmarks on its centre
        # except the first three values, which carry the input's channel means
        # (landmark = centre + mean * 0.1 * 256, the variance times the prior's size).
        cx, cy = 3.5 * 32, 2.5 * 32
        want = [cx - 128, cy - 128, cx + 128, cy + 128]
        ok = len(lines) == 2
        for l in lines:
            faces = l.get('faces') or []
            ok = ok and len(faces) == 1 and max(abs(a - b) for a, b in zip(faces[0][:4], want)) < 1e-3 and \
                abs(faces[0][4] - 0.99) < 1e-6 and \
                all(abs(faces[0][6 + i] - (cx if i % 2 == 0 else cy)) < 1e-3 for i in range(3, 10))
        check(ok, f'RetinaFace outputs decoded, NMS applied, one face {want} with score 0.99 and landmarks: '
                  f'{[l.get("faces") for l in lines]}')
        bgr_mean = [float(f[:, :, 2].mean() - 104), float(f[:, :, 1].mean() - 117), float(f[:, :, 0].mean() - 123)]
        lm = (lines[0].get('faces') or [[0] * 16])[0][6:9] if lines else [0, 0, 0]
        got = [(lm[0] - cx) / 25.6, (lm[1] - cy) / 25.6, (lm[2] - cx) / 25.6]
        check(max(abs(a - b) for a, b in zip(got, bgr_mean)) < 1e-3,
              f'engine input is the {fw}x{fh} frame as BGR - (104, 117, 123): means {got} vs {bgr_mean}')
        # A model whose batch axis is dynamic (as the real export): the frames
        # of a process() call go through it together, each in its own slot —
        # every frame's landmarks carry its own channel means — and a bad
        # frame among them fails its job only.
        bmodel = os.path.join(tmp, 'fake-retinaface-batch.onnx')
        fake_models.retinaface(bmodel, fw, fh, batch=True)
        rng = np.random.default_rng(11)
        frames, args = [], []
        for i in range(6):
            fi = rng.integers(0, 256, size=(fh, fw, 3), dtype=np.uint8)
            pi = os.path.join(tmp, f'b{i}.rgb')
            fi.tofile(pi)
            frames.append(fi)
            args.append(f'{1 + i % 2}:{pi}')
        args.insert(3, '3:bad')
        env = dict(os.environ, SPINDLE_DRIVER_LOG='debug')
        out = subprocess.run([HOST, PLUGIN, 'facedetect', str(fw), str(fh), '8', tmp, f'model = "{bmodel}"',
                              'detector = "retinaface"', '--'] + args,
                             capture_output=True, text=True, timeout=60, env=env)
        check(out.returncode == 0, f'batched facedetect ran (exit {out.returncode}) {out.stderr.strip()[-400:]}')
        res = [json.loads(l) for l in out.stdout.splitlines() if l.startswith('{')]
        got = {(l['job'], l['seq']): l.get('faces') for l in res if 'seq' in l and l.get('job') in (1, 2)}
        ok = len(got) == 6
        for i, fi in enumerate(frames):
            faces = got.get((1 + i % 2, i // 2)) or []
            want_m = [float(fi[:, :, 2].mean() - 104), float(fi[:, :, 1].mean() - 117), float(fi[:, :, 0].mean() - 123)]
            ok = ok and len(faces) == 1 and max(abs(a - b) for a, b in zip(faces[0][:4], want)) < 1e-3 and max(
                abs((faces[0][6 + j] - (cx if j % 2 == 0 else cy)) / 25.6 - want_m[j]) for j in range(3)) < 1e-3
        check(ok, f'batched: each of 6 frames (2 jobs) decoded from its own slot of the batch: {got}')
        check(any(l.get('failed') == 3 for l in res) and {'eos': 1} in res and {'eos': 2} in res,
              f'batched: the bad frame failed job 3 only: {[l for l in res if "seq" not in l]}')
        runs = [int(m) for m in re.findall(r'facedetect: (\d+) frames of 200x150 in one run', out.stderr)]
        check(runs and max(runs) > 1 and sum(runs) == 6,
              f'batched: the frames went through the model together (frames per run: {runs})')
        out = subprocess.run([HOST, PLUGIN, 'facedetect', str(fw), str(fh), '1', tmp, f'model = "{model}"',
                              'detector = "yolo"', '--', f'1:{p}'], capture_output=True, text=True, timeout=60)
        line = json.loads(out.stdout.splitlines()[0]) if out.stdout else {}
        check('create_error' in line and 'yolo' in line['create_error'],
              f'an unknown detector fails create naming it: {line}')
    print(f'facedetect-stage: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
