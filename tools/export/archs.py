"""Network definitions for exporting public checkpoints to ONNX.

The modules are written from the architecture descriptions in the papers
(Wav2Lip: Prajwal et al., ACM MM 2020; RetinaFace: Deng et al., CVPR 2020,
with the MobileNet-0.25 backbone of the widely used PyTorch port; Real-ESRGAN:
Wang et al., ICCVW 2021, for RRDBNet and SRVGGNetCompact). Attribute names
follow the layout of the published state dicts so `load_state_dict` accepts
them as they are. Requires PyTorch; not used by the build or the tests.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- Wav2Lip --
class ConvBlock(nn.Module):
    """Conv2d + BatchNorm + ReLU, optionally adding the block input first."""

    def __init__(self, cin, cout, k, s, p, residual=False):
        super().__init__()
        self.conv_block = nn.Sequential(nn.Conv2d(cin, cout, k, s, p), nn.BatchNorm2d(cout))
        self.residual = residual

    def forward(self, x):
        y = self.conv_block(x)
        return F.relu(y + x if self.residual else y)


class TConvBlock(nn.Module):
    """ConvTranspose2d + BatchNorm + ReLU."""

    def __init__(self, cin, cout, k, s, p, op=0):
        super().__init__()
        self.conv_block = nn.Sequential(nn.ConvTranspose2d(cin, cout, k, s, p, op), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.conv_block(x))


def _stage(spec):
    return nn.Sequential(*[ConvBlock(ci, co, k, s, p, bool(r)) for ci, co, k, s, p, r in spec])


class Wav2Lip(nn.Module):
    """Face encoder (96x96, 6 channels: masked target + reference), audio
    encoder (80x16 mel window) and a decoder with skip connections.
    Inputs: mel (N,1,80,16), face (N,6,96,96) BGR in [0,1]. Output (N,3,96,96)."""

    def __init__(self):
        super().__init__()
        r3 = lambda c: (c, c, 3, 1, 1, 1)
        self.face_encoder_blocks = nn.ModuleList([
            _stage([(6, 16, 7, 1, 3, 0)]),
            _stage([(16, 32, 3, 2, 1, 0), r3(32), r3(32)]),
            _stage([(32, 64, 3, 2, 1, 0), r3(64), r3(64), r3(64)]),
            _stage([(64, 128, 3, 2, 1, 0), r3(128), r3(128)]),
            _stage([(128, 256, 3, 2, 1, 0), r3(256), r3(256)]),
            _stage([(256, 512, 3, 2, 1, 0), r3(512)]),
            _stage([(512, 512, 3, 1, 0, 0), (512, 512, 1, 1, 0, 0)]),
        ])
        self.audio_encoder = _stage([
            (1, 32, 3, 1, 1, 0), r3(32), r3(32),
            (32, 64, 3, (3, 1), 1, 0), r3(64), r3(64),
            (64, 128, 3, 3, 1, 0), r3(128), r3(128),
            (128, 256, 3, (3, 2), 1, 0), r3(256),
            (256, 512, 3, 1, 0, 0), (512, 512, 1, 1, 0, 0)])

        def dec(cin, cout, s, p, op, nres):
            return nn.Sequential(TConvBlock(cin, cout, 3, s, p, op), *[ConvBlock(*r3(cout)) for _ in range(nres)])

        self.face_decoder_blocks = nn.ModuleList([
            _stage([(512, 512, 1, 1, 0, 0)]),
            dec(1024, 512, 1, 0, 0, 1),
            dec(1024, 512, 2, 1, 1, 2),
            dec(768, 384, 2, 1, 1, 2),
            dec(512, 256, 2, 1, 1, 2),
            dec(320, 128, 2, 1, 1, 2),
            dec(160, 64, 2, 1, 1, 2),
        ])
        self.output_block = nn.Sequential(ConvBlock(80, 32, 3, 1, 1), nn.Conv2d(32, 3, 1), nn.Sigmoid())

    def forward(self, mel, face):
        feats = []
        x = face
        for b in self.face_encoder_blocks:
            x = b(x)
            feats.append(x)
        x = self.audio_encoder(mel)
        for b in self.face_decoder_blocks:
            x = torch.cat([b(x), feats.pop()], dim=1)
        return self.output_block(x)


# ------------------------------------------------- RetinaFace / MobileNet0.25
def conv_bn(cin, cout, s=1, leaky=0.0, k=3, p=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.LeakyReLU(negative_slope=leaky, inplace=True))
    return nn.Sequential(*layers)


def conv_dw(cin, cout, s, leaky=0.1):
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, s, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.LeakyReLU(leaky, True),
        nn.Conv2d(cin, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(leaky, True))


class MobileNetV1x025(nn.Module):
    def __init__(self):
        super().__init__()
        self.stage1 = nn.Sequential(conv_bn(3, 8, 2, 0.1), conv_dw(8, 16, 1), conv_dw(16, 32, 2), conv_dw(32, 32, 1),
                                    conv_dw(32, 64, 2), conv_dw(64, 64, 1))
        self.stage2 = nn.Sequential(conv_dw(64, 128, 2), *[conv_dw(128, 128, 1) for _ in range(5)])
        self.stage3 = nn.Sequential(conv_dw(128, 256, 2), conv_dw(256, 256, 1))

    def forward(self, x):
        c1 = self.stage1(x)
        c2 = self.stage2(c1)
        return c1, c2, self.stage3(c2)


class FPN(nn.Module):
    def __init__(self, cins, cout):
        super().__init__()
        leaky = 0.1 if cout <= 64 else 0.0
        self.output1 = conv_bn(cins[0], cout, 1, leaky, 1, 0)
        self.output2 = conv_bn(cins[1], cout, 1, leaky, 1, 0)
        self.output3 = conv_bn(cins[2], cout, 1, leaky, 1, 0)
        self.merge1 = conv_bn(cout, cout, 1, leaky)
        self.merge2 = conv_bn(cout, cout, 1, leaky)

    def forward(self, c1, c2, c3):
        o1, o2, o3 = self.output1(c1), self.output2(c2), self.output3(c3)
        o2 = self.merge2(o2 + F.interpolate(o3, size=o2.shape[2:], mode="nearest"))
        o1 = self.merge1(o1 + F.interpolate(o2, size=o1.shape[2:], mode="nearest"))
        return o1, o2, o3


class SSH(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        leaky = 0.1 if cout <= 64 else 0.0
        self.conv3X3 = conv_bn(cin, cout // 2, act=False)
        self.conv5X5_1 = conv_bn(cin, cout // 4, leaky=leaky)
        self.conv5X5_2 = conv_bn(cout // 4, cout // 4, act=False)
        self.conv7X7_2 = conv_bn(cout // 4, cout // 4, leaky=leaky)
        self.conv7x7_3 = conv_bn(cout // 4, cout // 4, act=False)

    def forward(self, x):
        a = self.conv3X3(x)
        b1 = self.conv5X5_1(x)
        b = self.conv5X5_2(b1)
        c = self.conv7x7_3(self.conv7X7_2(b1))
        return F.relu(torch.cat([a, b, c], dim=1))


class Head(nn.Module):
    def __init__(self, cin, anchors, k):
        super().__init__()
        self.conv1x1 = nn.Conv2d(cin, anchors * k, 1)
        self.k = k

    def forward(self, x):
        y = self.conv1x1(x).permute(0, 2, 3, 1).contiguous()
        return y.view(y.shape[0], -1, self.k)


class RetinaFace(nn.Module):
    """Input (N,3,H,W) BGR minus the mean (104,117,123). Outputs, per prior:
    bbox (N,P,4) offsets, conf (N,P,2) softmax scores, landmarks (N,P,10)."""

    def __init__(self, cout=64):
        super().__init__()
        self.body = MobileNetV1x025()
        self.fpn = FPN([64, 128, 256], cout)
        self.ssh1, self.ssh2, self.ssh3 = SSH(cout, cout), SSH(cout, cout), SSH(cout, cout)
        self.ClassHead = nn.ModuleList([Head(cout, 2, 2) for _ in range(3)])
        self.BboxHead = nn.ModuleList([Head(cout, 2, 4) for _ in range(3)])
        self.LandmarkHead = nn.ModuleList([Head(cout, 2, 10) for _ in range(3)])

    def forward(self, x):
        f = self.fpn(*self.body(x))
        f = [self.ssh1(f[0]), self.ssh2(f[1]), self.ssh3(f[2])]
        bbox = torch.cat([h(t) for h, t in zip(self.BboxHead, f)], dim=1)
        conf = torch.cat([h(t) for h, t in zip(self.ClassHead, f)], dim=1)
        ldm = torch.cat([h(t) for h, t in zip(self.LandmarkHead, f)], dim=1)
        return bbox, F.softmax(conf, dim=-1), ldm


# ------------------------------------------------------------ Real-ESRGAN --
class ResidualDenseBlock(nn.Module):
    def __init__(self, nf=64, gc=32):
        super().__init__()
        for i in range(5):
            setattr(self, f"conv{i + 1}", nn.Conv2d(nf + i * gc, gc if i < 4 else nf, 3, 1, 1))

    def forward(self, x):
        xs = [x]
        for i in range(1, 5):
            xs.append(F.leaky_relu(getattr(self, f"conv{i}")(torch.cat(xs, 1)), 0.2))
        return self.conv5(torch.cat(xs, 1)) * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, nf, gc):
        super().__init__()
        self.rdb1, self.rdb2, self.rdb3 = (ResidualDenseBlock(nf, gc) for _ in range(3))

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    """x4 RRDBNet (RealESRGAN_x4plus): input (N,3,H,W) RGB in [0,1], output (N,3,4H,4W)."""

    def __init__(self, nf=64, nb=23, gc=32):
        super().__init__()
        self.conv_first = nn.Conv2d(3, nf, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(nf, gc) for _ in range(nb)])
        self.conv_body = nn.Conv2d(nf, nf, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(nf, nf, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(nf, nf, 3, 1, 1)
        self.conv_hr = nn.Conv2d(nf, nf, 3, 1, 1)
        self.conv_last = nn.Conv2d(nf, 3, 3, 1, 1)

    def forward(self, x):
        f = self.conv_first(x)
        f = f + self.conv_body(self.body(f))
        f = F.leaky_relu(self.conv_up1(F.interpolate(f, scale_factor=2, mode="nearest")), 0.2)
        f = F.leaky_relu(self.conv_up2(F.interpolate(f, scale_factor=2, mode="nearest")), 0.2)
        return self.conv_last(F.leaky_relu(self.conv_hr(f), 0.2))


class SRVGGNetCompact(nn.Module):
    """realesr-general-x4v3 / realesr-animevideov3: a plain conv+PReLU stack
    whose last conv makes 3*s*s channels for a pixel shuffle, plus a nearest
    upsample of the input. Input (N,3,H,W) RGB in [0,1]."""

    def __init__(self, nf=64, nconv=32, scale=4):
        super().__init__()
        layers = [nn.Conv2d(3, nf, 3, 1, 1), nn.PReLU(nf)]
        for _ in range(nconv):
            layers += [nn.Conv2d(nf, nf, 3, 1, 1), nn.PReLU(nf)]
        layers.append(nn.Conv2d(nf, 3 * scale * scale, 3, 1, 1))
        self.body = nn.ModuleList(layers)
        self.upsampler = nn.PixelShuffle(scale)
        self.scale = scale

    def forward(self, x):
        y = x
        for m in self.body:
            y = m(y)
        return self.upsampler(y) + F.interpolate(x, scale_factor=self.scale, mode="nearest")
