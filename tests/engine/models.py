"""Whole-model ONNX builders for the engine's conformance suite and benchmark.

Each builder writes the network the way the public PyTorch exports lay it out
(Conv + BatchNormalization + activation, dynamic batch dimension, resize by
shapes computed in the graph) with random weights, at any width/depth, so the
tests use small versions and the benchmark the full-size ones. Architectures
follow the papers: Wav2Lip (Prajwal et al. 2020), RetinaFace with a
MobileNet-0.25 backbone (Deng et al. 2019), Real-ESRGAN's RRDBNet and
SRVGGNetCompact (Wang et al. 2021).
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class G:
    """A tiny graph builder: every method appends nodes and returns names."""

    def __init__(self, seed=0):
        self.nodes, self.inits, self.n = [], [], 0
        self.rng = np.random.default_rng(seed)

    def name(self, p):
        self.n += 1
        return f"{p}_{self.n}"

    def const(self, arr, p="c"):
        nm = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name("n_" + op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x, cin, cout, k, s=1, p=0, groups=1, bias=True):
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (s, s) if isinstance(s, int) else s
        fan = cin // groups * kh * kw
        w = (self.rng.standard_normal((cout, cin // groups, kh, kw)) * np.sqrt(2.0 / fan)).astype(np.float32)
        ins = [x, self.const(w, "w")]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.05).astype(np.float32), "b"))
        return self.op("Conv", ins, kernel_shape=[kh, kw], strides=[sh, sw], pads=[p, p, p, p], group=groups)

    def convt(self, x, cin, cout, k, s, p, op_=0):
        w = (self.rng.standard_normal((cin, cout, k, k)) * np.sqrt(2.0 / (cin * k * k / (s * s)))).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32)
        return self.op("ConvTranspose", [x, self.const(w, "w"), self.const(b, "b")], kernel_shape=[k, k],
                       strides=[s, s], pads=[p, p, p, p], output_padding=[op_, op_])

    def bn(self, x, c, gscale=1.0):
        r = self.rng
        g = (r.uniform(0.5, 1.5, c) * gscale).astype(np.float32)
        b = (r.standard_normal(c) * 0.1).astype(np.float32)
        m = (r.standard_normal(c) * 0.1).astype(np.float32)
        v = r.uniform(0.5, 1.5, c).astype(np.float32)
        return self.op("BatchNormalization", [x] + [self.const(a, "bn") for a in (g, b, m, v)], epsilon=1e-5)

    def relu(self, x):
        return self.op("Relu", [x])

    def lrelu(self, x, a):
        return self.op("LeakyRelu", [x], alpha=a)

    def add(self, a, b):
        return self.op("Add", [a, b])

    def mul_scalar(self, x, s):
        return self.op("Mul", [x, self.const(np.array(s, np.float32), "s")])

    def resize_scale(self, x, s):
        roi = self.const(np.zeros(0, np.float32), "roi")
        sc = self.const(np.array([1, 1, s, s], np.float32), "scales")
        return self.op("Resize", [x, roi, sc], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")

    def resize_like(self, x, ref):
        """Nearest resize of x to ref's spatial size, sizes computed in-graph."""
        sx = self.op("Shape", [x])
        sr = self.op("Shape", [ref])
        nc = self.op("Slice", [sx, self.const(np.array([0], np.int64)), self.const(np.array([2], np.int64))])
        hw = self.op("Slice", [sr, self.const(np.array([2], np.int64)), self.const(np.array([4], np.int64))])
        sizes = self.op("Concat", [nc, hw], axis=0)
        roi = self.const(np.zeros(0, np.float32), "roi")
        return self.op("Resize", [x, roi, "", sizes], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")

    def model(self, inputs, outputs):
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="spindle-tests")
        m.ir_version = 8
        return m


def vi(name, shape, dt=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


# ---- SRVGGNetCompact ----
def srvgg(feat=64, nconv=32, scale=4, seed=1, down=None):
    """SRVGGNetCompact (realesr-animevideov3); with down, a bicubic Resize by
    that factor after it, as the x2/x3 models fetched from PyPI end (the x4
    network, then 0.5 or 0.75)."""
    g = G(seed)
    x = "input"
    h = g.conv(x, 3, feat, 3, 1, 1)
    slope = lambda: g.const((0.25 + 0.05 * g.rng.standard_normal((feat, 1, 1))).astype(np.float32), "prelu")
    h = g.op("PRelu", [h, slope()])
    for _ in range(nconv):
        h = g.conv(h, feat, feat, 3, 1, 1)
        h = g.op("PRelu", [h, slope()])
    h = g.conv(h, feat, 3 * scale * scale, 3, 1, 1)
    h = g.op("DepthToSpace", [h], blocksize=scale, mode="CRD")
    base = g.resize_scale(x, scale)
    out = g.op("Add", [h, base])
    if down:
        roi = g.const(np.zeros(0, np.float32), "roi")
        sc = g.const(np.array([1, 1, down, down], np.float32), "scales")
        out = g.op("Resize", [out, roi, sc], mode="cubic", coordinate_transformation_mode="half_pixel",
                   cubic_coeff_a=-0.75)
    g.nodes[-1].output[0] = "output"
    return g.model([vi("input", ["N", 3, "H", "W"])], [vi("output", None)])


# ---- RRDBNet ----
def rrdbnet(feat=64, grow=32, nblock=23, seed=2):
    g = G(seed)

    def rdb(x):
        xs = [x]
        for i in range(4):
            cat = xs[0] if len(xs) == 1 else g.op("Concat", xs, axis=1)
            h = g.lrelu(g.conv(cat, feat + i * grow, grow, 3, 1, 1), 0.2)
            xs.append(h)
        x5 = g.conv(g.op("Concat", xs, axis=1), feat + 4 * grow, feat, 3, 1, 1)
        return g.add(g.mul_scalar(x5, 0.2), x)

    f = g.conv("input", 3, feat, 3, 1, 1)
    h = f
    for _ in range(nblock):
        o = rdb(rdb(rdb(h)))
        h = g.add(g.mul_scalar(o, 0.2), h)
    h = g.add(f, g.conv(h, feat, feat, 3, 1, 1))
    h = g.lrelu(g.conv(g.resize_scale(h, 2), feat, feat, 3, 1, 1), 0.2)
    h = g.lrelu(g.conv(g.resize_scale(h, 2), feat, feat, 3, 1, 1), 0.2)
    h = g.conv(g.lrelu(g.conv(h, feat, feat, 3, 1, 1), 0.2), feat, 3, 3, 1, 1)
    g.nodes[-1].output[0] = "output"
    return g.model([vi("input", ["N", 3, "H", "W"])], [vi("output", None)])


# ---- RetinaFace, MobileNet-0.25 ----
def retinaface(seed=3, out_ch=64):
    g = G(seed)

    def conv_bn(x, ci, co, k, s, p, leak=0.1, groups=1, act=True):
        h = g.bn(g.conv(x, ci, co, k, s, p, groups=groups, bias=False), co)
        return g.lrelu(h, leak) if act else h

    def conv_dw(x, ci, co, s):
        h = conv_bn(x, ci, ci, 3, s, 1, groups=ci)
        return conv_bn(h, ci, co, 1, 1, 0)

    x = conv_bn("input", 3, 8, 3, 2, 1)
    for ci, co, s in [(8, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]:
        x = conv_dw(x, ci, co, s)
    c1 = x
    x = conv_dw(x, 64, 128, 2)
    for _ in range(5):
        x = conv_dw(x, 128, 128, 1)
    c2 = x
    x = conv_dw(x, 128, 256, 2)
    c3 = conv_dw(x, 256, 256, 1)
    leak = 0.1 if out_ch <= 64 else 0.0
    o1 = conv_bn(c1, 64, out_ch, 1, 1, 0, leak)
    o2 = conv_bn(c2, 128, out_ch, 1, 1, 0, leak)
    o3 = conv_bn(c3, 256, out_ch, 1, 1, 0, leak)
    o2 = conv_bn(g.add(o2, g.resize_like(o3, o2)), out_ch, out_ch, 3, 1, 1, leak)
    o1 = conv_bn(g.add(o1, g.resize_like(o2, o1)), out_ch, out_ch, 3, 1, 1, leak)

    def ssh(x):
        a = conv_bn(x, out_ch, out_ch // 2, 3, 1, 1, act=False)
        b1 = conv_bn(x, out_ch, out_ch // 4, 3, 1, 1, leak)
        b = conv_bn(b1, out_ch // 4, out_ch // 4, 3, 1, 1, act=False)
        c1_ = conv_bn(b1, out_ch // 4, out_ch // 4, 3, 1, 1, leak)
        c = conv_bn(c1_, out_ch // 4, out_ch // 4, 3, 1, 1, act=False)
        return g.relu(g.op("Concat", [a, b, c], axis=1))

    feats = [ssh(o1), ssh(o2), ssh(o3)]

    def head(f, k):
        h = g.conv(f, out_ch, 2 * k, 1, 1, 0)
        h = g.op("Transpose", [h], perm=[0, 2, 3, 1])
        n = g.op("Slice", [g.op("Shape", [h]), g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64))])
        shape = g.op("Concat", [n, g.const(np.array([-1, k], np.int64))], axis=0)
        return g.op("Reshape", [h, shape])

    outs = []
    for k, nm in [(4, "bbox"), (2, "conf"), (10, "landmarks")]:
        cat = g.op("Concat", [head(f, k) for f in feats], axis=1)
        if nm == "conf":
            cat = g.op("Softmax", [cat], axis=-1)
        g.nodes[-1].output[0] = nm
        outs.append(vi(nm, None))
    return g.model([vi("input", ["N", 3, "H", "W"])], outs)


# ---- Wav2Lip ----
def wav2lip(width=1.0, seed=4):
    g = G(seed)
    C = lambda c: max(2, int(round(c * width)))

    def block(x, ci, co, k, s, p, res=False):
        # Residual branches start small (as trained networks have them), which
        # keeps random-weight activations O(1) through the deep stack.
        h = g.bn(g.conv(x, ci, co, k, s, p), co, 0.2 if res else 1.0)
        if res:
            h = g.add(h, x)
        return g.relu(h)

    def tblock(x, ci, co, k, s, p, op_):
        return g.relu(g.bn(g.convt(x, ci, co, k, s, p, op_), co))

    # face encoder
    x = "face"
    feats = []  # (name, channels)
    spec = [
        [(6, 16, 7, 1, 3, 0)],
        [(16, 32, 3, 2, 1, 0), (32, 32, 3, 1, 1, 1), (32, 32, 3, 1, 1, 1)],
        [(32, 64, 3, 2, 1, 0)] + [(64, 64, 3, 1, 1, 1)] * 3,
        [(64, 128, 3, 2, 1, 0)] + [(128, 128, 3, 1, 1, 1)] * 2,
        [(128, 256, 3, 2, 1, 0)] + [(256, 256, 3, 1, 1, 1)] * 2,
        [(256, 512, 3, 2, 1, 0), (512, 512, 3, 1, 1, 1)],
        [(512, 512, 3, 1, 0, 0), (512, 512, 1, 1, 0, 0)],
    ]
    for stage in spec:
        for ci, co, k, s, p, res in stage:
            x = block(x, 6 if ci == 6 else C(ci), C(co), k, s, p, bool(res))
        feats.append((x, C(stage[-1][1])))
    # audio encoder
    a = "mel"
    aspec = [(1, 32, 3, 1, 1, 0), (32, 32, 3, 1, 1, 1), (32, 32, 3, 1, 1, 1),
             (32, 64, 3, (3, 1), 1, 0), (64, 64, 3, 1, 1, 1), (64, 64, 3, 1, 1, 1),
             (64, 128, 3, 3, 1, 0), (128, 128, 3, 1, 1, 1), (128, 128, 3, 1, 1, 1),
             (128, 256, 3, (3, 2), 1, 0), (256, 256, 3, 1, 1, 1),
             (256, 512, 3, 1, 0, 0), (512, 512, 1, 1, 0, 0)]
    for ci, co, k, s, p, res in aspec:
        a = block(a, 1 if ci == 1 else C(ci), C(co), k, s, p, bool(res))
    # decoder: each stage upsamples and concatenates the matching face feature
    h = block(a, C(512), C(512), 1, 1, 0)
    f, fc = feats.pop()
    h = g.op("Concat", [h, f], axis=1)
    cin = C(512) + fc
    for co, s, p, op_, nres in [(512, 1, 0, 0, 1), (512, 2, 1, 1, 2), (384, 2, 1, 1, 2),
                                (256, 2, 1, 1, 2), (128, 2, 1, 1, 2), (64, 2, 1, 1, 2)]:
        h = tblock(h, cin, C(co), 3, s, p, op_)
        for _ in range(nres):
            h = block(h, C(co), C(co), 3, 1, 1, True)
        f, fc = feats.pop()
        h = g.op("Concat", [h, f], axis=1)
        cin = C(co) + fc
    h = block(h, cin, C(32), 3, 1, 1)
    h = g.conv(h, C(32), 3, 1, 1, 0)
    g.op("Sigmoid", [h])
    g.nodes[-1].output[0] = "output"
    return g.model([vi("mel", ["N", 1, 80, 16]), vi("face", ["N", 6, 96, 96])], [vi("output", None)])
