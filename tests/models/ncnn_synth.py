"""A small ncnn model using every layer type and weight storage the
converter supports, written as the .param text and .bin bytes ncnn reads.
Shared by the converter and fetch tests."""
import struct

import numpy as np

PARAM = """7767517
17 24
Input            in     0 1 data
Split            sp     1 3 data d0 d1 d2
Convolution      c1     1 1 d0 a 0=8 1=3 4=1 5=1 6=216 9=2 -23310=1,2.000000e-01
PReLU            p1     1 1 a b 0=8
Convolution      c2     1 1 b c 0=8 1=3 11=1 4=1 14=0 5=1 6=192 9=1
ReLU             r1     1 1 c e 0=1.000000e-01
Split            sp2    1 3 e e0 e1 e2
Concat           cat    2 1 e0 d1 f 0=0
Convolution      c3     1 1 f g 0=12 1=1 5=0 6=132
PixelShuffle     ps     1 1 g h 0=2
Interp           up     1 1 d2 u 0=1 1=2.000000e+00 2=2.000000e+00
BinaryOp         add    2 1 h u s 0=0
Split            sp3    1 2 s s0 s1
Eltwise          el     2 1 s0 s1 t 0=1 -23301=2,5.000000e-01,2.500000e-01
BinaryOp         mul    1 1 t v 0=2 1=1 2=1.500000e+00
BinaryOp         rsub   1 1 v w 0=7 1=1 2=1.000000e+00
Interp           down   1 1 w output 0=3 1=5.000000e-01 2=5.000000e-01
"""

TAG_FP16 = 0x01306B47
TAG_FP32 = 0x0002C056


def weights(seed=1):
    """The .bin bytes: c1 float16 (tag), p1 slopes, c2 float32 (tag 0),
    c3 float32 (tag 0x0002C056, no bias)."""
    rng = np.random.default_rng(seed)
    out = bytearray()
    w1 = (rng.standard_normal(216) * 0.3).astype('<f2')
    out += struct.pack('<I', TAG_FP16) + w1.tobytes() + b'\0' * (-len(w1.tobytes()) % 4)
    out += (rng.standard_normal(8) * 0.1).astype('<f4').tobytes()
    out += (rng.uniform(0.0, 0.5, 8)).astype('<f4').tobytes()
    out += struct.pack('<I', 0) + (rng.standard_normal(192) * 0.3).astype('<f4').tobytes()
    out += (rng.standard_normal(8) * 0.1).astype('<f4').tobytes()
    out += struct.pack('<I', TAG_FP32) + (rng.standard_normal(132) * 0.3).astype('<f4').tobytes()
    return bytes(out)


def write(dirpath, stem='model'):
    p = f'{dirpath}/{stem}.param'
    b = f'{dirpath}/{stem}.bin'
    with open(p, 'w') as f:
        f.write(PARAM)
    with open(b, 'wb') as f:
        f.write(weights())
    return p, b
