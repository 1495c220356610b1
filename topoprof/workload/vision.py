"""Image classifiers as parameter layouts: torchvision's ResNet and ResNeXt (ImageNet, 1000
classes), tensor by tensor in torchvision's registration order and names.

The architecture is torchvision's `torchvision/models/resnet.py` (github.com/pytorch/vision):
the stem (conv1 7x7 stride 2 padding 3, bn1, ReLU, max-pool 3x3 stride 2 padding 1), four
stages of Bottleneck blocks at 64, 128, 256, 512 planes (stride 2 from the second stage on),
adaptive average pooling to 1x1 and fc. A Bottleneck is conv1 1x1, bn1, conv2 3x3 with
`groups` and the block's stride (torchvision's "ResNet v1.5": the stride sits on the 3x3, not on
the first 1x1 as in He et al. 2016), bn2, conv3 1x1 to planes * 4, bn3, and, in the first block
of a stage whose stride or width changes, a downsample branch conv 1x1 (with the stride) + BN.
Its inner width is int(planes * width_per_group / 64) * groups. No conv has a bias.
ResNet: He et al. 2016, "Deep Residual Learning for Image Recognition", Table 1 (50 and 101
layers: 3, 4, 6, 3 and 3, 4, 23, 3 blocks). ResNeXt: Xie et al. 2017, "Aggregated Residual
Transformations for Deep Neural Networks", Table 1 (cardinality 32, bottleneck width 4d;
torchvision's resnext101_32x8d uses 8d).

Compute is per image (the layout's "per token" is per image here, `Layout.unit == "image"`; a
micro-batch of B images costs B times as much):
- a conv's forward is 2 * (Cin / groups) * k * k * Cout * Hout * Wout FLOPs (one multiply-add per
  weight per output position, the convention `torch.utils.flop_counter` uses too), with
  Hout = floor((H + 2 * padding - kernel) / stride) + 1 as torch computes it for conv and
  max-pool (nn.Conv2d, nn.MaxPool2d "Shape" with dilation 1 and ceil_mode False);
- its backward is 2x forward: the input gradient (a transposed conv of the same size) and the
  weight gradient (a conv of the input with the output gradient, again the same count; per
  group for a grouped conv). The stem conv1 is the exception: its input is the image, which
  needs no gradient, so its backward is the weight gradient alone, 1x forward;
- fc is a matmul: 2 * numel forward, 4 * numel backward (`presets`' convention);
- batch norm, biases, ReLU, pooling and the residual additions ~0, as norms in `presets`.
Every conv carries its forward figure, so `Layout.train_flops_per_token` is exact under these
counts (3x forward less the stem's missing input gradient); the default backward share of the
step (2/3, Kaplan's backward = 2x forward) is 0.664 for ResNet-50 at 224 by the same counts.
"""
from __future__ import annotations

from topoprof.errors import InputError
from topoprof.workload.layout import (
    MATMUL_BACKWARD_FLOPS_PER_PARAM,
    MATMUL_FORWARD_FLOPS_PER_PARAM,
    Layout,
    LayoutBuilder,
)

# torchvision's ImageNet training crop (references/classification/train.py, --train-crop-size
# default 224; He et al. 2016 §3.4 "a 224x224 crop is randomly sampled")
DEFAULT_IMAGE_SIZE = 224
NUM_CLASSES = 1000  # ImageNet-1k, torchvision's default num_classes
EXPANSION = 4  # Bottleneck.expansion in torchvision's resnet.py
STAGE_PLANES = (64, 128, 256, 512)  # ResNet._make_layer calls in torchvision's resnet.py
STEM_CHANNELS = 64  # ResNet.inplanes before layer1
FORWARD_FLOPS_PER_MAC = 2  # one multiply and one add
CONV_BACKWARD_PER_FORWARD = 2  # input gradient + weight gradient, each the forward's size

_TORCHVISION = "torchvision/models/resnet.py (github.com/pytorch/vision)"
# name: (Bottleneck blocks per stage, groups, width_per_group, source)
RESNETS: dict[str, tuple[tuple[int, int, int, int], int, int, str]] = {
    "resnet50": ((3, 4, 6, 3), 1, 64, f"He et al. 2016, Table 1 (50-layer); {_TORCHVISION} resnet50"),
    "resnet101": ((3, 4, 23, 3), 1, 64, f"He et al. 2016, Table 1 (101-layer); {_TORCHVISION} resnet101"),
    "resnext50_32x4d": ((3, 4, 6, 3), 32, 4,
                        f"Xie et al. 2017, Table 1 (ResNeXt-50 32x4d); {_TORCHVISION} resnext50_32x4d"),
    "resnext101_32x8d": ((3, 4, 23, 3), 32, 8,
                         f"Xie et al. 2017 (ResNeXt-101, cardinality 32, width 8d); {_TORCHVISION} "
                         "resnext101_32x8d"),
}


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output height/width of a conv or max-pool as torch computes it (dilation 1, ceil_mode False)."""
    return (size + 2 * padding - kernel) // stride + 1


def check_image_size(image_size) -> int:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise InputError(f"--image-size {image_size!r}: must be a whole number of pixels >= 1")
    return image_size


class _Convs:
    """A LayoutBuilder for one image size: each conv registers its weight and its use."""

    def __init__(self, b: LayoutBuilder):
        self.b = b

    def conv(self, name: str, c_in: int, c_out: int, kernel: int, stride: int, size: int,
             groups: int = 1, input_grad: bool = True) -> int:
        """nn.Conv2d(bias=False) at input height/width `size`, padding kernel // 2 (as every conv
        of a ResNet); returns the output size."""
        weight = self.b.param(f"{name}.weight", c_out, c_in // groups, kernel, kernel)
        out = conv_out(size, kernel, stride, kernel // 2)
        forward = FORWARD_FLOPS_PER_MAC * (c_in // groups) * kernel * kernel * c_out * out * out
        backward = forward * CONV_BACKWARD_PER_FORWARD if input_grad else forward
        self.b.use(weight, flops_per_token=backward, forward_flops_per_token=forward)
        return out

    def bn(self, name: str, channels: int) -> None:
        self.b.use(*self.b.norm(name, channels))


def resnet_layout(name: str, image_size: int | None = None) -> Layout:
    """A torchvision ResNet/ResNeXt of RESNETS at `image_size` x `image_size` pixels (default 224)."""
    blocks, groups, width_per_group, source = RESNETS[name]
    pixels = check_image_size(DEFAULT_IMAGE_SIZE if image_size is None else image_size)
    size = pixels
    b = LayoutBuilder()
    c = _Convs(b)
    # Registration order is use order throughout: each module is registered just before it is used,
    # and a block's downsample (registered last) runs after bn3.
    size = c.conv("conv1", 3, STEM_CHANNELS, 7, 2, size, input_grad=False)
    c.bn("bn1", STEM_CHANNELS)
    size = conv_out(size, 3, 2, 1)  # maxpool
    inplanes = STEM_CHANNELS
    for stage, (planes, count) in enumerate(zip(STAGE_PLANES, blocks)):
        stride = 1 if stage == 0 else 2
        width = int(planes * (width_per_group / 64.0)) * groups
        out_planes = planes * EXPANSION
        for i in range(count):
            p = f"layer{stage + 1}.{i}"
            block_stride = stride if i == 0 else 1
            block_in = size
            c.conv(f"{p}.conv1", inplanes, width, 1, 1, size)
            c.bn(f"{p}.bn1", width)
            size = c.conv(f"{p}.conv2", width, width, 3, block_stride, size, groups=groups)
            c.bn(f"{p}.bn2", width)
            c.conv(f"{p}.conv3", width, out_planes, 1, 1, size)
            c.bn(f"{p}.bn3", out_planes)
            if i == 0 and (block_stride != 1 or inplanes != out_planes):
                c.conv(f"{p}.downsample.0", inplanes, out_planes, 1, block_stride, block_in)
                c.bn(f"{p}.downsample.1", out_planes)
            inplanes = out_planes
    # avgpool to 1x1, then fc: a matmul applied once per image
    fc = b.linear("fc", inplanes, NUM_CLASSES)
    numel = inplanes * NUM_CLASSES
    b.use(*filter(None, fc), flops_per_token=MATMUL_BACKWARD_FLOPS_PER_PARAM * numel,
          forward_flops_per_token=MATMUL_FORWARD_FLOPS_PER_PARAM * numel)
    return b.build(name, f"{source}; at {pixels}x{pixels} pixels", unit="image")
