#!/usr/bin/env python3
"""Mutated cascade files never crash the Haar loader or detector.

Takes OpenCV's frontal-face cascade (new format) and licence-plate cascade
(old format), and writes 150 variants each with a few numbers replaced by
hostile values (negative, huge, fractional, out-of-range indices), elements
removed, or the file truncated. Each is loaded and, if accepted, run on a small
image by the haar driver (argv[1]). Every run must end with exit 0 (accepted)
or 1 (rejected with a message naming the file) — never a signal, which under
ASan/UBSan includes any memory error. Deterministic (fixed seed).
"""
import os
import random
import re
import subprocess
import sys
import tempfile

DRIVER = sys.argv[1]
CANDS = [os.environ.get('SPINDLE_HAAR_DIR'), '/usr/share/opencv4/haarcascades']
try:
    import cv2
    CANDS.append(cv2.data.haarcascades)
except (ImportError, AttributeError):
    pass
src_dir = next((c for c in CANDS if c and os.path.exists(os.path.join(c, 'haarcascade_frontalface_default.xml'))),
               None)
if src_dir is None:
    print('FAIL: OpenCV cascades not found (install opencv-data)')
    sys.exit(1)

HOSTILE = ['-1', '-100000', '99999999', '1e30', '-1e30', 'nan', '0.5', '1e-40', '24', '25', '0', '2147483648']
NUM = re.compile(r'-?\d+\.?\d*(?:e[-+]?\d+)?')


def mutate(text, rng):
    kind = rng.randrange(4)
    if kind == 3:
        return text[:rng.randrange(len(text))]
    if kind == 2:
        tags = [m.start() for m in re.finditer(r'<(internalNodes|leafValues|rects|stageThreshold|tilted|width|'
                                               r'height|size|threshold|left_val|right_val)>', text)]
        if tags:
            i = rng.choice(tags)
            j = text.find('>', text.find('</', i)) + 1
            return text[:i] + text[j:]
    nums = [m.span() for m in NUM.finditer(text)]
    for _ in range(rng.randint(1, 4)):
        a, b = rng.choice(nums)
        text = text[:a] + rng.choice(HOSTILE) + text[b:]
        nums = [m.span() for m in NUM.finditer(text)]
    return text


def main():
    rng = random.Random(1234)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        img = os.path.join(tmp, 'img.pgm')
        w, h = 96, 72
        with open(img, 'wb') as f:
            f.write(b'P5 %d %d 255\n' % (w, h))
            f.write(bytes((x * 7 + y * 13 + (x * y) % 31) % 256 for y in range(h) for x in range(w)))
        for name in ('haarcascade_frontalface_default.xml', 'haarcascade_licence_plate_rus_16stages.xml'):
            text = open(os.path.join(src_dir, name)).read()
            accepted = 0
            for i in range(150):
                p = os.path.join(tmp, f'm{i}.xml')
                with open(p, 'w') as f:
                    f.write(mutate(text, rng))
                r = subprocess.run([DRIVER, p, '1.2', '2', '0', '0', '0', '0', '1', img],
                                   capture_output=True, text=True, timeout=60)
                ok = r.returncode in (0, 1) and (r.returncode == 0 or p in r.stderr)
                accepted += r.returncode == 0
                if not ok:
                    print(f'FAIL {name} variant {i}: exit {r.returncode}: {r.stderr[-400:]}')
                passed += ok
                failed += not ok
            print(f'{name}: 150 variants, {accepted} accepted, {150 - accepted} rejected with a message')
    print(f'haar-mutate: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
