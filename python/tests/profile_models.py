"""Small models for the capture tests (importable as MODULE:CALLABLE)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 256, depth: int = 2, dropout: float = 0.0, classes: int = 10) -> nn.Module:
    layers: list = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(nn.Flatten(), *layers)


def cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


class ChannelsLastBlock(nn.Module):
    """A depthwise convolution fed a permuted tensor, as ConvNeXt's blocks
    feed theirs."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        return self.head(self.dw(x).mean((2, 3)))


def channels_last_block() -> nn.Module:
    return ChannelsLastBlock()


class Attn(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, 10)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, w).mean(1))


def attn() -> nn.Module:
    return Attn()


class GqaAttn(nn.Module):
    """Four query heads sharing two key/value heads."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, width)
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q = self.q(x).view(b, s, 4, w // 4).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 2, w // 4).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, s, w).mean(1))


def gqa_attn() -> nn.Module:
    return GqaAttn()


class CheckpointedMlp(nn.Module):
    """A block with dropout behind the transformers-style checkpointing switch."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.5),
                                   nn.Linear(width, width))
        self.head = nn.Linear(width, 10)
        self.kwargs: dict = {}
        self.enabled = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict) -> None:
        self.enabled, self.kwargs = True, gradient_checkpointing_kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            x = torch.utils.checkpoint.checkpoint(self.block, x, **self.kwargs)
        else:
            x = self.block(x)
        return self.head(x)


def checkpointed_mlp() -> nn.Module:
    return CheckpointedMlp()


class Staged(nn.Module):
    """Widths worked out with tensors while it builds, as torchvision's RegNet
    does (``torch.arange(...).tolist()``): a meta tensor has no values."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        widths = (torch.round(torch.arange(3) * 8.0 + 16) // 8 * 8).int().tolist()
        layers: list = []
        cin = 3
        for w in widths:
            layers += [nn.Conv2d(cin, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            cin = w
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def staged() -> nn.Module:
    return Staged()


class BiasAttn(nn.Module):
    """Attention with a learned relative-position bias as its mask, laid out
    as T5's ``compute_bias`` makes it: (1, heads, q, k) permuted from
    (q, k, heads), so its last dimension is not contiguous (transformers up
    to 5.17 passed it to SDPA so); ``contiguous=True`` copies it first."""

    def __init__(self, width: int = 64, heads: int = 4, seq: int = 128, contiguous: bool = False,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.bias = nn.Parameter(torch.zeros(seq, seq, heads))
        self.out = nn.Linear(width, 10)
        self.heads, self.contiguous, self.dropout = heads, contiguous, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.bias.permute(2, 0, 1).unsqueeze(0)
        if self.contiguous:
            bias = bias.contiguous()
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.dropout)
        return self.out(y.transpose(1, 2).reshape(b, s, w).mean(1))


def bias_attn(contiguous: bool = False, dropout: float = 0.1) -> nn.Module:
    return BiasAttn(contiguous=contiguous, dropout=dropout)
