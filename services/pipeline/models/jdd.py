"""``strata_jdd_v1``: noise-aware joint demosaic + denoise on the packed Bayer mosaic.

The design follows Gharbi et al. 2016 ("Deep Joint Demosaicking and Denoising": pack the 2x2 Bayer sites into
4 half-resolution channels, a stack of 3x3 convolutions, a residual over an interpolated base, back to full
resolution) with the noise conditioning of Brooks et al. 2019 ("Unprocessing Images for Learned Raw
Denoising": per-site noise standard deviation maps ``sqrt(shot_c * x + read_c)`` as extra input channels), so
one network serves every ISO. Layers are EDSR-style residual blocks (conv-ReLU-conv + skip), some dilated.

Exact strips: every convolution is unpadded ('valid'); the mosaic is reflect-padded once, at the input, by the
network's radius, so each output depends only on input within :func:`jdd_receptive_field` and the image borders
see a reflection (which keeps the CFA parity). The network runs at half resolution only (no further
down-sampling), so it is equivariant to shifts by 2 pixels: a strip starting on any even row computes the same
numbers as the whole frame.

CFA phase: the mosaic is shifted (one row and/or column of reflect padding) so that (0, 0) is an R site; all
four phases then run the same RGGB network and the output is cropped back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from services.pipeline.models.base import Enhancer
from services.pipeline.models.errors import ModelMismatch
from services.pipeline.models.manifest import Manifest
from services.pipeline.ops import demosaic_bilinear
from services.pipeline.ops.cfa import cfa_channels
from services.pipeline.ops.filters import reflect_pad_any

log = logging.getLogger(__name__)
ARCHITECTURE = "strata_jdd_v1"
DEFAULT_CONFIG: dict[str, Any] = {"width": 48, "dilations": [1, 1, 2, 2, 1, 1]}
NOISE_SCALE = 8.0  # noise std maps are ~1e-3..1e-1; scaled towards the mosaic's range
_RGGB_SITE_CHANNELS = (0, 1, 1, 2)  # channel (R, G, B) of the packed sites (0,0), (0,1), (1,0), (1,1)


def _config(config: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    width = int(config.get("width", DEFAULT_CONFIG["width"]))
    dilations = tuple(int(d) for d in config.get("dilations", DEFAULT_CONFIG["dilations"]))
    if width < 1 or not dilations or min(dilations) < 1:
        raise ValueError(f"bad {ARCHITECTURE} config: width={width}, dilations={dilations}")
    return width, dilations


def half_res_radius(config: dict[str, Any]) -> int:
    """Radius of the network in half-resolution (packed) pixels: head 1 + 2 d per block + tail 1."""
    _, dilations = _config(config)
    return 2 + 2 * sum(dilations)


def jdd_receptive_field(config: dict[str, Any]) -> int:
    """Full-resolution receptive radius: a half-res radius r reaches 2 r + 1 pixels from any site of a 2x2 block
    (the bilinear base, radius 1, lies inside)."""
    return 2 * half_res_radius(config) + 1


def flops_per_pixel(config: dict[str, Any]) -> float:
    """Multiply-adds x 2 per full-resolution output pixel (convolutions only)."""
    width, dilations = _config(config)
    per_half = 9 * (8 * width + 2 * len(dilations) * width * width + width * 12) * 2
    return per_half / 4.0


class ResBlock(nn.Module):
    """``x + conv(relu(conv(x)))`` with unpadded 3x3 convolutions of dilation ``d``; shrinks each side by 2 d."""

    def __init__(self, width: int, dilation: int) -> None:
        super().__init__()
        self.dilation = dilation
        self.conv1 = nn.Conv2d(width, width, 3, dilation=dilation)
        self.conv2 = nn.Conv2d(width, width, 3, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        c = 2 * self.dilation
        y = self.conv2(F.relu(self.conv1(x)))  # (B, C, h - 2c, w - 2c)
        return x[..., c:-c, c:-c] + y


class JDDNet(nn.Module):
    """Packed RGGB mosaic + noise std maps (B, 4, h, w) each -> residual (B, 12, h - 2r, w - 2r), r the radius.

    The 12 output channels are 3 colours x the 4 sites of a 2x2 block (``pixel_shuffle`` order).
    """

    def __init__(self, width: int = 48, dilations: Sequence[int] = (1, 1, 2, 2, 1, 1)) -> None:
        super().__init__()
        self.head = nn.Conv2d(8, width, 3)
        self.blocks = nn.Sequential(*(ResBlock(width, d) for d in dilations))
        self.tail = nn.Conv2d(width, 12, 3)
        self.radius = 2 + 2 * sum(dilations)
        nn.init.zeros_(self.tail.weight)  # start as the bilinear base: training only adds what helps
        nn.init.zeros_(self.tail.bias)  # type: ignore[arg-type]

    def forward(self, packed: Tensor, noise_std: Tensor) -> Tensor:
        x = torch.cat([packed, noise_std * NOISE_SCALE], dim=1)  # (B, 8, h, w)
        x = F.relu(self.head(x))  # (B, C, h - 2, w - 2)
        x = self.blocks(x)  # (B, C, h - 2 - 4 sum(d), ...)
        return self.tail(x)  # (B, 12, h - 2r, w - 2r)


def pack_rggb(mosaic: Tensor) -> Tensor:
    """(B, 1, H, W) RGGB mosaic (H, W even) -> (B, 4, H/2, W/2): sites (0,0) R, (0,1) G, (1,0) G, (1,1) B."""
    return F.pixel_unshuffle(mosaic, 2)


def noise_std_maps(packed: Tensor, shot: Tensor, read: Tensor) -> Tensor:
    """Per-site noise std ``sqrt(shot_c * max(x, 0) + read_c)`` of a packed RGGB mosaic: (B, 4, h, w).

    ``shot``/``read``: (3,) for the whole batch or (B, 3) per image (training).
    """
    idx = list(_RGGB_SITE_CHANNELS)
    s = shot.to(packed.dtype)[..., idx].reshape(-1, 4, 1, 1)  # (1 or B, 4, 1, 1)
    r = read.to(packed.dtype)[..., idx].reshape(-1, 4, 1, 1)
    return (s * packed.clamp(min=0.0) + r).clamp(min=0.0).sqrt()


def r_site_offset(cfa: str) -> tuple[int, int]:
    """(row, column) of the R site in the 2x2 pattern."""
    i = cfa_channels(cfa).index(0)
    return i // 2, i % 2


def residual_full_res(net: Callable[[Tensor, Tensor], Tensor], canvas: Tensor, shot: Tensor, read: Tensor) -> Tensor:
    """Run ``net`` (a :class:`JDDNet` or its :class:`FoldedJDD`) on an RGGB canvas (B, 1, Hc, Wc), Hc and Wc even:
    (B, 3, Hc - 4r, Wc - 4r) full-res residual for the centre of the canvas (r = the network's radius)."""
    packed = pack_rggb(canvas)  # (B, 4, Hc/2, Wc/2)
    out = net(packed, noise_std_maps(packed, shot, read))  # (B, 12, Hc/2 - 2r, Wc/2 - 2r)
    return F.pixel_shuffle(out, 2)  # (B, 3, Hc - 4r, Wc - 4r)


class FoldedJDD:
    """A :class:`JDDNet` for inference in ``dtype``, with fewer passes over its activations; the same function.

    Every block's second bias is folded into the convolutions after it: a per-channel constant added to a valid
    (unpadded) convolution's input is a per-channel constant on its output, ``sum_k W[o, i, k] * b[i]``, so the
    residual stream carries it implicitly and the next ``conv1`` (and the tail) add it to their own bias. Head and
    ``conv1`` then run as cuDNN's convolution + bias + ReLU in one call (``fused``; ``torch.cudnn_convolution_relu``),
    ``conv2`` without a bias, and a block is two convolutions and one residual add. In PyTorch's plain modules a
    channels-last convolution's bias and the ReLU are each a separate pass over 64 channels of the frame: on an
    80 MP frame in float16 they were 60 % of the model pass (``scripts/gpu/profile_model.py``, docs/PERFORMANCE.md).
    Every operation is still a valid convolution or a per-pixel one, so strips stitch exactly as before.
    ``width``: hidden channels padded with zeros up to it (the same function; cuDNN's tensor-core kernels may suit
    some widths better than others). ``full_width``: every convolution zero-pads its columns (not its rows) by its
    reach, and the output's outer ``radius`` columns, which that padding reached, are cropped at the end; a column
    of the rest sees what the valid network's column sees, so the result is the same. The residual stream then only
    loses rows, and its add reads a contiguous (channels-last) slice rather than a strided one.
    """

    def __init__(self, net: JDDNet, dtype: torch.dtype, fused: bool, width: int | None = None,
                 full_width: bool = False) -> None:
        self.dtype, self.fused, self.full_width, self.radius = dtype, fused, full_width, net.radius
        cl = torch.channels_last if net.head.weight.device.type == "cuda" else torch.contiguous_format
        extra = max(0, (width or 0) - net.head.out_channels)  # zero channels: relu(0 + 0) = 0 adds nothing anywhere

        def weight(conv: nn.Conv2d, pad_in: bool = True, pad_out: bool = True) -> Tensor:
            w = F.pad(conv.weight.detach(), (0, 0, 0, 0, 0, extra * pad_in, 0, extra * pad_out))
            return w.to(dtype).contiguous(memory_format=cl)

        def bias(conv: nn.Conv2d, carried: Tensor | None = None, pad: bool = True) -> Tensor:
            b = conv.bias.detach().double()  # type: ignore[union-attr]
            if carried is not None:
                b = b + conv.weight.detach().double().sum((2, 3)) @ carried
            return F.pad(b, (0, extra * pad)).to(dtype)

        self.head = (weight(net.head, pad_in=False), bias(net.head))
        carried = torch.zeros(net.head.out_channels, dtype=torch.float64, device=net.head.weight.device)
        self.blocks: list[tuple[int, Tensor, Tensor, Tensor]] = []
        for block in net.blocks:
            assert isinstance(block, ResBlock)
            self.blocks.append((block.dilation, weight(block.conv1), bias(block.conv1, carried), weight(block.conv2)))
            carried = carried + block.conv2.bias.detach().double()  # type: ignore[union-attr]
        self.tail = (weight(net.tail, pad_out=False), bias(net.tail, carried, pad=False))

    def _conv(self, x: Tensor, w: Tensor, b: Tensor | None, d: int, relu: bool) -> Tensor:
        pad = [0, d if self.full_width else 0]
        if relu and self.fused:
            return torch.cudnn_convolution_relu(x, w, b, [1, 1], pad, [d, d], 1)
        y = F.conv2d(x, w, b, dilation=d, padding=pad)
        return F.relu(y) if relu else y

    def __call__(self, packed: Tensor, noise_std: Tensor) -> Tensor:
        """As :meth:`JDDNet.forward`: (B, 4, h, w) twice -> (B, 12, h - 2r, w - 2r), in ``dtype``."""
        x = torch.cat([packed, noise_std * NOISE_SCALE], dim=1).to(self.dtype)
        x = self._conv(x, *self.head, 1, relu=True)
        for d, w1, b1, w2 in self.blocks:
            y = self._conv(self._conv(x, w1, b1, d, relu=True), w2, None, d, relu=False)
            x = y.add_(x[..., 2 * d : -2 * d, :] if self.full_width else x[..., 2 * d : -2 * d, 2 * d : -2 * d])
        out = self._conv(x, *self.tail, 1, relu=False)
        return out[..., self.radius : -self.radius] if self.full_width else out


# Hidden widths are padded to a multiple of this on GPUs: v1's 48 channels ran its float16 pass slower than v2's 64
# (0.20 s against 0.10 s an 80 MP frame, with fewer operations; docs/PERFORMANCE.md).
TENSOR_CORE_WIDTH = 64
FULL_WIDTH = True  # FoldedJDD's full_width on GPUs


def folded_for(net: JDDNet, device: torch.device, dtype: torch.dtype) -> FoldedJDD | None:
    """The folded network for reduced precision on a CUDA device, cuDNN's fused call where it runs (checked on a
    small input); None elsewhere (the CPU and float32 run the plain module)."""
    if device.type != "cuda" or dtype == torch.float32:
        return None
    probe = torch.zeros(1, 4, 2 * net.radius + 2, 2 * net.radius + 2, device=device)
    width = -(-net.head.out_channels // TENSOR_CORE_WIDTH) * TENSOR_CORE_WIDTH
    try:
        folded = FoldedJDD(net, dtype, fused=True, width=width, full_width=FULL_WIDTH)
        with torch.inference_mode():
            folded(probe, probe)
        return folded
    except RuntimeError as exc:  # a cuDNN without the fused call for this dtype: bias and ReLU apart
        log.info("cuDNN convolution + ReLU unavailable on %s in %s (%s): ReLU apart", device, dtype, exc)
        return FoldedJDD(net, dtype, fused=False, width=width, full_width=FULL_WIDTH)


class JDDEnhancer(Enhancer):
    """A resident :class:`JDDNet`: float32 on the CPU; on GPUs in ``compute_dtype``, as :class:`FoldedJDD` where that
    is reduced precision."""

    def __init__(self, manifest: Manifest, net: JDDNet, device: torch.device, compute_dtype: torch.dtype) -> None:
        super().__init__(manifest, device, compute_dtype)
        self.net = net.to(device).eval()
        if device.type == "cuda":
            self.net = self.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.folded = folded_for(self.net, device, compute_dtype)

    def _enhance(self, mosaic: Tensor, cfa: str, shot: Tensor, read: Tensor) -> Tensor:
        h, w = mosaic.shape[-2:]
        pad = 2 * self.net.radius  # full-res pixels the valid network eats on each side
        oy, ox = r_site_offset(cfa)
        # Start the canvas on an R site (oy, ox rows/columns of reflection) and end it on an even size.
        bottom, right = (h + oy) % 2, (w + ox) % 2
        # Frames smaller than the receptive field are reflected more than once (a mirrored tiling).
        canvas = reflect_pad_any(mosaic, (pad + ox, pad + right, pad + oy, pad + bottom))
        if self.device.type == "cuda":
            canvas = canvas.contiguous(memory_format=torch.channels_last)
        if self.folded is not None:
            residual = residual_full_res(self.folded, canvas, shot, read)
        else:
            autocast = self.compute_dtype != torch.float32
            with torch.autocast(mosaic.device.type, dtype=self.compute_dtype, enabled=autocast):
                residual = residual_full_res(self.net, canvas, shot, read)  # (B, 3, h + oy + bottom, ...)
        residual = residual[..., oy : oy + h, ox : ox + w].float()  # (B, 3, H, W)
        return demosaic_bilinear(mosaic, cfa) + residual


def build_jdd(manifest: Manifest, weights: dict[str, Tensor] | None, device: torch.device,
              compute_dtype: torch.dtype) -> JDDEnhancer:
    """Architecture builder: the network from ``manifest.config`` with ``weights`` (strict key/shape match)."""
    width, dilations = _config(manifest.config)
    net = JDDNet(width, dilations)
    if weights is None:
        raise ModelMismatch(f"model architecture mismatch: package {manifest.name} has no weights, "
                            f"architecture {ARCHITECTURE} needs them")
    try:
        net.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)]
        raise ModelMismatch(f"model architecture mismatch: package {manifest.name} weights do not fit "
                            f"{ARCHITECTURE} (width={width}, dilations={list(dilations)}): {first[0].strip()}") from exc
    return JDDEnhancer(manifest, net, device, compute_dtype)


# 1.0.0: 24000 steps; 1.1.0: 30000 steps with scale augmentation (training/data.py UPSCALE_SHARE).
JDD_VERSION = "1.1.0"


def jdd_manifest(name: str, cameras: tuple[str, ...], config: dict[str, Any], training: dict[str, Any],
                 version: str = JDD_VERSION) -> Manifest:
    """The manifest of a ``strata_jdd_v1`` package with architecture ``config`` serving ``cameras``."""
    return Manifest(name=name, version=version, architecture=ARCHITECTURE, cameras=cameras,
                    receptive_field=jdd_receptive_field(config), noise_input=True, dtype="bfloat16",
                    config=dict(config), training=training)


__all__ = ["ARCHITECTURE", "DEFAULT_CONFIG", "JDD_VERSION", "FoldedJDD", "JDDEnhancer", "JDDNet", "build_jdd",
           "flops_per_pixel", "folded_for", "half_res_radius", "jdd_manifest", "jdd_receptive_field", "noise_std_maps",
           "pack_rggb", "r_site_offset", "residual_full_res"]
