"""Throughput (docs/architecture.md §7), the one-line-per-iteration progress report,
and the progress bar shown while responses are generated."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tqdm.auto import tqdm

from mindrl.metrics.memory import MEMORY_RECORD_KEY, format_memory
from mindrl.metrics.rewards import DOMAIN_PREFIX, DROPPED_GROUPS, FAILED_SHARE
from mindrl.metrics.validation import VAL_PREFIX

# (metric key, label, format) of the progress line, in print order. A key a trainer
# does not report (e.g. KL with kl_coef 0 not measured) prints as "-".
PROGRESS_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward_mean", "reward", ".3f"),
    ("response_length_mean", "resp_len", ".1f"),
    ("kl", "kl", ".4f"),
    ("entropy", "entropy", ".3f"),
    ("clip_fraction", "clip", ".3f"),
    ("tps", "tps", ".0f"),
)
#: Validation results printed when a record has them (after the iterations it ran).
VAL_PROGRESS_KEYS = (f"{VAL_PREFIX}reward_mean", f"{VAL_PREFIX}pass@")
#: The line of an offline preference run (DPO): no reward, generation or clipping.
PREFERENCE_PROGRESS_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("loss", "loss", ".4f"),
    ("preference_accuracy", "pref_acc", ".3f"),
    ("chosen_reward", "chosen", ".3f"),
    ("rejected_reward", "rejected", ".3f"),
    ("reward_margin", "margin", ".3f"),
    ("entropy", "entropy", ".3f"),
)
#: The line of an embodied run: its episodes' success, return and length.
EMBODIED_PROGRESS_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("success_rate", "success", ".3f"),
    ("reward_mean", "return", ".3f"),
    ("episode_length_mean", "ep_len", ".1f"),
    ("entropy", "entropy", ".3f"),
    ("clip_fraction", "clip", ".3f"),
    ("grad_norm", "grad_norm", ".3f"),
    ("env_frames_per_s", "frames/s", ".0f"),
)
STAGE_TIMES_KEY = "time"  # record["time"] = {stage: seconds}
ITERATION_TIME_KEY = "iteration_time_s"


def tokens_per_second(
    num_prompts: int,
    samples_per_prompt: int,
    mean_prompt_length: float,
    mean_response_length: float,
    num_devices: int,
    iteration_time_s: float,
) -> float:
    """TPS = G*N*(mean L_p + mean L_r) / (n_devices * T_iter), docs/architecture.md §7.

    Args:
        num_prompts: G, prompts per iteration.
        samples_per_prompt: N, responses per prompt.
        mean_prompt_length: Mean prompt length in tokens.
        mean_response_length: Mean response length in tokens.
        num_devices: Devices (CPU: worker processes) the run uses.
        iteration_time_s: Wall time of the iteration.

    Raises:
        ValueError: a non-positive device count or iteration time.
    """
    if num_devices <= 0 or iteration_time_s <= 0:
        raise ValueError(
            f"TPS needs num_devices > 0 and iteration_time_s > 0, got {num_devices} and "
            f"{iteration_time_s}"
        )
    tokens = num_prompts * samples_per_prompt * (mean_prompt_length + mean_response_length)
    return tokens / (num_devices * iteration_time_s)


def mean_tps(records: Sequence[Mapping[str, Any]], warmup: int = 1, window: int = 5) -> float:
    """Mean ``tps`` over ``window`` iterations after the first ``warmup`` ones (Eq. 5).

    Raises:
        ValueError: fewer records with ``tps`` than ``warmup + 1``.
    """
    values = [float(r["tps"]) for r in records if "tps" in r][warmup : warmup + window]
    if not values:
        raise ValueError(f"no TPS after {warmup} warm-up iterations; run more iterations")
    return sum(values) / len(values)


def _format_value(value: Any, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)


def format_progress_line(iteration: int, metrics: Mapping[str, Any]) -> str:
    """One line: iteration, reward, response length, KL, entropy, clip fraction, TPS,
    validation results when there are any, iteration time, the time of every stage and
    each role's memory peak. A preference run (DPO) shows its loss, preference accuracy,
    rewards and margin in place of reward .. TPS; an embodied run its success rate,
    episode return and length, and environment frames per second.

    Example: ``iter 12 | reward 0.734 | resp_len 2.1 | kl - | ... | time 4.21s
    (rollout 2.10 reward 0.05 update 1.90)``.
    """
    fields = PROGRESS_FIELDS
    if "preference_accuracy" in metrics:
        fields = PREFERENCE_PROGRESS_FIELDS
    elif "success_rate" in metrics:
        fields = EMBODIED_PROGRESS_FIELDS
    parts = [f"iter {iteration:>4d}"]
    parts += [f"{label} {_format_value(metrics.get(key), spec)}" for key, label, spec in fields]
    parts += _domain_rewards(metrics)
    parts += [
        f"{key} {_format_value(value, '.3f')}"
        for key, value in metrics.items()
        if key.startswith(VAL_PROGRESS_KEYS)
    ]
    stages = metrics.get(STAGE_TIMES_KEY) or {}
    total = metrics.get(ITERATION_TIME_KEY)
    stage_text = " ".join(f"{name} {seconds:.2f}" for name, seconds in stages.items())
    parts.append(f"time {_format_value(total, '.2f')}s ({stage_text})")
    if metrics.get(MEMORY_RECORD_KEY):
        parts.append(f"peak {format_memory(metrics[MEMORY_RECORD_KEY])}")
    return " | ".join(parts)


def _domain_rewards(metrics: Mapping[str, Any]) -> list[str]:
    """``math 0.812 code 0.250 failed 1.6%``: each domain's reward where the data holds
    more than one, and the share of samples whose reward failed where any did."""
    domains = {
        key.removeprefix(DOMAIN_PREFIX): value
        for key, value in metrics.items()
        if key.startswith(DOMAIN_PREFIX) and key not in (FAILED_SHARE, DROPPED_GROUPS)
    }
    parts = []
    if len(domains) > 1:
        parts.append(" ".join(f"{name} {value:.3f}" for name, value in sorted(domains.items())))
    if metrics.get(FAILED_SHARE):
        parts.append(f"reward failed {metrics[FAILED_SHARE]:.1%}")
    return parts


def print_progress_line(line: str) -> None:
    """Print a progress line without breaking an active progress bar."""
    tqdm.write(line)


def generation_progress(
    total: int, enabled: bool = True, desc: str = "generate", file: IO[str] | None = None
) -> tqdm:
    """A progress bar over ``total`` responses; use as a context manager and ``update(n)``.

    The bar is drawn only when ``file`` (default: stderr) is a terminal: it redraws itself
    with carriage returns, which a terminal shows as one line but a redirected log keeps
    as thousands of frames. Disabled bars (``enabled=False``, e.g.
    ``logging.progress_bar: false``, or no terminal) cost nothing.
    """
    stream = sys.stderr if file is None else file
    shown = enabled and _is_terminal(stream)
    return tqdm(total=total, desc=desc, unit="resp", leave=False, file=stream, disable=not shown)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)  # wrappers (Ray's, pytest's) may lack it
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
