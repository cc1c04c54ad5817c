#!/usr/bin/env python3
"""Haar face detection: Spindle's detector beside OpenCV's detectMultiScale.

Same cascade (haarcascade_frontalface_default.xml), same images, same
parameters (scaleFactor 1.1, minNeighbors 3), same thread count: OpenCV with
cv2.setNumThreads(n), ours with params.threads = n, for n = 1 and 2. The two
are timed in alternating rounds of REPEAT detections and each keeps its best
round, so a busy machine disturbs both alike. Prints milliseconds per
detection and the ratio ours/OpenCV (< 1 is faster). Not a test: it never
fails on timings.

    haar-bench.py HAAR_DRIVER [REPEAT] [ROUNDS]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import cv2
import numpy as np


def find(cands, probe):
    for p in cands:
        if p and os.path.exists(os.path.join(p, probe)):
            return p
    sys.exit(f'haar-bench: {probe} not found')


def main():
    driver = sys.argv[1]
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    data = find([os.environ.get('SKIMAGE_DATA'), '/usr/lib/python3/dist-packages/skimage/data'], 'astronaut.png')
    cdir = find([os.environ.get('SPINDLE_HAAR_DIR'), '/usr/share/opencv4/haarcascades',
                 getattr(getattr(cv2, 'data', None), 'haarcascades', None)], 'haarcascade_frontalface_default.xml')
    cascade = os.path.join(cdir, 'haarcascade_frontalface_default.xml')
    astro = cv2.imread(os.path.join(data, 'astronaut.png'), cv2.IMREAD_GRAYSCALE)
    coffee = cv2.imread(os.path.join(data, 'coffee.png'), cv2.IMREAD_GRAYSCALE)
    hd = cv2.resize(cv2.imread(os.path.join(data, 'hubble_deep_field.jpg'), cv2.IMREAD_GRAYSCALE), (1280, 720))
    hd[100:612, 600:1112] = astro
    imgs = {'astronaut 512x512': astro, 'coffee 600x400': coffee, 'composite 1280x720': hd}
    clf = cv2.CascadeClassifier(cascade)
    print(f'cascade {os.path.basename(cascade)}, scaleFactor 1.1, minNeighbors 3, '
          f'best of {rounds} rounds of {repeat} runs each')
    print(f'{"image":22s} {"threads":>7s} {"opencv ms":>10s} {"spindle ms":>10s} {"ratio":>6s}')
    with tempfile.TemporaryDirectory() as tmp:
        for name, im in imgs.items():
            p = os.path.join(tmp, 'img.pgm')
            cv2.imwrite(p, im)
            for threads in (1, 2):
                cv2.setNumThreads(threads)
                clf.detectMultiScale(im, 1.1, 3)
                cv_ms = ours = float('inf')
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    for _ in range(repeat):
                        clf.detectMultiScale(im, 1.1, 3)
                    cv_ms = min(cv_ms, (time.perf_counter() - t0) * 1e3 / repeat)
                    out = subprocess.run([driver, cascade, '1.1', '3', '0', '0', '0', '0', str(threads),
                                          '--repeat', str(repeat), p], capture_output=True, text=True, check=True)
                    ours = min(ours, json.loads(out.stdout.splitlines()[-1])['ms'])
                print(f'{name:22s} {threads:7d} {cv_ms:10.2f} {ours:10.2f} {ours / cv_ms:6.2f}')


if __name__ == '__main__':
    main()
