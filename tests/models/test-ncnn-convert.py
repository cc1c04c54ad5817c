#!/usr/bin/env python3
"""`spindle model convert-ncnn`: the converted model computes what ncnn
computes on the original, and bad .param/.bin files are refused with file
and line.

Numerics: a synthetic model using every supported layer type, both weight
storages and the Split/alias rules (ncnn_synth.py) is run by ncnn's own CPU
inference (the `ncnn` PyPI package) and, converted, by ONNX Runtime; outputs
must agree to 1e-4. Without the ncnn package those checks are skipped (the
refusals are still checked). The four Real-ESRGAN models of
models/manifest.toml are compared too, on an 80x64 crop of astronaut.png: max
difference <= 2/255 on uint8 outputs, and the converted file must have the
manifest's sha256 (what `spindle model fetch` stores). Their ncnn originals
are looked for in SPINDLE_TEST_REALESRGAN_DIR, else
BUILD/test-real-models/realesrgan-ncnn (tests/models/fetch-test-assets.py,
run by tools/test.sh, puts them there); without them that part is skipped,
saying so.

usage: test-ncnn-convert.py SPINDLE
"""
import os
import subprocess
import hashlib
import sys
import tempfile
import tomllib

import numpy as np

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


def convert(spindle, p, b, out):
    r = subprocess.run([spindle, 'model', 'convert-ncnn', p, b, out], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr


def run_ncnn(p, b, x):
    import ncnn
    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.use_fp16_storage = False
    net.opt.use_fp16_packed = False
    net.opt.use_fp16_arithmetic = False
    net.opt.num_threads = 2
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    ex = net.create_extractor()
    ex.input('data', ncnn.Mat(np.ascontiguousarray(x[0])))
    rc, out = ex.extract('output')
    assert rc == 0
    return np.array(out)[None]


def run_ort(path, x):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(path, so, providers=['CPUExecutionProvider'])
    return s.run(None, {'input': x})[0]


def refusals(spindle, tmp):
    p, b = ncnn_synth.write(tmp, 'ok')
    good = open(p).read()
    bin_ = open(b, 'rb').read()
    out = os.path.join(tmp, 'bad.onnx')

    def case(param_text, bin_bytes, want, label):
        bp, bb = os.path.join(tmp, 'bad.param'), os.path.join(tmp, 'bad.bin')
        with open(bp, 'w') as f:
            f.write(param_text)
        with open(bb, 'wb') as f:
            f.write(bin_bytes)
        if os.path.exists(out):
            os.unlink(out)
        rc, err = convert(spindle, bp, bb, out)
        check(rc == 1 and all(w in err for w in want) and not os.path.exists(out),
              f'{label}: refused ({err.strip()[:150]})')

    lines = good.splitlines()
    case(good.replace('PixelShuffle     ps     1 1 g h 0=2', 'Deconvolution    ps     1 1 g h 0=2'), bin_,
         ['bad.param:12:', "'Deconvolution'", "'ps'"], 'unknown layer type named with file, line and layer')
    case('7767518\n' + '\n'.join(lines[1:]), bin_, ['bad.param:1:', 'magic'], 'wrong magic number')
    case(good, bin_[:-20], ['bad.param:11:', 'bad.bin', 'ends inside'], 'truncated .bin')
    case(good, bin_ + b'\0' * 8, ['bad.bin', '8 bytes left over'], '.bin longer than the .param says')
    case(good, b'\x38\x4b\x0d\x00' + bin_[4:], ['bad.param:5:', 'int8'], 'int8 weights tag')
    case(good.replace('6=216 9=2', '6=215 9=2'), bin_, ['bad.param:5:', 'weight_data_size'],
         'weight count that does not fit the kernel')
    case(good.replace('0=1 -23301=2,5.000000e-01,2.500000e-01', '0=1 -23301=3,5.000000e-01,2.500000e-01'), bin_,
         ['bad.param:16:', 'fewer than 3'], 'array parameter shorter than its count')
    case(good.replace('1 1 d2 u', '1 1 zz u'), bin_, ['bad.param:13:', "'zz'", 'before'],
         'blob used before it is produced')
    case(good.replace('5=1 6=192 9=1', '5=1 6=192 9=1 8=1'), bin_, ['bad.param:7:', 'parameter 8'],
         'unsupported (int8) convolution parameter')
    case(good.replace('17 24', '18 24'), bin_, ['18 layers declared, 17 found'], 'layer count mismatch')


def main():
    spindle = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        refusals(spindle, tmp)
        p, b = ncnn_synth.write(tmp)
        out = os.path.join(tmp, 'synth.onnx')
        rc, err = convert(spindle, p, b, out)
        check(rc == 0 and os.path.getsize(out) > 0, f'synthetic model converts ({err.strip()[:200]})')
        out2 = os.path.join(tmp, 'synth2.onnx')
        convert(spindle, p, b, out2)
        check(open(out, 'rb').read() == open(out2, 'rb').read(), 'conversion is deterministic (same bytes twice)')
        try:
            import ncnn  # noqa: F401
        except ImportError:
            print('note: the ncnn package is not installed; numeric checks skipped')
            return 1 if failed else (0 if passed else 77)
        rng = np.random.default_rng(3)
        # h*w a multiple of 4: the ncnn Python binding wraps a NumPy array whose
        # channel stride is not 16-byte aligned incorrectly past channel 0.
        for h, w in ((16, 20), (9, 12)):
            x = rng.uniform(0, 1, (1, 3, h, w)).astype(np.float32)
            a = run_ncnn(p, b, x)
            o = run_ort(out, x)
            check(a.shape == o.shape == (1, 3, h, w), f'{h}x{w}: shapes ncnn {a.shape} onnx {o.shape}')
            d = float(np.abs(a - o).max()) if a.shape == o.shape else 1e9
            check(d <= 1e-4, f'{h}x{w}: converted model vs ncnn max |diff| {d:.2e} <= 1e-4')
        real = os.environ.get('SPINDLE_TEST_REALESRGAN_DIR') or \
            os.path.join(os.environ.get('SPINDLE_BUILD_ROOT', ''), 'test-real-models', 'realesrgan-ncnn')
        root = os.environ.get('SPINDLE_SOURCE_ROOT', os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
        with open(os.path.join(root, 'models', 'manifest.toml'), 'rb') as f:
            manifest = tomllib.load(f)
        if os.path.isfile(os.path.join(real, 'realesr-animevideov3-x2.param')):
            import cv2
            img = cv2.imread(os.path.join(os.environ.get('SKIMAGE_DATA', '/usr/lib/python3/dist-packages/skimage/data'),
                                          'astronaut.png'))[100:164, 180:260, ::-1]
            x = (img.astype(np.float32) / 255).transpose(2, 0, 1)[None].copy()
            for m in ('realesr-animevideov3-x2', 'realesr-animevideov3-x3', 'realesr-animevideov3-x4',
                      'realesrgan-x4plus'):
                rp, rb = os.path.join(real, m + '.param'), os.path.join(real, m + '.bin')
                ro = os.path.join(tmp, m + '.onnx')
                rc, err = convert(spindle, rp, rb, ro)
                check(rc == 0, f'{m}: converts ({err.strip()[:200]})')
                if rc:
                    continue
                with open(ro, 'rb') as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                check(digest == manifest[m]['sha256'], f'{m}: the converted file has the manifest\'s sha256')
                a, o = run_ncnn(rp, rb, x), run_ort(ro, x)
                q = lambda v: np.clip(np.rint(v * 255), 0, 255).astype(np.int16)  # noqa: E731
                d = int(np.abs(q(a) - q(o)).max())
                check(d <= 2, f'{m}: uint8 output vs ncnn max |diff| {d} <= 2 (float {np.abs(a - o).max():.2e})')
                if m.startswith('realesr-animevideov3'):
                    # And as Spindle's engine runs it (the model superres uses);
                    # x4plus takes about a minute here, so ONNX Runtime only.
                    np.save(os.path.join(tmp, 'x.npy'), x)
                    od = os.path.join(tmp, m + '-out')
                    r = subprocess.run([spindle, 'model', 'run', ro, '--input', f'input={tmp}/x.npy',
                                        '--output-dir', od, '--threads', '2'], capture_output=True, text=True, timeout=300)
                    s_out = np.load(os.path.join(od, 'output.npy')) if r.returncode == 0 else None
                    d = int(np.abs(q(a) - q(s_out)).max()) if s_out is not None and s_out.shape == a.shape else 999
                    check(d <= 2, f'{m}: Spindle engine uint8 output vs ncnn max |diff| {d} <= 2 '
                                  f'({r.stderr.strip()[-200:] if r.returncode else "float %.2e" % np.abs(a - s_out).max()})')
        else:
            print(f'note: the Real-ESRGAN ncnn files are not in {real} (tests/models/fetch-test-assets.py); '
                  'the real models are not compared')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
