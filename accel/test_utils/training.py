"""The toy regression model and data set Accelerate's tests train on (same fields and numbers)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["RegressionDataset", "RegressionModel", "ResidualBlock", "ResidualMLP"]


class RegressionDataset:
    """``length`` samples of ``y = a * x + b + noise`` with ``x ~ N(0, 1)`` and ``noise ~ N(0, 0.1)``.

    Draws from ``numpy.random.default_rng(seed)``: first all ``x``, then all the noise, both as
    float32, so a seed gives the same numbers as Accelerate's ``RegressionDataset``. Items are
    ``{"x": x[i], "y": y[i]}``.
    """

    def __init__(self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None):
        generator = np.random.default_rng(seed)
        self.length = length
        self.x = generator.normal(size=(length,)).astype(np.float32)
        noise = generator.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = a * self.x + b + noise

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.float32]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """``forward(x) = x * a + b`` with scalar float32 parameters ``a`` and ``b``.

    ``double_output`` is accepted for compatibility and, as in Accelerate, unused. Unlike
    Accelerate's model, the first forward does not print the dtypes; ``first_batch`` still turns
    False after it.
    """

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.double_output = double_output
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        self.first_batch = False
        return x * self.a + self.b


class ResidualBlock(torch.nn.Module):
    """A pre-norm residual MLP block (LayerNorm, Linear up, ReLU, Linear down): layers to quantize or offload."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the block's MLP of its normalised value."""
        return x + self.down(torch.relu(self.up(self.norm(x))))


class ResidualMLP(torch.nn.Module):
    """Residual blocks then a linear head; ``blocks.N`` and ``head`` are the units a device map places."""

    def __init__(self, width: int = 64, depth: int = 3, outputs: int = 8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(ResidualBlock(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The head's output after every block."""
        for block in self.blocks:
            x = block(x)
        return self.head(x)
