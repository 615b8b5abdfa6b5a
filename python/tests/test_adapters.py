"""The Lightning and Hugging Face adapters, with the frameworks' real classes on the CPU."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, List

import lightning.pytorch as pl
import pytest
import torch
import transformers

from vramfit import Attempt, ConfigError, state
from vramfit.adapters import huggingface as hf
from vramfit.adapters import lightning as vl


def attempt(micro: int, accum: int, tmp_path: Path, min_micro: int = 1) -> Attempt:
    return Attempt(
        micro_batch=micro, grad_accum=accum, global_batch=micro * accum, min_micro_batch=min_micro,
        managed=True, termination_log=str(tmp_path / "termination-log"),
    )


def dataset(n: int = 32) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(n, 5, generator=g, dtype=torch.float64),
                                          torch.randn(n, 1, generator=g, dtype=torch.float64))


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


class Regression(pl.LightningModule):
    def __init__(self, fail_above: int = 0, manual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(5, 1).double()
        self.fail_above = fail_above
        self.automatic_optimization = not manual
        self.micro_sizes: List[int] = []

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        self.micro_sizes.append(x.shape[0])
        if self.fail_above and x.shape[0] > self.fail_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} MiB (injected)")
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.automatic_optimization:
            return self.loss(batch)
        return torch.tensor(vl.oom_safe_step(self, batch, lambda m, b: m.loss(b)).loss)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_callback_takes_accumulation_from_the_attempt(tmp_path: Path) -> None:
    current = attempt(4, 2, tmp_path)
    module = Regression()
    trainer = quiet_trainer(max_steps=3, callbacks=[vl.VramfitCallback(current)])
    loader = torch.utils.data.DataLoader(dataset(), batch_size=current.micro_batch)
    trainer.fit(module, loader)
    assert trainer.accumulate_grad_batches == 2
    assert vl.trainer_kwargs(current) == {"accumulate_grad_batches": 2}
    assert module.micro_sizes == [4] * 6, "3 optimizer steps of 2 micro-batches of 4"


def test_lightning_oom_follows_the_exit_protocol(tmp_path: Path) -> None:
    current = attempt(4, 2, tmp_path)
    state.set_attempt(current)
    trainer = quiet_trainer(max_steps=1, callbacks=[vl.VramfitCallback(current, hard_exit=False)])
    with pytest.raises(SystemExit) as info:
        trainer.fit(Regression(fail_above=2), torch.utils.data.DataLoader(dataset(), batch_size=4))
    assert info.value.code == 42
    assert (tmp_path / "termination-log").read_text().split("\n\n")[-1].startswith("CUDA out of memory. Tried to allocate 4 MiB")


def test_lightning_manual_step_absorbs_the_oom_and_matches_a_full_batch_step(tmp_path: Path) -> None:
    current = attempt(8, 1, tmp_path)  # the whole rank batch of 8, in one micro-batch
    module = Regression(fail_above=2, manual=True)
    reference = copy.deepcopy(module.net)
    trainer = quiet_trainer(max_steps=1, callbacks=[vl.VramfitCallback(current)])
    module._vramfit_step = None
    state.set_attempt(current)
    trainer.fit(module, torch.utils.data.DataLoader(dataset(), batch_size=current.rank_batch))
    # 8 fails, 4 fails, then 2 x 4 micro-batches: the step ran again from the start.
    assert module.micro_sizes == [8, 4, 2, 2, 2, 2]
    x, y = dataset()[:8]
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    opt.step()
    for got, want in zip(module.net.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert trainer.global_step == 1


class TinyLM(torch.nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Linear(4, 1)
        self.fail = fail

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
        if self.fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (injected)")
        return {"loss": torch.nn.functional.mse_loss(self.w(x).squeeze(-1), labels)}


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        return {"x": torch.full((4,), float(i)), "labels": torch.tensor(float(i))}


def args(tmp_path: Path, **kw: Any) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True,
                                          max_steps=1, save_strategy="no", **kw)


def test_hf_training_args_take_the_attempts_shape(tmp_path: Path) -> None:
    current = attempt(4, 2, tmp_path)
    built = args(tmp_path, **hf.training_args_kwargs(current))
    assert (built.per_device_train_batch_size, built.gradient_accumulation_steps) == (4, 2)
    replaced = hf.apply_attempt(args(tmp_path), current)
    assert (replaced.per_device_train_batch_size, replaced.gradient_accumulation_steps) == (4, 2)
    hf.VramfitTrainerCallback(current).on_train_begin(built, None, None)
    with pytest.raises(ConfigError, match="micro-batch 8 x accumulation 1"):
        hf.VramfitTrainerCallback(current).on_train_begin(args(tmp_path), None, None)


def test_hf_trainer_oom_follows_the_exit_protocol(tmp_path: Path) -> None:
    current = attempt(4, 2, tmp_path)
    state.set_attempt(current)
    trainer = transformers.Trainer(model=TinyLM(fail=True), args=args(tmp_path, **hf.training_args_kwargs(current)),
                                   train_dataset=Rows(), callbacks=[hf.VramfitTrainerCallback(current)])
    with pytest.raises(SystemExit) as info:
        hf.train(trainer, hard_exit=False)
    assert info.value.code == 42
    assert (tmp_path / "termination-log").read_text().split("\n\n")[-1].startswith("CUDA out of memory. Tried to allocate 1 GiB")
