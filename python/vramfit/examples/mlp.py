"""Plain PyTorch: a deep MLP regression (no other library)."""

from __future__ import annotations

from typing import Any

from . import common


def main() -> None:
    p = common.parser(__doc__ or "", micro=1024, global_batch=4096, lr=1e-3)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=8192)
    args = p.parse_args()

    import torch

    def build() -> Any:
        layers: list = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
        return torch.nn.Sequential(*layers[:-1])

    def make_batch(generator: Any, samples: int) -> common.Batch:
        return {
            "x": torch.randn(samples, args.hidden, generator=generator),
            "y": torch.randn(samples, args.hidden, generator=generator),
        }

    def loss_fn(model: Any, batch: common.Batch) -> Any:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    common.run(args, build_model=build, make_batch=make_batch, loss_fn=loss_fn)


if __name__ == "__main__":
    main()
