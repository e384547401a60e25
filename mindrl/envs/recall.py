"""Recall: a two-turn environment for the built-in tiny tokenizer that only a policy which
reads the environment's observation can solve.

An episode:

1. ``reset`` starts from the record's prompt (the tiny task's ``"next 3 1 4 ="``; its
   answer is not used) or from ``prompt`` (``configs/tiny_env.yaml``: ``"?"``). The model
   takes a first turn: any text, unrewarded.
2. ``step`` answers that turn with the observation ``"copy 7 ="``: the secret, ``length``
   digits drawn uniformly at random for this episode alone (not from the prompt, the
   record or anything the model wrote), reward 0, not done.
3. The model's second turn is scored by the digit task's partial credit
   (:func:`mindrl.rewards.digit_partial_reward`) against the secret: 1.0 for exactly the
   secret, less for extra or wrong digits, 0 when the first digit is wrong. Done.

Why a policy that ignores observations cannot pass 0.1 (the issue's bar is 0.5): the
secret's digits ``S_1..S_L`` are uniform over 0-9 and independent of everything such a
policy conditions on (the prompt, its own first turn, its sampling noise), so its second
turn's symbols ``A_1, A_2, ...`` are independent of them. Partial credit is
``#{i <= L: A_i == S_i} / max(len(A), L) <= #{i <= L: A_i == S_i} / L``, and
``P(A_i == S_i) = sum_a P(A_i = a) P(S_i = a) = 1/10`` for each position, so
``E[reward] <= 1/10`` for any length (``1 / 10**L`` counting exact answers only). With
``k`` equally likely secrets in general, ``1/k`` per position. A policy that reads the
observation copies ``S`` and earns 1.0. ``tests/envs/test_recall.py`` checks both
numerically.

The secret comes from a fresh, unseeded generator per instance (one instance per episode),
so the N episodes of one GRPO group see different secrets and no prompt identifies one.
Pass ``seed`` only to make a test reproducible.
"""

from __future__ import annotations

import random

from mindrl.data.records import PromptRecord
from mindrl.data.tokenizer import EOS, PAD
from mindrl.rewards.digits import digit_partial_reward

# Words of the tiny vocabulary (mindrl.data.tokenizer.TINY_WORDS): the observation reads
# like the tiny-copy prompt, so the secret sits one token before the turn starts.
OBSERVATION_HEAD = "copy"
OBSERVATION_TAIL = "="
SPECIAL_TEXT = (EOS, PAD)


class RecallEnv:
    """Shows a random secret after the model's first turn and rewards repeating it.

    Args:
        length: Digits of the secret (``k = 10**length`` equally likely secrets).
        prompt: The text every episode starts with; ``None``: the record's prompt. A
            prompt without digits (``"?"``) leaves the secret the only digit the model
            sees, so its attention is not split over the tiny task's prompt digits.
        seed: Seed of this episode's secret; ``None`` (the default) draws from the
            operating system's entropy so every episode's secret is independent.
    """

    def __init__(self, length: int = 1, prompt: str | None = None, seed: int | None = None) -> None:
        if length < 1:
            raise ValueError(f"RecallEnv length must be >= 1 digit, got {length}")
        self.length = length
        self.prompt = prompt
        self._rng = random.Random(seed)
        self.secret = ""
        self._turn = 0

    def reset(self, record: PromptRecord) -> str:
        """The episode starts with the record's prompt (or ``prompt``); a new secret is drawn."""
        self.secret = " ".join(str(self._rng.randrange(10)) for _ in range(self.length))
        self._turn = 0
        return record.text if self.prompt is None else self.prompt

    def step(self, action: str) -> tuple[str, float, bool]:
        """First turn: the secret as observation, reward 0. Second: the reward, done."""
        self._turn += 1
        if self._turn == 1:
            return f"{OBSERVATION_HEAD} {self.secret} {OBSERVATION_TAIL}", 0.0, False
        return "", digit_partial_reward(_without_special_tokens(action), self.secret), True


def _without_special_tokens(text: str) -> str:
    # The turn's eos (or padding) may reach us as text, depending on how the loop
    # decodes; it is the end of the turn, not a wrong digit.
    for special in SPECIAL_TEXT:
        text = text.replace(special, " ")
    return text
