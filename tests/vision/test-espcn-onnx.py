#!/usr/bin/env python3
"""The embedded super-resolution model models/espcn-x2.onnx, run with ONNX Runtime.

Checks:
  1. The file is < 1 MB, opset 13..17 when the onnx package is present, and its
     input/output are (batch, 3, height, width) with dynamic batch/height/width.
  2. ONNX Runtime reproduces the PyTorch outputs that tools/train-espcn.py saved
     at export time (tests/vision/data/espcn-x2-ref.npz) within 1e-4.
  3. On the held-out images (never trained on: coffee, chelsea, camera from
     scikit-image), x2 upscaling of the 2x2-area-downsampled image beats
     bicubic upscaling (OpenCV INTER_CUBIC) in PSNR on every image.
Prints the PSNR table docs/superres.md quotes. Exit 77 if onnxruntime or cv2 is
not importable.
"""
import os
import sys

try:
    import cv2
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f'skip: {e}')
    sys.exit(77)

ROOT = os.environ.get('SPINDLE_SOURCE_ROOT', os.path.join(os.path.dirname(__file__), '..', '..'))
MODEL = os.path.join(ROOT, 'models', 'espcn-x2.onnx')
REF = os.path.join(ROOT, 'tests', 'vision', 'data', 'espcn-x2-ref.npz')
HELD_OUT = ['coffee.png', 'chelsea.png', 'camera.png']
passed = failed = 0


def check(cond, label):
    global passed, failed
    print(('ok   ' if cond else 'FAIL ') + label)
    if cond:
        passed += 1
    else:
        failed += 1


def skimage_data():
    cands = [os.environ.get('SKIMAGE_DATA'), '/usr/lib/python3/dist-packages/skimage/data']
    try:
        import skimage.data
        cands.insert(0, os.path.dirname(skimage.data.__file__))
    except ImportError:
        pass
    for c in cands:
        if c and os.path.exists(os.path.join(c, 'coffee.png')):
            return c
    return None


def psnr(a, b):
    mse = float(np.mean((np.clip(a, 0, 1) - b) ** 2))
    return 10 * np.log10(1.0 / mse)


def main():
    size = os.path.getsize(MODEL)
    check(size < 1 << 20, f'model size {size} bytes < 1 MiB')
    try:
        import onnx
        m = onnx.load(MODEL)
        opset = max(o.version for o in m.opset_import if o.domain in ('', 'ai.onnx'))
        ops = sorted({n.op_type for n in m.graph.node})
        check(13 <= opset <= 17 and 'DepthToSpace' in ops, f'opset {opset}, ops {ops}')
    except ImportError:
        print('note: onnx not installed, opset not checked')
    sess = ort.InferenceSession(MODEL, providers=['CPUExecutionProvider'])
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    dyn = [isinstance(d, str) for d in inp.shape]
    check(len(inp.shape) == 4 and inp.shape[1] == 3 and dyn == [True, False, True, True] and
          inp.type == 'tensor(float)', f'input {inp.name} {inp.shape} {inp.type}; output {out.name} {out.shape}')

    ref = np.load(REF)
    y = sess.run(None, {inp.name: ref['input']})[0]
    err = float(np.abs(y - ref['output']).max())
    check(y.shape == ref['output'].shape and err <= 1e-4,
          f'ONNX Runtime vs PyTorch on a {ref["input"].shape} batch: max abs error {err:.2e}')

    data = skimage_data()
    if data is None:
        check(False, 'scikit-image sample images not found (install python3-skimage)')
    else:
        print(f'{"held-out image":16s} {"size":>9s} {"bicubic dB":>10s} {"espcn-x2 dB":>11s} {"gain":>6s}')
        for name in HELD_OUT:
            bgr = cv2.imread(os.path.join(data, name), cv2.IMREAD_COLOR)
            rgb = bgr[:, :, ::-1].astype(np.float32) / 255.0
            h, w = rgb.shape[0] // 2 * 2, rgb.shape[1] // 2 * 2
            hr = rgb[:h, :w]
            lr = hr.reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3)).astype(np.float32)
            bic = cv2.resize(lr, (w, h), interpolation=cv2.INTER_CUBIC)
            sr = sess.run(None, {inp.name: lr.transpose(2, 0, 1)[None]})[0][0].transpose(1, 2, 0)
            pb, ps = psnr(bic, hr), psnr(sr, hr)
            print(f'{name:16s} {w:4d}x{h:<4d} {pb:10.2f} {ps:11.2f} {ps - pb:+6.2f}')
            check(ps > pb, f'{name}: model {ps:.2f} dB beats bicubic {pb:.2f} dB')
    print(f'espcn-onnx: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
