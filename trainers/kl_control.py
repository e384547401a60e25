"""KL coefficient controllers: fixed, and adaptive (Ziegler et al. 2019, as in verl).

Adaptive: after each step with measured KL ``kl`` over ``n_steps`` samples,
``error = clip(kl / target - 1, -0.2, 0.2)`` and ``coef *= 1 + error * n_steps / horizon``:
too much KL raises the coefficient, too little lowers it, by at most 20% per horizon.
"""

from __future__ import annotations

from dataclasses import dataclass

PROPORTIONAL_CLIP = 0.2


@dataclass
class FixedKLController:
    """A constant coefficient ``value``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@dataclass
class AdaptiveKLController:
    """Moves ``value`` so the observed KL approaches ``target`` over ``horizon`` steps."""

    value: float
    target: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target <= 0 or self.horizon <= 0:
            raise ValueError(
                f"adaptive KL needs target > 0 and horizon > 0, got {self.target}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """Proportional step towards the target (module docstring)."""
        error = current_kl / self.target - 1.0
        error = min(max(error, -PROPORTIONAL_CLIP), PROPORTIONAL_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(
    coef: float, adaptive: bool, target: float, horizon: int
) -> FixedKLController | AdaptiveKLController:
    """The controller the ``algorithm`` options ask for (``kl_coef``, ``adaptive_kl``, ...)."""
    if adaptive:
        return AdaptiveKLController(coef, target, horizon)
    return FixedKLController(coef)
