"""KL coefficient controllers: fixed, and adaptive (Ziegler et al. 2019)."""

from __future__ import annotations

from dataclasses import dataclass

PROPORTIONAL_CLIP = 0.2


@dataclass
class FixedKLController:
    """A constant coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@dataclass
class AdaptiveKLController:
    """Moves the coefficient so the observed KL approaches ``target``.

    ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``.
    """

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -PROPORTIONAL_CLIP), PROPORTIONAL_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(
    coef: float, adaptive: bool, target: float, horizon: int
) -> FixedKLController | AdaptiveKLController:
    if adaptive:
        return AdaptiveKLController(coef, target, horizon)
    return FixedKLController(coef)
