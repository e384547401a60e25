"""The recall environment alone: its episode, and the bound on policies that ignore what
it says (mindrl/envs/recall.py's docstring has the argument)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from mindrl.data.records import PromptRecord
from mindrl.envs.recall import RecallEnv

RECORD = PromptRecord(uid="tiny-next-0", text="next 3 1 4 =", answer="5")
EPISODES = 5_000
# Three standard deviations of a Bernoulli(0.1) mean over EPISODES episodes, ~0.013.
TOLERANCE = 3 * (0.1 * 0.9 / EPISODES) ** 0.5

# A policy answers a turn from what it has seen so far: the prompt, then its own first
# turn and, for a policy that reads it, the observation.
Policy = Callable[[str, str, random.Random], str]


def play(env: RecallEnv, policy: Policy, rng: random.Random) -> float:
    """One episode: the first turn is a fixed knock, the second the policy's answer."""
    prompt = env.reset(RECORD)
    observation, first_reward, done = env.step("5")
    assert (first_reward, done) == (0.0, False)
    _, reward, done = env.step(policy(prompt, observation, rng))
    assert done
    return first_reward + reward


def mean_reward(policy: Policy, length: int = 1, seed: int = 0) -> float:
    rng = random.Random(seed)
    total = sum(
        play(RecallEnv(length=length, seed=rng.randrange(2**32)), policy, rng)
        for _ in range(EPISODES)
    )
    return total / EPISODES


def reads_the_observation(prompt: str, observation: str, rng: random.Random) -> str:
    return " ".join(observation.split()[1:-1])  # "copy 7 =" -> "7"


def always_seven(prompt: str, observation: str, rng: random.Random) -> str:
    return "7"


def uniform_digit(prompt: str, observation: str, rng: random.Random) -> str:
    return str(rng.randrange(10))


def from_the_prompt(prompt: str, observation: str, rng: random.Random) -> str:
    return prompt.split()[-2]  # the prompt's last digit: uses the prompt, not the observation


def repeats_its_guess_with_eos(prompt: str, observation: str, rng: random.Random) -> str:
    return f"{rng.randrange(10)} </s>"


def test_the_episode_reveals_the_secret_then_scores_the_answer():
    env = RecallEnv(seed=3)
    assert env.reset(RECORD) == "next 3 1 4 ="
    observation, reward, done = env.step("anything")
    assert observation == f"copy {env.secret} =" and (reward, done) == (0.0, False)
    assert env.step(f"{env.secret} </s>") == ("", 1.0, True)


def test_a_fixed_prompt_replaces_the_records():
    assert RecallEnv(prompt="?").reset(RECORD) == "?"


def test_the_second_turn_earns_partial_credit_for_extra_or_wrong_digits():
    env = RecallEnv(length=2, seed=3)
    env.reset(RECORD)
    env.step("")
    first, second = env.secret.split()
    assert env.step(f"{first} {second} 9")[1] == pytest.approx(2 / 3)  # one digit too many
    env.reset(RECORD)
    env.step("")
    first, second = env.secret.split()
    assert env.step(f"{first} {(int(second) + 1) % 10}")[1] == pytest.approx(0.5)
    env.reset(RECORD)
    env.step("")
    first, second = env.secret.split()
    assert env.step(f"{(int(first) + 1) % 10} {second}")[1] == pytest.approx(0.5)


def test_a_policy_that_reads_the_observation_earns_full_reward():
    assert mean_reward(reads_the_observation, length=1) == 1.0
    assert mean_reward(reads_the_observation, length=3) == 1.0


@pytest.mark.parametrize(
    "policy", [always_seven, uniform_digit, from_the_prompt, repeats_its_guess_with_eos]
)
def test_a_policy_blind_to_observations_scores_at_most_one_in_ten(policy):
    assert mean_reward(policy) <= 0.1 + TOLERANCE


def test_blind_guesses_at_longer_secrets_score_at_most_one_in_ten_per_digit():
    def two_digits(prompt: str, observation: str, rng: random.Random) -> str:
        return f"{rng.randrange(10)} {rng.randrange(10)}"

    assert mean_reward(two_digits, length=2) <= 0.1 + TOLERANCE


def test_every_episode_draws_its_own_uniform_secret():
    secrets = Counter()
    for _ in range(EPISODES):
        env = RecallEnv()  # unseeded, as a run builds them
        env.reset(RECORD)
        secrets[env.secret] += 1
    assert sorted(secrets) == [str(digit) for digit in range(10)]
    # Pearson's chi-square over the ten digits (9 degrees of freedom): above 46 a uniform
    # draw lands once in ~1.7 million runs; a draw over nine digits scores ~550. (A bound
    # on the largest count at 3 sigma failed ~1 % of unseeded runs: ten counts, one max.)
    expected = EPISODES / 10
    chi_square = sum((count - expected) ** 2 / expected for count in secrets.values())
    assert chi_square < 46.0, secrets


def test_a_secret_needs_at_least_one_digit():
    with pytest.raises(ValueError, match="length must be >= 1"):
        RecallEnv(length=0)
