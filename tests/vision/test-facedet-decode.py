#!/usr/bin/env python3
"""Face-detector decoding (RetinaFace, SCRFD, YuNet) against NumPy references.

For each model the test generates random but plausible raw network outputs
(a few clusters of confident anchors around "faces", so NMS has work to do,
plus scattered low scores), decodes them with a NumPy re-implementation of the
model's published post-processing (Pytorch_Retinaface detect.py, InsightFace
scrfd.py, OpenCV FaceDetectorYN::postProcess + NMSBoxes) written here, and with
our C decoder through facedet-driver (argv[1]). The kept sets must be equal and
boxes, scores and landmarks agree within 1e-4 (relative for values > 1).
Also checks input preprocessing against a NumPy bilinear reference, and that
malformed outputs give an error naming the output.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

DRIVER = sys.argv[1]
TOL = 1e-4
results = {'passed': 0, 'failed': 0}


def check(cond, label):
    if cond:
        results['passed'] += 1
        print(f'ok   {label}')
    else:
        results['failed'] += 1
        print(f'FAIL {label}')


# --------------------------------------------------------------------------
# References

def py_cpu_nms(dets, thresh):
    """Pytorch_Retinaface utils/nms/py_cpu_nms.py (same in scrfd.py)."""
    x1, y1, x2, y2, scores = dets[:, 0], dets[:, 1], dets[:, 2], dets[:, 3], dets[:, 4]
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort(kind='stable')[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(i)
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        w = np.maximum(np.float32(0.0), xx2 - xx1 + 1)
        h = np.maximum(np.float32(0.0), yy2 - yy1 + 1)
        inter = w * h
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        inds = np.where(ovr <= thresh)[0]
        order = order[inds + 1]
    return keep


def retinaface_priors(H, W):
    min_sizes = [[16, 32], [64, 128], [256, 512]]
    anchors = []
    for k, step in enumerate([8, 16, 32]):
        for i in range(math.ceil(H / step)):
            for j in range(math.ceil(W / step)):
                for ms in min_sizes[k]:
                    anchors += [(j + 0.5) * step / W, (i + 0.5) * step / H, ms / W, ms / H]
    return np.array(anchors, np.float32).reshape(-1, 4)


def ref_retinaface(loc, conf, landms, H, W, resize, thr, nms, top_k, keep_top_k):
    pri = retinaface_priors(H, W)
    v0, v1 = np.float32(0.1), np.float32(0.2)
    boxes = np.concatenate((pri[:, :2] + loc[:, :2] * v0 * pri[:, 2:], pri[:, 2:] * np.exp(loc[:, 2:] * v1)), 1)
    boxes[:, :2] -= boxes[:, 2:] / 2
    boxes[:, 2:] += boxes[:, :2]
    scale = np.array([W, H, W, H], np.float32)
    boxes = boxes * scale / np.float32(resize)
    scores = conf[:, 1]
    lm = np.concatenate([pri[:, :2] + landms[:, 2 * t:2 * t + 2] * v0 * pri[:, 2:] for t in range(5)], 1)
    lm = lm * np.array([W, H] * 5, np.float32) / np.float32(resize)
    inds = np.where(scores > thr)[0]
    boxes, lm, scores = boxes[inds], lm[inds], scores[inds]
    order = scores.argsort(kind='stable')[::-1][:top_k]
    boxes, lm, scores = boxes[order], lm[order], scores[order]
    dets = np.hstack((boxes, scores[:, None])).astype(np.float32)
    keep = py_cpu_nms(dets, nms)
    dets, lm = dets[keep][:keep_top_k], lm[keep][:keep_top_k]
    return np.hstack((dets, lm))


def ref_scrfd(outs, in_w, in_h, det_scale, thr, nms, with_kps):
    fmc = 3
    scores_l, boxes_l, kps_l = [], [], []
    for idx, stride in enumerate([8, 16, 32]):
        scores = outs[idx].reshape(-1, 1)
        bbox_preds = outs[idx + fmc].reshape(-1, 4) * np.float32(stride)
        h, w = in_h // stride, in_w // stride
        centers = np.stack(np.mgrid[:h, :w][::-1], axis=-1).astype(np.float32)
        centers = (centers * stride).reshape((-1, 2))
        centers = np.stack([centers] * 2, axis=1).reshape((-1, 2))
        pos = np.where(scores >= thr)[0]
        bb = np.stack([centers[:, 0] - bbox_preds[:, 0], centers[:, 1] - bbox_preds[:, 1],
                       centers[:, 0] + bbox_preds[:, 2], centers[:, 1] + bbox_preds[:, 3]], axis=-1)
        scores_l.append(scores[pos])
        boxes_l.append(bb[pos])
        if with_kps:
            kp = outs[idx + 2 * fmc].reshape(-1, 10) * np.float32(stride)
            pts = []
            for t in range(5):
                pts += [centers[:, 0] + kp[:, 2 * t], centers[:, 1] + kp[:, 2 * t + 1]]
            kps_l.append(np.stack(pts, axis=-1)[pos])
    scores = np.vstack(scores_l)
    order = scores.ravel().argsort(kind='stable')[::-1]
    bboxes = np.vstack(boxes_l) / np.float32(det_scale)
    pre_det = np.hstack((bboxes, scores)).astype(np.float32)[order]
    keep = py_cpu_nms(pre_det, nms)
    det = pre_det[keep]
    if with_kps:
        kpss = (np.vstack(kps_l) / np.float32(det_scale))[order][keep]
        det = np.hstack((det, kpss))
    return det


def ref_yunet(outs, in_w, in_h, thr, nms, top_k):
    faces = []
    for i, s in enumerate([8, 16, 32]):
        cols, rows = in_w // s, in_h // s
        cls, obj = outs[i].reshape(-1), outs[i + 3].reshape(-1)
        bbox, kps = outs[i + 6].reshape(-1, 4), outs[i + 9].reshape(-1, 10)
        fs = np.float32(s)
        for r in range(rows):
            for c in range(cols):
                idx = r * cols + c
                score = np.sqrt(np.clip(cls[idx], 0, 1) * np.clip(obj[idx], 0, 1), dtype=np.float32)
                if score < thr:
                    continue
                cx = (np.float32(c) + bbox[idx, 0]) * fs
                cy = (np.float32(r) + bbox[idx, 1]) * fs
                w = np.exp(bbox[idx, 2]) * fs
                h = np.exp(bbox[idx, 3]) * fs
                x1, y1 = cx - w / np.float32(2), cy - h / np.float32(2)
                lm = []
                for n in range(5):
                    lm += [(kps[idx, 2 * n] + np.float32(c)) * fs, (kps[idx, 2 * n + 1] + np.float32(r)) * fs]
                faces.append([x1, y1, w, h, score] + lm)
    # cv::dnn::NMSBoxes on Rect2i(int(x1), int(y1), int(w), int(h)).
    cand = [i for i in range(len(faces)) if faces[i][4] > thr]
    cand.sort(key=lambda i: -faces[i][4])  # stable, like std::stable_sort
    cand = cand[:top_k] if top_k > 0 else cand
    rect = {i: (int(faces[i][0]), int(faces[i][1]), int(faces[i][2]), int(faces[i][3])) for i in cand}

    def overlap(a, b):
        ix = max(a[0], b[0])
        iy = max(a[1], b[1])
        iw = min(a[0] + a[2], b[0] + b[2]) - ix
        ih = min(a[1] + a[3], b[1] + b[3]) - iy
        inter = iw * ih if iw > 0 and ih > 0 else 0
        return inter / (a[2] * a[3] + b[2] * b[3] - inter)

    kept = []
    for i in cand:
        if all(overlap(rect[k], rect[i]) <= nms for k in kept):
            kept.append(i)
    out = []
    for i in kept:
        f = faces[i]
        out.append([f[0], f[1], f[0] + f[2], f[1] + f[3], f[4]] + f[5:])
    return np.array(out, np.float32).reshape(-1, 15)


# --------------------------------------------------------------------------
# Driver plumbing

def run_decode(tmp, model, img_wh, in_wh, fit, thr, nms, pre_k, post_k, outs):
    specs = []
    for i, o in enumerate(outs):
        p = os.path.join(tmp, f'{model}-{i}.f32')
        np.ascontiguousarray(o, np.float32).tofile(p)
        specs.append(p + ':' + 'x'.join(str(d) for d in o.shape))
    cmd = [DRIVER, 'decode', model, str(img_wh[0]), str(img_wh[1]), str(in_wh[0]), str(in_wh[1]), str(fit),
           repr(float(thr)), repr(float(nms)), str(pre_k), str(post_k)] + specs
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode not in (0, 3):
        raise SystemExit(f'driver failed ({r.returncode}): {r.stderr}')
    return json.loads(r.stdout)


def compare(label, ref, got):
    got = np.array(got, np.float64).reshape(len(got), -1) if got else np.zeros((0, ref.shape[1]))
    if got.shape != ref.shape:
        check(False, f'{label}: kept {got.shape[0]} faces x {got.shape[1] if got.ndim > 1 else 0} values, '
                     f'reference {ref.shape[0]} x {ref.shape[1]}')
        return
    err = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
    worst = float(err.max()) if err.size else 0.0
    check(worst <= TOL and ref.shape[0] > 0,
          f'{label}: {ref.shape[0]} faces kept, same set, max rel. error {worst:.2e} (tol {TOL})')


def clusters(rng, n_faces, in_w, in_h):
    return [(rng.uniform(0.1, 0.9) * in_w, rng.uniform(0.1, 0.9) * in_h, rng.uniform(20, 200)) for _ in range(n_faces)]


def test_retinaface(tmp, rng):
    for (W, H, resize, thr, nms, top_k, keep_top_k) in [(320, 240, 1.0, 0.02, 0.4, 5000, 750),
                                                         (640, 480, 0.5, 0.5, 0.3, 200, 20),
                                                         (300, 200, 1.0, 0.8, 0.5, 5000, 750)]:
        pri = retinaface_priors(H, W)
        N = pri.shape[0]
        logits = rng.normal(-4, 1.5, size=(N, 2)).astype(np.float32)
        logits[:, 0] = 0
        for (cx, cy, size) in clusters(rng, 8, W, H):
            px, py = pri[:, 0] * W, pri[:, 1] * H
            near = (np.abs(px - cx) < size / 2) & (np.abs(py - cy) < size / 2) & (np.abs(pri[:, 2] * W - size) < size)
            logits[near, 1] = rng.normal(3, 1.5, size=near.sum())
        e = np.exp(logits - logits.max(1, keepdims=True))
        conf = (e / e.sum(1, keepdims=True)).astype(np.float32)
        loc = rng.normal(0, 0.8, size=(N, 4)).astype(np.float32)
        landms = rng.normal(0, 1.0, size=(N, 10)).astype(np.float32)
        ref = ref_retinaface(loc, conf, landms, H, W, resize, thr, nms, top_k, keep_top_k)
        img = (round(W / resize), round(H / resize))
        fit = 0 if resize == 1.0 else 1  # FIT_NONE or FIT_STRETCH (scale = resize)
        got = run_decode(tmp, 'retinaface', img, (W, H), fit, thr, nms, top_k, keep_top_k,
                         [loc[None], conf[None], landms[None]])
        compare(f'retinaface {W}x{H} resize {resize} thr {thr} nms {nms} top-k {top_k}/{keep_top_k}',
                ref, got.get('faces', []))


def test_scrfd(tmp, rng):
    for (img, in_wh, thr, nms, kps) in [((1000, 700), (640, 640), 0.5, 0.4, True),
                                        ((480, 640), (640, 640), 0.3, 0.45, True),
                                        ((640, 640), (320, 320), 0.5, 0.4, False)]:
        in_w, in_h = in_wh
        im_ratio, model_ratio = img[1] / img[0], in_h / in_w
        if im_ratio > model_ratio:
            new_h = in_h
            new_w = int(new_h / im_ratio)
        else:
            new_w = in_w
            new_h = int(new_w * im_ratio)
        det_scale = float(new_h) / img[1]
        outs = [None] * (9 if kps else 6)
        faces = clusters(rng, 10, new_w, new_h)
        for k, s in enumerate([8, 16, 32]):
            h, w = in_h // s, in_w // s
            n = h * w * 2
            cy, cx = np.divmod(np.arange(n) // 2, w)
            score = 1 / (1 + np.exp(-rng.normal(-5, 1.5, size=n)))
            for (fx, fy, size) in faces:
                near = (np.abs(cx * s - fx) < size / 3) & (np.abs(cy * s - fy) < size / 3) & (size / s > 2) & (size / s < 12)
                score[near] = 1 / (1 + np.exp(-rng.normal(2, 1.5, size=near.sum())))
            outs[k] = score.astype(np.float32).reshape(n, 1)
            outs[3 + k] = np.exp(rng.normal(0.7, 0.4, size=(n, 4))).astype(np.float32)
            if kps:
                outs[6 + k] = rng.normal(0, 1.5, size=(n, 10)).astype(np.float32)
        ref = ref_scrfd(outs, in_w, in_h, det_scale, thr, nms, kps)
        got = run_decode(tmp, 'scrfd', img, in_wh, 2, thr, nms, 0, 0, outs)
        compare(f'scrfd image {img[0]}x{img[1]} input {in_w}x{in_h} thr {thr} nms {nms} kps {kps}',
                ref, got.get('faces', []))


def test_yunet(tmp, rng):
    for (img, thr, nms, top_k) in [((300, 200), 0.6, 0.3, 5000), ((640, 480), 0.9, 0.3, 50),
                                   ((160, 120), 0.5, 0.45, 5000)]:
        in_w, in_h = (img[0] - 1) // 32 * 32 + 32, (img[1] - 1) // 32 * 32 + 32
        outs = [None] * 12
        faces = clusters(rng, 8, img[0], img[1])
        for k, s in enumerate([8, 16, 32]):
            rows, cols = in_h // s, in_w // s
            n = rows * cols
            r, c = np.divmod(np.arange(n), cols)
            cls = rng.uniform(-0.05, 0.3, size=n)
            obj = rng.uniform(-0.05, 0.3, size=n)
            for (fx, fy, size) in faces:
                near = (np.abs(c * s - fx) < size / 3) & (np.abs(r * s - fy) < size / 3) & (size / s > 2)
                cls[near] = rng.uniform(0.5, 1.1, size=near.sum())
                obj[near] = rng.uniform(0.5, 1.1, size=near.sum())
            outs[k] = cls.astype(np.float32).reshape(1, n, 1)
            outs[3 + k] = obj.astype(np.float32).reshape(1, n, 1)
            outs[6 + k] = np.concatenate([rng.uniform(-0.5, 1.5, size=(n, 2)), rng.normal(1.2, 0.5, size=(n, 2))],
                                         1).astype(np.float32).reshape(1, n, 4)
            outs[9 + k] = rng.normal(0.5, 1.0, size=(1, n, 10)).astype(np.float32)
        ref = ref_yunet(outs, in_w, in_h, thr, nms, top_k)
        got = run_decode(tmp, 'yunet', img, (in_w, in_h), 0, thr, nms, top_k, 0, outs)
        compare(f'yunet image {img[0]}x{img[1]} input {in_w}x{in_h} thr {thr} nms {nms} top-k {top_k}',
                ref, got.get('faces', []))


def test_errors(tmp, rng):
    W, H = 320, 240
    N = retinaface_priors(H, W).shape[0]
    loc = np.zeros((1, N, 4), np.float32)
    conf = np.zeros((1, N, 2), np.float32)
    bad = np.zeros((1, N - 2, 10), np.float32)
    got = run_decode(tmp, 'retinaface', (W, H), (W, H), 0, 0.5, 0.4, 0, 0, [loc, conf, bad])
    check('error' in got and 'output 2 (landms)' in got['msg'],
          f'retinaface with a short landms output fails naming it: {got.get("msg")}')
    got = run_decode(tmp, 'scrfd', (W, H), (W, H), 1, 0.5, 0.4, 0, 0, [loc, conf])
    check('error' in got and '6 or 9 outputs' in got['msg'], f'scrfd with 2 outputs fails: {got.get("msg")}')
    # YuNet outputs for 320x224 fed with a 320x256 geometry.
    outs = []
    for grp, width in ((0, 1), (1, 1), (2, 4), (3, 10)):
        for s in (8, 16, 32):
            outs.append(np.zeros((1, (224 // s) * (320 // s), width), np.float32))
    got = run_decode(tmp, 'yunet', (320, 256), (320, 256), 0, 0.5, 0.3, 0, 0, outs)
    check('error' in got and 'output 0 (cls)' in got['msg'], f'yunet with wrong input size fails: {got.get("msg")}')


def ref_preprocess(img, bgr, model, in_w, in_h, rw, rh):
    h, w, _ = img.shape
    f = img.astype(np.float64)
    sx, sy = w / rw, h / rh
    fx = np.maximum((np.arange(rw) + 0.5) * sx - 0.5, 0)
    fy = np.maximum((np.arange(rh) + 0.5) * sy - 0.5, 0)
    x0 = np.minimum(np.floor(fx).astype(int), w - 1)
    y0 = np.minimum(np.floor(fy).astype(int), h - 1)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    wx = np.where(x0 == w - 1, 0, fx - x0)[None, :, None]
    wy = np.where(y0 == h - 1, 0, fy - y0)[:, None, None]
    top = f[y0][:, x0] + (f[y0][:, x1] - f[y0][:, x0]) * wx
    bot = f[y1][:, x0] + (f[y1][:, x1] - f[y1][:, x0]) * wx
    res = top + (bot - top) * wy
    want_bgr = model in ('retinaface', 'yunet')
    if want_bgr != bool(bgr):
        res = res[:, :, ::-1]
    mean, istd = {'retinaface': ((104, 117, 123), 1.0), 'scrfd': ((127.5,) * 3, 1 / 128),
                  'yunet': ((0, 0, 0), 1.0)}[model]
    out = np.zeros((3, in_h, in_w))
    for c in range(3):
        out[c] = (0 - mean[c]) * istd
        out[c, :rh, :rw] = (res[:, :, c] - mean[c]) * istd
    return out


def test_preprocess(tmp, rng):
    img = rng.integers(0, 256, size=(70, 100, 3), dtype=np.uint8)
    raw = os.path.join(tmp, 'img.raw')
    img.tofile(raw)
    for (model, bgr, in_wh, fit) in [('retinaface', 1, (128, 96), 0), ('scrfd', 0, (64, 64), 2),
                                     ('scrfd', 1, (160, 160), 2), ('yunet', 1, (128, 96), 0),
                                     ('retinaface', 0, (50, 40), 1)]:
        outp = os.path.join(tmp, 'pre.f32')
        r = subprocess.run([DRIVER, 'pre', model, str(bgr), '100', '70', str(in_wh[0]), str(in_wh[1]), str(fit),
                            raw, outp], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            check(False, f'preprocess {model}: driver failed {r.stderr}')
            continue
        g = json.loads(r.stdout)
        got = np.fromfile(outp, np.float32).reshape(3, in_wh[1], in_wh[0])
        ref = ref_preprocess(img, bgr, model, in_wh[0], in_wh[1], g['resized_w'], g['resized_h'])
        err = float(np.abs(got - ref).max())
        check(err <= 1e-3, f'preprocess {model} bgr={bgr} input {in_wh} fit {fit} '
                           f'(resized {g["resized_w"]}x{g["resized_h"]}): max abs error {err:.2e}')


def main():
    rng = np.random.default_rng(20261121)
    with tempfile.TemporaryDirectory() as tmp:
        test_retinaface(tmp, rng)
        test_scrfd(tmp, rng)
        test_yunet(tmp, rng)
        test_errors(tmp, rng)
        test_preprocess(tmp, rng)
    print(f'facedet-decode: {results["passed"]} passed, {results["failed"]} failed')
    sys.exit(1 if results['failed'] else 0)


if __name__ == '__main__':
    main()
