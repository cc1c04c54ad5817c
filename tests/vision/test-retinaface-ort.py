#!/usr/bin/env python3
"""RetinaFace (retinaface-mnet025, as `spindle model fetch` stores it) through
`spindle run configs/faces.toml` vs the same ONNX file in ONNX Runtime with
Pytorch_Retinaface's own post-processing written here in NumPy: priors of
min sizes {16,32},{64,128},{256,512} at steps 8/16/32, box and landmark
decode with variances 0.1/0.2, score threshold, top-k, greedy NMS at IoU 0.4.

Pass: on every image the same number of faces, each matched by IoU >= 0.95
with a score within 1e-3 (and its landmarks within 1 pixel).

Images: the public-domain photographs and engravings of
tests/vision/faces-pd.toml (8 distinct images, 12 faces, among them a group of
five), which tests/models/fetch-test-assets.py takes out of Debian packages
and PyPI wheels into BUILD/test-real-models/faces-pd (each checked against
its sha256 here too), and five images derived from scikit-image's
astronaut.png (mirrored, halved, darkened, letterboxed, a two-face montage) so
faces also appear at other sizes, positions and contrasts. Every image is
read with OpenCV and handed to Spindle as PNG, so both sides see the same
pixels (JPEG decoders differ in chroma upsampling; that is not what is
compared here). Each image must also give the reference as many faces as
faces-pd.toml says, so a wrong or damaged image cannot pass unnoticed.

Skips (77) when the model has not been fetched (into BUILD/test-real-models
by tests/models/fetch-test-assets.py, which tools/test.sh runs, or with
`spindle model fetch retinaface-mnet025` into SPINDLE_MODEL_PATH), or ONNX
Runtime / OpenCV / the media stages are missing. Images not fetched are
listed and left out; the run says how many of faces-pd.toml it compared.

usage: test-retinaface-ort.py SPINDLE
"""
import json
import os
import subprocess
import sys
import tempfile
import hashlib
import tomllib

try:
    import cv2
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f'SKIP: {e}')
    sys.exit(77)

passed = failed = 0
SCORE_THR = 0.5
NMS_THR = 0.4
TOP_K = 5000


def check(cond, label):
    global passed, failed
    print(('ok   ' if cond else 'FAIL ') + label)
    if cond:
        passed += 1
    else:
        failed += 1


def priors(h, w):
    out = []
    for step, sizes in ((8, (16, 32)), (16, (64, 128)), (32, (256, 512))):
        fh, fw = -(-h // step), -(-w // step)
        for i in range(fh):
            for j in range(fw):
                for s in sizes:
                    out.append(((j + 0.5) * step / w, (i + 0.5) * step / h, s / w, s / h))
    return np.array(out, np.float32)


def nms(boxes, scores, thr):
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= thr)[0] + 1]
    return keep


def reference(sess, rgb):
    """Pytorch_Retinaface's detect.py on one RGB image."""
    h, w = rgb.shape[:2]
    x = (rgb[:, :, ::-1].astype(np.float32) - np.array([104, 117, 123], np.float32)).transpose(2, 0, 1)[None]
    loc, conf, landms = sess.run(None, {'input': np.ascontiguousarray(x)})
    p = priors(h, w)
    loc, conf, landms = loc[0], conf[0], landms[0]
    boxes = np.concatenate((p[:, :2] + loc[:, :2] * 0.1 * p[:, 2:], p[:, 2:] * np.exp(loc[:, 2:] * 0.2)), 1)
    boxes[:, :2] -= boxes[:, 2:] / 2
    boxes[:, 2:] += boxes[:, :2]
    boxes *= np.array([w, h, w, h], np.float32)
    lm = np.concatenate([p[:, :2] + landms[:, 2 * k:2 * k + 2] * 0.1 * p[:, 2:] for k in range(5)], 1)
    lm *= np.array([w, h] * 5, np.float32)
    scores = conf[:, 1]
    idx = np.where(scores > SCORE_THR)[0]
    idx = idx[scores[idx].argsort()[::-1][:TOP_K]]
    keep = nms(boxes[idx], scores[idx], NMS_THR)
    return [(boxes[idx][k], float(scores[idx][k]), lm[idx][k]) for k in keep]


def iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def images(faces_dir, data, manifest):
    """(name, RGB array, expected face count or None, distinct source image?)"""
    out, missing = [], []
    for name, im in manifest.items():
        path = os.path.join(faces_dir, im['file'])
        if not os.path.isfile(path):
            missing.append(name)
            continue
        with open(path, 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        check(digest == im['sha256'], f'{name}: {im["file"]} is the image faces-pd.toml pins')
        bgr = cv2.imread(path, cv2.IMREAD_COLOR)
        out.append((name, np.ascontiguousarray(bgr[:, :, ::-1]), im['faces'], True))
    astro_path = os.path.join(data, 'astronaut.png')
    if os.path.exists(astro_path):
        astro = cv2.imread(astro_path)[:, :, ::-1]
        face = astro[20:260, 100:300]
        derived = {
            'astronaut-mirror': astro[:, ::-1],
            'astronaut-half': cv2.resize(astro, (256, 256), interpolation=cv2.INTER_AREA),
            'astronaut-dark': (astro.astype(np.float32) * 0.45).astype(np.uint8),
            'astronaut-wide': cv2.copyMakeBorder(cv2.resize(astro, (320, 320), interpolation=cv2.INTER_AREA),
                                                 40, 40, 200, 120, cv2.BORDER_CONSTANT, value=(90, 120, 150)),
            'montage-two-faces': np.concatenate((cv2.resize(face, (200, 240)),
                                                 cv2.resize(face[:, ::-1], (200, 240))), 1),
        }
        out += [(k, np.ascontiguousarray(v), 2 if k.startswith('montage') else 1, False) for k, v in derived.items()]
    return out, missing


def main():
    spindle = sys.argv[1]
    root = os.environ.get('SPINDLE_SOURCE_ROOT', os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    real = os.path.join(os.environ.get('SPINDLE_BUILD_ROOT', ''), 'test-real-models')
    env = dict(os.environ, SPINDLE_MODEL_PATH=':'.join(p for p in (real, os.environ.get('SPINDLE_MODEL_PATH')) if p))
    r = subprocess.run([spindle, 'model', 'path', 'retinaface-mnet025'], capture_output=True, text=True, env=env)
    if r.returncode:
        print('SKIP: retinaface-mnet025 not fetched (tests/models/fetch-test-assets.py, or spindle model fetch '
              'retinaface-mnet025)')
        return 77
    model = r.stdout.strip()
    env['SPINDLE_MODEL_PATH'] = os.path.dirname(model)
    r = subprocess.run([spindle, 'model', 'verify', 'retinaface-mnet025'], capture_output=True, text=True, env=env)
    check(r.returncode == 0, f'the stored model verifies against the manifest ({model})')
    data = os.environ.get('SKIMAGE_DATA', '/usr/lib/python3/dist-packages/skimage/data')
    if not os.environ.get('SPINDLE_MEDIA_STAGE_DIR'):
        print('SKIP: the media stages are missing')
        return 77
    with open(os.path.join(root, 'tests', 'vision', 'faces-pd.toml'), 'rb') as f:
        manifest = tomllib.load(f)
    todo, missing = images(os.path.join(real, 'faces-pd'), data, manifest)
    if missing:
        status = os.path.join(real, 'fetch-status.txt')
        print(f'note: {len(missing)} of the {len(manifest)} public-domain images are not fetched '
              f'({", ".join(missing)}); tests/models/fetch-test-assets.py says: '
              + (open(status).read().strip() if os.path.exists(status) else 'not run'))
    if not todo:
        print('SKIP: no images (none fetched, and no scikit-image data)')
        return 77
    sess = ort.InferenceSession(model, providers=['CPUExecutionProvider'])
    worst_iou, worst_ds, n_faces, n_distinct = 1.0, 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, rgb, want, distinct in todo:
            png = os.path.join(tmp, name + '.png')
            cv2.imwrite(png, rgb[:, :, ::-1])
            out = os.path.join(tmp, name + '.jsonl')
            r = subprocess.run([spindle, 'run', os.path.join(root, 'configs', 'faces.toml'),
                                '--set', f'decode.path={png}', '--set', f'out.path={out}',
                                '--set', f'faces.score_threshold={SCORE_THR}',
                                '--set', f'faces.nms_threshold={NMS_THR}', '--set', f'faces.top_k={TOP_K}'],
                               capture_output=True, text=True, timeout=300, env=env)
            if r.returncode or not os.path.exists(out):
                check(False, f'{name}: spindle run failed: {r.stderr[-400:]}')
                continue
            lines = [json.loads(ln) for ln in open(out)]
            ours = lines[0]['faces'] if len(lines) == 1 else None
            ref = reference(sess, rgb)
            if ours is None:
                check(False, f'{name}: {len(lines)} lines for a one-frame image')
                continue
            check(len(ref) == want, f'{name}: the reference finds the {want} face(s) expected, {len(ref)}')
            used, ok, msg = set(), len(ours) == len(ref) and len(ref) > 0, []
            for b, s, lm in ref:
                best = max(((iou(b, o['box']), k) for k, o in enumerate(ours) if k not in used), default=(0, -1))
                if best[1] < 0:
                    ok = False
                    continue
                used.add(best[1])
                o = ours[best[1]]
                ds = abs(o['score'] - s)
                dl = float(np.abs(np.array(o['landmarks']).ravel() - lm).max()) if o['landmarks'] else 1e9
                worst_iou, worst_ds = min(worst_iou, best[0]), max(worst_ds, ds)
                ok = ok and best[0] >= 0.95 and ds <= 1e-3 and dl <= 1.0
                msg.append(f'iou {best[0]:.4f} dscore {ds:.1e} dlandmark {dl:.2f}px')
                n_faces += 1
            n_distinct += distinct and ok
            check(ok, f'{name} {rgb.shape[1]}x{rgb.shape[0]}: {len(ours)} faces vs {len(ref)} reference; '
                      + '; '.join(msg))
    print(f'summary: {n_faces} faces on {len(todo)} images ({n_distinct} of the {len(manifest)} public-domain '
          f'images of faces-pd.toml matched), worst IoU {worst_iou:.4f}, worst score difference {worst_ds:.1e}')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
