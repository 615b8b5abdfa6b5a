"""Training scripts for the automatic-profiling tests, run as
``python -c "import profile_scripts; profile_scripts.NAME()"`` with
``VRAMFIT_PHASE=profile``: each would train, and under the phase prints its
profile line and exits instead."""

from __future__ import annotations

import os
from typing import Any, Dict

import torch
import torch.nn.functional as F

import vramfit


def _dataset(n: int = 64) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def step() -> None:
    """A plain loop through ``vramfit.Step``."""
    attempt = vramfit.configure(micro_batch=2, grad_accum=1)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    step = vramfit.Step(model, optimizer)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=attempt.rank_batch)
    for x, y in loader:
        if os.environ.get("PROFILE_SCRIPT_FAIL"):
            # a data-dependent shape: fake tensors cannot run it
            step.run({"x": x, "y": y}, lambda m, b: m(b["x"][b["x"][:, 0] > 0]).sum())
        step.run({"x": x, "y": y}, lambda m, b: F.cross_entropy(m(b["x"]), b["y"]))
    print("trained")


def lightning() -> None:
    """Lightning's automatic optimisation with ``VramfitCallback``."""
    import lightning.pytorch as pl

    from vramfit.adapters.lightning import VramfitCallback, trainer_kwargs

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters())

    attempt = vramfit.configure(micro_batch=2, grad_accum=1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=10, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[VramfitCallback()], **trainer_kwargs())
    trainer.fit(Module(), torch.utils.data.DataLoader(_dataset(), batch_size=attempt.micro_batch))
    print("trained")


def huggingface() -> None:
    """The Hugging Face Trainer on a tiny GPT-2, through ``train()``."""
    import transformers

    from vramfit.adapters.huggingface import train, training_args_kwargs

    vramfit.configure(micro_batch=2, grad_accum=1)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
            ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(output_dir=os.environ["PROFILE_SCRIPT_OUT"], max_steps=10,
                                          report_to=[], save_strategy="no", use_cpu=True,
                                          logging_strategy="no", **training_args_kwargs())
    train(transformers.Trainer(model=model, args=args, train_dataset=Tokens()))
    print("trained")
