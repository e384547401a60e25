"""The vision-language-action policy (``families/vla.py``) on the training engine, float64.

One 1-rank spawn (TP=1 reference, the one-token chunk, the default size) and one 2-rank
spawn (TP=2) cover: the update's log-probs equal generation's for both decodes, only
action ids are drawn, TP=2 scores and trains like TP=1, and the two decodes agree where
they must (a one-token chunk).
"""

from __future__ import annotations

import pytest
import torch

from backends.megatron.families.vla import ACTION_BINS, VLAHeads, bin_centres
from tests.megatron import vla_cases
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-9, "atol": 1e-12}
DECODES = ("autoregressive", "parallel")


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("vla_ckpt"))


@pytest.fixture(scope="module")
def one(checkpoint_root):
    (result,) = run_ranks(vla_cases.on_one_rank, 1, checkpoint_root)
    return result


@pytest.fixture(scope="module")
def two(one, checkpoint_root):  # resumes the checkpoint the one-rank run wrote
    return run_ranks(vla_cases.on_two_ranks, 2, checkpoint_root)


def assert_same_full_tensors(result: dict, reference: dict, zero_padding: bool = True) -> None:
    """Equal to rounding; TP=2 pads the odd vocabulary by one row, which stays zero
    (``zero_padding``) where the weights were loaded with zero padding rows."""
    assert result.keys() == reference.keys()
    for name, tensor in reference.items():
        if tensor.dim() == 0:  # a scalar (the keypoints' sharpness) has no padding
            torch.testing.assert_close(result[name], tensor, **EXACT, msg=name)
            continue
        padded, padding = result[name][: len(tensor)], result[name][len(tensor) :]
        torch.testing.assert_close(padded, tensor, **EXACT, msg=name)
        assert not (zero_padding and bool(padding.any())), name


def test_the_default_policy_has_one_to_three_million_parameters(one):
    assert 1_000_000 <= one["default_size"] <= 3_000_000


@pytest.mark.parametrize("decode", DECODES)
def test_the_update_scores_a_generated_chunk_with_generations_own_log_probs(one, decode):
    run = one["tp1"][decode]
    chunk = run["generated"]
    assert chunk.action_ids.shape == (vla_cases.ROWS, vla_cases.VLA.action_tokens)
    torch.testing.assert_close(run["scored"]["logprobs"], chunk.logprobs, **EXACT)
    torch.testing.assert_close(run["scored"]["values"], chunk.values, **EXACT)


@pytest.mark.parametrize("decode", DECODES)
def test_only_action_ids_are_ever_drawn(one, decode):
    ids = one["tp1"][decode]["generated"].action_ids
    first = vla_cases.TRUNK.vocab_size - ACTION_BINS
    assert bool(((ids >= first) & (ids < vla_cases.TRUNK.vocab_size)).all())
    # top-k 50 of 256: a drawn token is never impossible under the scored distribution
    assert bool(torch.isfinite(one["tp1"][decode]["generated"].logprobs).all())


def test_the_value_head_gives_one_value_per_row_or_one_per_action(one):
    assert one["tp1"]["scored"]["values"].shape == (vla_cases.ROWS, 1)
    per_action = (vla_cases.ROWS, vla_cases.VLA.chunk_size)
    assert one["tp1_gaussian"]["scored"]["values"].shape == per_action
    assert one["tp1_gaussian"]["parallel"]["generated"].values.shape == per_action
    # Read alone (a truncated episode's bootstrap), it is the value generation gave.
    for decode in DECODES:
        generated = one["tp1"][decode]["generated"].values
        torch.testing.assert_close(one["tp1"]["values"], generated, **EXACT)
    assert one["tp1"]["scored"]["entropy"].shape == (vla_cases.ROWS, vla_cases.VLA.action_tokens)


def test_the_value_head_steps_at_its_own_lr_while_the_trunk_keeps_the_policys(one):
    # The policy's lr is 0 and the head's 1e-2: only the head moves, by AdamW's first
    # step of about the lr per weight.
    step = one["value_lr"]
    assert step["metrics"]["lr"] == 0.0  # the lr reported is the policy's
    moved = {}
    for name, weight in step["weights"].items():
        moved[name] = (weight - step["initial"][name]).abs().max().item()
    head = {name for name in moved if "value_head." in name}
    assert head == {"vla.value_head.weight", "vla.value_head.bias"}
    assert all(0.5e-2 < moved[name] <= 1.01e-2 for name in head), moved
    assert all(moved[name] == 0.0 for name in moved.keys() - head)


def test_a_one_token_chunk_is_drawn_from_the_same_distribution_by_both_decodes(one):
    auto, parallel = one["one_token"]["autoregressive"], one["one_token"]["parallel"]
    torch.testing.assert_close(auto["logits"], parallel["logits"], **EXACT)
    assert torch.equal(auto["chunk"].action_ids, parallel["chunk"].action_ids)
    torch.testing.assert_close(auto["chunk"].logprobs, parallel["chunk"].logprobs, **EXACT)


def test_the_parallel_decode_reads_its_placeholders_not_the_drawn_ids(one):
    # One chunk scored both ways: the first token is read off the prompt alone, the
    # later ones off the drawn ids (autoregressive) or the placeholders (parallel).
    auto = one["tp1"]["autoregressive"]["scored"]["logprobs"]
    parallel = one["tp1"]["parallel_view_of_autoregressive"]
    torch.testing.assert_close(parallel[:, 0], auto[:, 0], **EXACT)
    assert not bool(torch.isclose(parallel[:, 1:], auto[:, 1:]).any())


@pytest.mark.parametrize("decode", DECODES)
def test_noise_drawn_per_environment_gives_a_row_its_chunk_whatever_batch_it_is_in(one, decode):
    run = one["per_environment"][decode]
    parts = run["parts"]
    assert torch.equal(run["whole"].action_ids, torch.cat([p.action_ids for p in parts]))
    joined = torch.cat([p.logprobs for p in parts])
    torch.testing.assert_close(run["whole"].logprobs, joined, **EXACT)


def test_an_observation_of_another_shape_or_dtype_is_refused_naming_what_it_reads(one):
    assert one["per_environment"]["float_images"] == (
        "images are torch.float32 (3, 16, 16, 3); this policy reads uint8 [3, 16, 16, 3]"
    )


def test_tp2_scores_a_batch_with_images_and_states_exactly_like_tp1(one, two):
    for rank in range(2):
        for key in ("logprobs", "entropy", "values"):
            torch.testing.assert_close(
                two[rank]["tp2"]["scored"][key], one["tp1"]["scored"][key], **EXACT
            )


@pytest.mark.parametrize("decode", DECODES)
def test_tp2_generates_the_chunk_tp1_generates(one, two, decode):
    for rank in range(2):
        mine, theirs = two[rank]["tp2"][decode]["generated"], one["tp1"][decode]["generated"]
        assert torch.equal(mine.action_ids, theirs.action_ids)
        torch.testing.assert_close(mine.logprobs, theirs.logprobs, **EXACT)


@pytest.mark.parametrize("decode", DECODES)
def test_the_gaussian_head_scores_a_chunk_with_generations_own_log_probs(one, decode):
    run = one["tp1_gaussian"][decode]
    torch.testing.assert_close(run["scored"]["logprobs"], run["generated"].logprobs, **EXACT)
    assert not torch.equal(run["scored"]["logprobs"], one["tp1"][decode]["scored"]["logprobs"])


def test_at_tp2_the_gaussian_head_scores_draws_and_gets_gradients_like_tp1(one, two):
    reference = one["tp1_gaussian"]
    assert any(name.startswith("vla.action_head.") for name in reference["grads"])
    assert any(name.startswith("vla.keypoints.film.") for name in reference["grads"])
    for rank in range(2):
        mine = two[rank]["tp2_gaussian"]
        for key in ("logprobs", "entropy", "values"):
            torch.testing.assert_close(mine["scored"][key], reference["scored"][key], **EXACT)
        for decode in DECODES:
            drawn, expected = mine[decode]["generated"], reference[decode]["generated"]
            assert torch.equal(drawn.action_ids, expected.action_ids)
        assert_same_full_tensors(mine["grads"], reference["grads"])


def test_the_gaussian_heads_bins_keep_their_order():
    """Its most likely bin holds the mean, and a step raising one bin's log-prob raises
    the bins beside it too (each of the token head's bins is its own row)."""
    torch.manual_seed(0)
    heads = VLAHeads(8, vla_cases.GAUSSIAN, torch.float64)
    hidden = torch.randn(1, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    log_probs = torch.log_softmax(heads.gaussian_logits(hidden), dim=-1)[0, 0]
    mean = torch.tanh(heads.action_head(hidden)[0, 0, 0])
    assert abs(bin_centres(log_probs)[log_probs.argmax()] - mean) <= 1.0 / ACTION_BINS
    target = int(log_probs.argmax()) + 40  # a bin off the mode
    log_probs[target].backward()
    with torch.no_grad():
        for parameter in heads.parameters():
            if parameter.grad is not None:
                parameter += 0.01 * parameter.grad  # a small step: first order holds
    moved = torch.log_softmax(heads.gaussian_logits(hidden), dim=-1)[0, 0] - log_probs.detach()
    assert moved[target] > 0 and moved[target - 1] > 0 and moved[target + 1] > 0


def test_tp2_gradients_equal_tp1_gradients(one, two):
    reference = one["tp1"]["grads"]
    assert any(name.startswith("vla.") for name in reference)
    for rank in range(2):
        assert_same_full_tensors(two[rank]["tp2"]["grads"], reference)


@pytest.mark.parametrize("layout", ["engine", "dp2_engine"])
def test_an_engine_step_at_tp2_or_dp2_updates_the_policy_exactly_like_one_rank(one, two, layout):
    reference = one["engine"]
    moved = reference["weights"]["vla.patch_embedding.weight"]
    assert not torch.allclose(moved, reference["initial"]["vla.patch_embedding.weight"].double())
    for rank in range(2):
        step = two[rank][layout]
        for key in ("loss", "grad_norm"):
            assert step["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-9)
        assert_same_full_tensors(step["weights"], reference["weights"])


def test_a_checkpoint_written_at_tp1_resumes_the_same_policy_at_tp2(one, two):
    for rank in range(2):
        # A resume leaves the padding rows as the fresh engine drew them: no id reads them.
        assert_same_full_tensors(two[rank]["resumed"], one["engine"]["weights"], False)
