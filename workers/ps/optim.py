"""The update rule, described by workers and applied by servers.

MXNet's `kv.set_optimizer` pickles an optimizer object to the servers. We send a small JSON
description instead (nothing executable crosses the wire) and build a torch.optim optimizer
from it on each server, over that server's slots only. Using torch.optim rather than our own
arithmetic is what makes dist_sync reproduce DDP: the server runs exactly the step a DDP rank
runs, on the same averaged gradient. The learning rate travels with every push, so a schedule
lives in the training script, as it does with DDP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.optim import SGD, Adam, Optimizer

from workers.ps.errors import ProtocolError

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class OptimizerSpec:
    """What to run on the servers; `lr` is only the initial rate (pushes carry the current one)."""

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.lr <= 0 or self.momentum < 0 or self.weight_decay < 0:
            raise ValueError("lr must be positive, momentum and weight_decay not negative")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OptimizerSpec:
        try:
            data = dict(data)
            data["betas"] = tuple(data.get("betas", (0.9, 0.999)))
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad optimizer description {data!r}: {exc}") from None


def sgd(
    lr: float = 0.01, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0
) -> OptimizerSpec:
    return OptimizerSpec(
        "sgd", lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
    )


def adam(
    lr: float = 0.001,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> OptimizerSpec:
    return OptimizerSpec("adam", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class Updater:
    """A server's optimizer over its slots: one param group per slot, so slots can be added by
    later `init` calls and updated in any subset (a push may carry only some keys)."""

    def __init__(self, spec: OptimizerSpec) -> None:
        self.spec = spec
        self._optimizer: Optimizer | None = None
        self._params: dict[int, torch.Tensor] = {}

    def add(self, slot: int, value: torch.Tensor) -> None:
        """Take `value` (float32, CPU) as the parameter of `slot`; steps update it in place."""
        param = value.requires_grad_(True)
        self._params[slot] = param
        if self._optimizer is None:
            self._optimizer = self._build(param)
        else:
            self._optimizer.add_param_group({"params": [param]})

    def step(self, grads: Sequence[tuple[int, torch.Tensor]], lr: float) -> None:
        """One optimizer step on the given slots; the others keep their values and state."""
        assert self._optimizer is not None, "step before any slot was added"
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        for slot, grad in grads:
            self._params[slot].grad = grad
        self._optimizer.step()
        for slot, _ in grads:
            self._params[slot].grad = None

    def _build(self, first: torch.Tensor) -> Optimizer:
        spec = self.spec
        if spec.name == "adam":
            return Adam(
                [first], lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
            )
        return SGD(
            [first],
            lr=spec.lr,
            momentum=spec.momentum,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
        )
