"""torchvision image classifier (ConvNeXt-Tiny by default), random weights, synthetic images.

Models with BatchNorm (ResNets) normalise over each micro-batch, so their
gradient depends on the micro-batch size: splitting changes the maths there
(as gradient accumulation always does). LayerNorm models such as ConvNeXt and
ViT do not have this problem.
"""

from __future__ import annotations

from typing import Any

from . import common


def main() -> None:
    p = common.parser(__doc__ or "", micro=32, global_batch=256, lr=1e-3)
    p.add_argument("--arch", default="convnext_tiny", help="a torchvision classification model")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()

    import torchvision

    def build() -> Any:
        return torchvision.models.get_model(args.arch, weights=None, num_classes=args.classes)

    def make_batch(generator: Any, samples: int) -> common.Batch:
        import torch

        size = args.image_size
        return {
            "images": torch.randn(samples, 3, size, size, generator=generator),
            "labels": torch.randint(0, args.classes, (samples,), generator=generator),
        }

    def loss_fn(model: Any, batch: common.Batch) -> Any:
        import torch

        return torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])

    common.run(args, build_model=build, make_batch=make_batch, loss_fn=loss_fn)


if __name__ == "__main__":
    main()
