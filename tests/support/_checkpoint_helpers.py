"""Shared by the accel.checkpointing tests: a small prepared training setup, a registered counter, and
comparisons of weights and of leftover hidden folders."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration


class Counter:
    """A registered object: its value tells which checkpoint was loaded."""

    def __init__(self, value: int = 0):
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value, "history": [self.value, "x"], "t": torch.tensor([self.value])}

    def load_state_dict(self, state: dict) -> None:
        self.value = int(state["value"])


class Setup:
    def __init__(self, accelerator, model, optimizer, scheduler, loader, counter):
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.scheduler, self.loader, self.counter = scheduler, loader, counter

    def train(self, epochs: int = 1, max_steps: int | None = None) -> list[str]:
        losses: list[str] = []
        acc = self.accelerator
        for _ in range(epochs):
            for x, y in self.loader:
                with acc.autocast():
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                acc.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                losses.append(loss.float().item().hex())
                if max_steps is not None and len(losses) >= max_steps:
                    return losses
        return losses

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}


def make(n_models: int = 1, counter: int | None = 0, **accelerator_kwargs) -> Setup:
    accelerator = Accelerator(**accelerator_kwargs)
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(16, 4, generator=data)
    y = x.sum(dim=1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    for _ in range(n_models - 1):
        accelerator.prepare(torch.nn.Linear(2, 2))
    obj = None
    if counter is not None:
        obj = Counter(counter)
        accelerator.register_for_checkpointing(obj)
    return Setup(accelerator, model, optimizer, scheduler, loader, obj)


def auto(project: Path, total_limit: int | None = None) -> ProjectConfiguration:
    return ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, total_limit=total_limit)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

