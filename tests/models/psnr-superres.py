#!/usr/bin/env python3
"""PSNR of super-resolution models run by Spindle's engine (`spindle model
run`) against OpenCV bicubic, on scikit-image's held-out images (the ones
espcn-x2 was not trained on): the 2x2 area average of each image is upscaled
back and compared with the original (RGB, whole image), as
tests/vision/test-espcn-onnx.py does for espcn-x2.

usage: psnr-superres.py SPINDLE MODEL.onnx [MODEL.onnx ...]   (x2 models)
Prints a Markdown table (docs/superres.md).
"""
import os
import subprocess
import sys
import tempfile

import cv2
import numpy as np

HELD_OUT = ['coffee.png', 'chelsea.png', 'camera.png']


def psnr(a, b):
    return 10 * np.log10(1.0 / float(np.mean((np.clip(a, 0, 1) - b) ** 2)))


def main():
    spindle, models = sys.argv[1], sys.argv[2:]
    data = os.environ.get('SKIMAGE_DATA', '/usr/lib/python3/dist-packages/skimage/data')
    names = [os.path.splitext(os.path.basename(m))[0] for m in models]
    print('| held-out image | size | bicubic | ' + ' | '.join(names) + ' |')
    print('|---|---|---|' + '---|' * len(names))
    with tempfile.TemporaryDirectory() as tmp:
        for img in HELD_OUT:
            rgb = cv2.imread(os.path.join(data, img), cv2.IMREAD_COLOR)[:, :, ::-1].astype(np.float32) / 255
            h, w = rgb.shape[0] // 2 * 2, rgb.shape[1] // 2 * 2
            hr = rgb[:h, :w]
            lr = hr.reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3)).astype(np.float32)
            bic = cv2.resize(lr, (w, h), interpolation=cv2.INTER_CUBIC)
            np.save(os.path.join(tmp, 'in.npy'), np.ascontiguousarray(lr.transpose(2, 0, 1)[None]))
            row = [f'{psnr(bic, hr):.2f}']
            for m in models:
                subprocess.run([spindle, 'model', 'run', m, '--input', f'input={tmp}/in.npy', '--output-dir', tmp],
                               check=True, capture_output=True)
                sr = np.load(os.path.join(tmp, 'output.npy'))[0].transpose(1, 2, 0)
                row.append(f'{psnr(sr, hr):.2f}')
            print(f'| {img} | {w}x{h} | ' + ' | '.join(row) + ' |')


if __name__ == '__main__':
    main()
