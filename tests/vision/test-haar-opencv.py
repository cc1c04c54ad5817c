#!/usr/bin/env python3
"""Our Haar detector against OpenCV's CascadeClassifier.detectMultiScale.

Builds a set of grayscale test images from scikit-image's public-domain / CC0
samples (Debian python3-skimage, or pip scikit-image): the astronaut portrait,
scaled, shifted, composed onto texture backgrounds, several faces in one image,
and images with a cat face or no face (camera, coffee, chelsea, rocket). Each is
run through OpenCV and through our detector (the C driver given as argv[1],
same cascade, same parameters); every OpenCV box must be matched by one of ours
with IoU >= 0.9 and vice versa. Exit 77 only if cv2 (with CascadeClassifier)
is not importable.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import cv2
    import numpy as np
    if not hasattr(cv2, 'CascadeClassifier'):
        raise ImportError('cv2 without CascadeClassifier (OpenCV 5 moved it out)')
except ImportError as e:
    print(f'skip: {e}')
    sys.exit(77)

IOU_MIN = 0.9


def find_dir(env, cands, probe):
    paths = [os.environ.get(env)] if os.environ.get(env) else []
    paths += cands
    for p in paths:
        if p and os.path.exists(os.path.join(p, probe)):
            return p
    return None


def skimage_dirs():
    c = ['/usr/lib/python3/dist-packages/skimage/data']
    try:
        import skimage.data
        c.insert(0, os.path.dirname(skimage.data.__file__))
    except ImportError:
        pass
    return c


def cascade_dirs():
    c = ['/usr/share/opencv4/haarcascades', '/usr/share/opencv/haarcascades']
    if hasattr(cv2, 'data'):
        c.append(cv2.data.haarcascades)
    return c


def iou(a, b):
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    iw = max(0, min(ax2, bx2) - max(a[0], b[0]))
    ih = max(0, min(ay2, by2) - max(a[1], b[1]))
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def make_images(data):
    def gray(name):
        im = cv2.imread(os.path.join(data, name), cv2.IMREAD_GRAYSCALE)
        if im is None:
            raise SystemExit(f'cannot read {name} from {data}')
        return im

    astro = gray('astronaut.png')
    imgs = {'astronaut': astro}
    imgs['astronaut-x0.6'] = cv2.resize(astro, None, fx=0.6, fy=0.6, interpolation=cv2.INTER_AREA)
    imgs['astronaut-x1.4'] = cv2.resize(astro, None, fx=1.4, fy=1.4, interpolation=cv2.INTER_CUBIC)
    shifted = np.full((600, 700), 90, np.uint8)
    shifted[60:572, 150:662] = astro
    imgs['astronaut-shifted'] = shifted
    face = astro[20:260, 100:320]  # the astronaut's head and shoulders
    brick = gray('brick.png')
    grass = gray('grass.png')
    comp = cv2.resize(grass, (800, 600))
    comp[300:540, 480:700] = face
    imgs['face-on-grass'] = comp
    multi = cv2.resize(brick, (900, 560))
    for (x, y, s) in [(20, 40, 1.0), (330, 160, 0.7), (600, 60, 1.2)]:
        f = cv2.resize(face, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
        h, w = f.shape
        multi[y:y + h, x:x + w] = f
    imgs['three-faces-on-brick'] = multi
    for name in ['camera.png', 'coffee.png', 'chelsea.png', 'rocket.jpg']:
        imgs[name.split('.')[0]] = gray(name)
    return imgs


def main():
    driver = sys.argv[1]
    data = find_dir('SKIMAGE_DATA', skimage_dirs(), 'astronaut.png')
    casc_dir = find_dir('SPINDLE_HAAR_DIR', cascade_dirs(), 'haarcascade_frontalface_default.xml')
    if data is None or casc_dir is None:
        print('FAIL: scikit-image sample images or OpenCV cascades not found '
              '(install python3-skimage and opencv-data)')
        sys.exit(1)
    cv2.setNumThreads(1)
    imgs = make_images(data)
    # (cascade, scaleFactor, minNeighbors, minSize, maxSize)
    configs = [
        ('haarcascade_frontalface_default.xml', 1.1, 3, (0, 0), (0, 0)),
        ('haarcascade_frontalface_default.xml', 1.2, 5, (40, 40), (0, 0)),
        ('haarcascade_frontalface_default.xml', 1.05, 4, (30, 30), (300, 300)),
        ('haarcascade_frontalface_alt2.xml', 1.1, 3, (0, 0), (0, 0)),
        ('haarcascade_frontalface_default.xml', 1.2, 0, (0, 0), (0, 0)),  # raw candidates, no grouping
        ('haarcascade_frontalface_alt.xml', 1.15, 2, (24, 24), (0, 0)),
        ('haarcascade_eye.xml', 1.1, 3, (0, 0), (0, 0)),
        ('haarcascade_smile.xml', 1.2, 10, (20, 20), (0, 0)),  # tilted features
        ('haarcascade_licence_plate_rus_16stages.xml', 1.1, 3, (0, 0), (0, 0)),  # old format
    ]
    passed = failed = 0
    worst = 1.0
    faces = 0
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, im in imgs.items():
            p = os.path.join(tmp, name + '.pgm')
            cv2.imwrite(p, im)
            paths[name] = p
        for (casc, sf, mn, mins, maxs) in configs:
            cpath = os.path.join(casc_dir, casc)
            clf = cv2.CascadeClassifier(cpath)
            if clf.empty():
                print(f'FAIL: OpenCV cannot load {cpath}')
                failed += 1
                continue
            for threads in ([1, 2] if casc.endswith('default.xml') and sf == 1.1 else [1]):
                out = subprocess.run([driver, cpath, str(sf), str(mn), str(mins[0]), str(mins[1]),
                                      str(maxs[0]), str(maxs[1]), str(threads)] + list(paths.values()),
                                     capture_output=True, text=True, timeout=240)
                if out.returncode != 0:
                    print(f'FAIL: driver exited {out.returncode}: {out.stderr.strip()}')
                    failed += 1
                    continue
                ours = {}
                for line in out.stdout.splitlines():
                    o = json.loads(line)
                    ours[o['file']] = o['boxes']
                for name, im in imgs.items():
                    ref = [list(map(int, r)) for r in
                           clf.detectMultiScale(im, scaleFactor=sf, minNeighbors=mn, minSize=mins, maxSize=maxs)]
                    mine = ours.get(paths[name], None)
                    label = f'{casc} sf={sf} mn={mn} min={mins} max={maxs} threads={threads} {name}'
                    if mine is None:
                        print(f'FAIL {label}: no output')
                        failed += 1
                        continue
                    ok = len(ref) == len(mine)
                    ious = []
                    for r in ref:
                        best = max((iou(r, m) for m in mine), default=0.0)
                        ious.append(best)
                        ok = ok and best >= IOU_MIN
                    for m in mine:
                        ok = ok and max((iou(r, m) for r in ref), default=0.0) >= IOU_MIN
                    if ious:
                        worst = min(worst, min(ious))
                    if mn == 0:
                        # Raw candidates: the very same set of windows.
                        ok = ok and sorted(map(tuple, ref)) == sorted(map(tuple, mine))
                    elif 'frontalface' in casc:
                        faces += len(ref)
                    status = 'ok  ' if ok else 'FAIL'
                    print(f'{status} {label}: opencv {len(ref)} ours {len(mine)} '
                          f'min IoU {min(ious) if ious else float("nan"):.3f}')
                    if not ok:
                        print(f'     opencv {sorted(ref)}\n     ours   {sorted(mine)}')
                    passed += ok
                    failed += not ok
    print(f'faces matched across configs: {faces}; worst IoU {worst:.4f}')
    print(f'haar-opencv: {passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
