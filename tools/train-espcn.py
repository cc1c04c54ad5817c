#!/usr/bin/env python3
"""Train Spindle's default x2 super-resolution model (ESPCN class) and export it to ONNX.

    /usr/bin/python3 tools/train-espcn.py [--out models/espcn-x2.onnx] [--iters N]

Runs on one CPU core with PyTorch (Debian's python3-torch). The training images are
public-domain / CC0 samples shipped by Debian's python3-skimage (see docs/superres.md for
the licence of each); the held-out images are never seen during training.

Degradation: the low-resolution input is the 2x2 area average of the high-resolution image
(exactly reproducible in NumPy, so tools/eval-espcn.py can rebuild it without PyTorch).

Network (input float RGB 0..1, (B,3,H,W); output (B,3,2H,2W), not clamped):
    conv 5x5 3->64, tanh -> conv 3x3 64->32, tanh -> conv 3x3 32->12
    + nearest-upsampling skip written as a fixed 1x1 conv 3->12 (channel k copies colour k//4)
    -> DepthToSpace(2, CRD)
The skip makes the network learn only the residual over nearest upsampling, which converges
in the few minutes of one core we allow. Every op is Conv, Tanh, Add or DepthToSpace.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

SCALE = 2
TRAIN = ['astronaut.png', 'rocket.jpg', 'hubble_deep_field.jpg', 'retina.jpg',
         'brick.png', 'grass.png', 'gravel.png']
HELD_OUT = ['coffee.png', 'chelsea.png', 'camera.png']


def skimage_data_dir():
    env = os.environ.get('SKIMAGE_DATA')
    cands = [env] if env else []
    try:
        import skimage.data
        cands.append(os.path.dirname(skimage.data.__file__))
    except ImportError:
        pass
    for c in cands:
        if c and os.path.exists(os.path.join(c, 'astronaut.png')):
            return c
    sys.exit('train-espcn: skimage sample images not found (install python3-skimage or set SKIMAGE_DATA)')


def load_rgb(path):
    """float32 (3,H,W) in 0..1, H and W cropped to even."""
    im = np.asarray(Image.open(path).convert('RGB'), dtype=np.float32) / 255.0
    h, w = im.shape[0] // SCALE * SCALE, im.shape[1] // SCALE * SCALE
    return torch.from_numpy(np.ascontiguousarray(im[:h, :w].transpose(2, 0, 1)))


def degrade(hr):
    """(B,3,H,W) -> (B,3,H/2,W/2) by 2x2 area average."""
    return F.avg_pool2d(hr, SCALE)


class Espcn(nn.Module):
    def __init__(self, s=SCALE):
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 5, padding=2)
        self.c2 = nn.Conv2d(64, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 3 * s * s, 3, padding=1)
        skip = torch.zeros(3 * s * s, 3, 1, 1)
        for k in range(3 * s * s):
            skip[k, k // (s * s), 0, 0] = 1.0
        self.skip = nn.Conv2d(3, 3 * s * s, 1, bias=False)
        self.skip.weight.data.copy_(skip)
        self.skip.weight.requires_grad_(False)
        self.shuffle = nn.PixelShuffle(s)

    def forward(self, x):
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.c2(h))
        return self.shuffle(self.c3(h) + self.skip(x))


def psnr(a, b):
    mse = torch.mean((a.clamp(0, 1) - b) ** 2).item()
    return 10.0 * np.log10(1.0 / mse)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='models/espcn-x2.onnx')
    ap.add_argument('--iters', type=int, default=6000)
    ap.add_argument('--batch', type=int, default=16)
    ap.add_argument('--patch', type=int, default=64, help='high-resolution patch side')
    ap.add_argument('--ref', default=None, help='also write a small PyTorch reference (npz) for the ONNX check')
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(7)
    rng = np.random.default_rng(7)
    d = skimage_data_dir()
    train = [load_rgb(os.path.join(d, f)) for f in TRAIN]
    held = {f: load_rgb(os.path.join(d, f)) for f in HELD_OUT}

    net = Espcn()
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [args.iters * 6 // 10, args.iters * 85 // 100], 0.3)
    P = args.patch
    t0 = time.time()
    for it in range(args.iters):
        batch = []
        for _ in range(args.batch):
            im = train[rng.integers(len(train))]
            y = int(rng.integers(0, (im.shape[1] - P) // 2 + 1)) * 2
            x = int(rng.integers(0, (im.shape[2] - P) // 2 + 1)) * 2
            p = im[:, y:y + P, x:x + P]
            if rng.integers(2):
                p = p.flip(2)
            if rng.integers(2):
                p = p.flip(1)
            if rng.integers(2):
                p = p.transpose(1, 2)
            batch.append(p)
        hr = torch.stack(batch)
        lr = degrade(hr)
        out = net(lr)
        # Ignore a 4-pixel frame: the patch edges lack the context the full image has.
        loss = F.l1_loss(out[:, :, 4:-4, 4:-4], hr[:, :, 4:-4, 4:-4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if it % 500 == 0 or it == args.iters - 1:
            print(f'iter {it:5d}  loss {loss.item():.5f}  {time.time() - t0:6.1f}s', flush=True)

    net.eval()
    print('held-out PSNR (dB), PyTorch model vs bicubic:')
    with torch.no_grad():
        for name, hr in held.items():
            lr = degrade(hr[None])
            sr = net(lr)
            bic = F.interpolate(lr, scale_factor=SCALE, mode='bicubic', align_corners=False)
            print(f'  {name:16s} model {psnr(sr, hr[None]):6.2f}  bicubic {psnr(bic, hr[None]):6.2f}')

    dummy = torch.rand(1, 3, 32, 48)
    torch.onnx.export(net, dummy, args.out, opset_version=13,
                      input_names=['input'], output_names=['output'],
                      dynamic_axes={'input': {0: 'batch', 2: 'height', 3: 'width'},
                                    'output': {0: 'batch', 2: 'height2', 3: 'width2'}})
    print(f'wrote {args.out} ({os.path.getsize(args.out)} bytes)')
    if args.ref:
        g = torch.Generator().manual_seed(11)
        x = torch.rand(2, 3, 20, 28, generator=g)
        with torch.no_grad():
            y = net(x)
        np.savez_compressed(args.ref, input=x.numpy(), output=y.numpy())
        print(f'wrote {args.ref}')


if __name__ == '__main__':
    main()
