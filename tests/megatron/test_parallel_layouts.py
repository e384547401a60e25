"""TP=2, PP=2 (own loop), DP=2 and EP=2 give the loss, gradients and update of one rank.

All layouts start from the same full weights (drawn per canonical name) and train one
step on the same global batch; the single-rank run is the reference. TP > 1 runs with
sequence parallelism, which also lets MoE use TP (TP=2, TP=2 x EP=2, TP=2 x PP=2).
Also: vocab-parallel log-probs and entropy equal a plain ``log_softmax`` on the gathered
full logits, and a checkpoint resume reproduces the next step's loss exactly.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from backends.megatron import ParallelSpec, ResponseBatch
from backends.megatron.families import get_family
from backends.megatron.spec import validate
from tests.megatron import cases
from tests.support.spawn import run_ranks

TOL = cases.SAME_DEVICE_TOL


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 1-rank spawn (references, resume) and one 2-rank spawn (all layouts)."""
    root = str(tmp_path_factory.mktemp("ckpt"))
    (reference,) = run_ranks(cases.reference_on_one_rank, 1, root)
    two = run_ranks(cases.layouts_on_two_ranks, 2)
    return reference, two


@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
def test_a_two_rank_dense_layout_trains_exactly_like_one_rank(runs, layout):
    reference, two = runs
    for rank in range(2):
        cases.assert_same_step(two[rank][layout], reference["dense"])


def test_an_uneven_pipeline_puts_first_stage_layers_first_and_trains_like_one_rank(runs):
    reference, two = runs
    layers = [
        sorted(
            {
                name.split(".")[2]
                for name in two[rank]["pp2_uneven"]["layouts"]
                if ".layers." in name
            }
        )
        for rank in range(2)
    ]
    assert layers == [["0"], ["1", "2"]]
    for rank in range(2):
        cases.assert_same_step(two[rank]["pp2_uneven"], reference["dense3"])


def test_expert_parallel_moe_trains_exactly_like_one_rank(runs):
    reference, two = runs
    cases.assert_same_step(two[0]["ep2"], reference["moe"])
    cases.assert_same_step(two[1]["ep2"], reference["moe"])


def per_token_reference(hf_state: dict, batch: ResponseBatch, grad: bool = False):
    """Independent reference from an HF model with these weights: log p and entropy of
    the distribution each response token was drawn from (token t: logits at t - 1),
    ``[B, R]``, computed over the full logits at every position."""
    model = hf_model(hf_state)
    ids = batch.input_ids
    with torch.set_grad_enabled(grad):
        logp_all = torch.log_softmax(model(ids).logits[:, :-1], -1)  # predicts tokens 1..s-1
        logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    start = int(batch.response_start[0])  # cases.batches: the same start in every row
    response = slice(start - 1, start - 1 + batch.width)  # column t - 1 scores token t
    return model, logp[:, response], entropy[:, response]


def test_tensor_parallel_log_probs_and_entropy_match_log_softmax_of_the_full_logits(runs):
    reference, two = runs
    assert two[0]["tp2"]["sequence_parallel"]
    hf = get_family("qwen2").megatron_to_hf(reference["dense"]["initial"], cases.DENSE)
    torch.testing.assert_close(two[0]["tp2"]["logprobs"], reference["dense"]["logprobs"], **TOL)
    batch = cases.batches(cases.DENSE)
    _, logp, entropy = per_token_reference(hf, batch)
    # The logits are computed for the response tokens only; padding reads 0.
    mask = batch.response_mask
    torch.testing.assert_close(two[0]["tp2"]["logprobs"], logp * mask, **TOL)
    torch.testing.assert_close(two[1]["tp2"]["entropy"], entropy * mask, **TOL)


def test_one_training_step_has_the_loss_and_gradients_of_an_hf_model_on_full_logits(runs):
    """The policy loss (log-probs and entropy bonus over the masked tokens, normalised by
    their count) from logits over the masked window only gives the loss and gradients
    of the same loss on an HF model's full logits: nothing is lost outside the window
    and every token is scored with the distribution it was drawn from."""
    reference, _ = runs
    dense = reference["dense"]
    family = get_family("qwen2")
    batch = cases.batches(cases.DENSE)
    model, logp, entropy = per_token_reference(
        family.megatron_to_hf(dense["initial"], cases.DENSE), batch, grad=True
    )
    mask, advantages = batch.response_mask, batch.fields["advantages"]
    loss = ((-logp * advantages - 0.01 * entropy) * mask).sum() / mask.sum()
    loss.backward()

    assert dense["loss"] == pytest.approx(loss.item(), rel=1e-5)
    expected = {n: p.grad for n, p in model.named_parameters()}
    for name, grad in family.megatron_to_hf(dense["grads"], cases.DENSE).items():
        torch.testing.assert_close(grad, expected[name], **TOL, msg=name)


@pytest.fixture(scope="module")
def sp_runs():
    """One 2-rank spawn of the TP=2 layouts with sequence parallelism."""
    return run_ranks(cases.sequence_parallel_layouts, 2)


@pytest.mark.parametrize("layout", ["moe_tp2", "moe_tp2_ep2"])
def test_moe_with_tensor_and_sequence_parallelism_trains_exactly_like_one_rank(
    runs, sp_runs, layout
):
    reference, _ = runs
    for rank in range(2):
        assert sp_runs[rank][layout]["sequence_parallel"]
        cases.assert_same_step(sp_runs[rank][layout], reference["moe"])


def test_moe_with_tp2_and_pp2_trains_exactly_like_one_rank(runs):
    reference, _ = runs
    four = run_ranks(cases.tp2_pp2_on_four_ranks, 4)
    for rank in range(4):
        assert four[rank]["moe_tp2_pp2"]["sequence_parallel"]
        cases.assert_same_step(four[rank]["moe_tp2_pp2"], reference["moe"])


def test_a_sequence_not_divisible_by_tp_is_padded_and_trains_exactly_like_one_rank(runs, sp_runs):
    reference, _ = runs
    for rank in range(2):
        odd = sp_runs[rank]["dense_tp2_odd"]
        response_width = cases.ODD_LEN - cases.ODD_LEN // 2
        assert odd["sequence_parallel"] and odd["logprobs"].shape == (4, response_width)
        cases.assert_same_step(odd, reference["dense_odd"])


def test_sequence_parallel_log_probs_and_entropy_match_log_softmax_of_the_full_logits(
    runs, sp_runs
):
    reference, _ = runs
    hf = get_family("qwen2").megatron_to_hf(reference["dense_odd"]["initial"], cases.DENSE)
    batch = cases.batches(cases.DENSE, s=cases.ODD_LEN)
    _, logp, entropy = per_token_reference(hf, batch)
    mask = batch.response_mask
    for rank in range(2):
        odd = sp_runs[rank]["dense_tp2_odd"]
        torch.testing.assert_close(odd["logprobs"], logp * mask, **TOL)
        torch.testing.assert_close(odd["entropy"], entropy * mask, **TOL)


def test_a_sequence_parallel_critic_scores_and_learns_exactly_like_one_rank(runs, sp_runs):
    reference, _ = runs
    for rank in range(2):
        critic = sp_runs[rank]["critic_tp2"]
        assert critic["sequence_parallel"]
        torch.testing.assert_close(critic["values"], reference["critic"]["values"], **TOL)
        assert critic["losses"] == pytest.approx(reference["critic"]["losses"], rel=1e-5)


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_activation_checkpointing_trains_exactly_like_keeping_activations(runs, sp_runs, model):
    reference, _ = runs
    for rank in range(2):
        cases.assert_same_step(sp_runs[rank][f"{model}_tp2_recompute"], reference[model])


def test_activation_checkpointing_keeps_a_fraction_of_the_forward_activations(runs):
    reference, _ = runs
    kept = reference["kept_bytes"]
    assert 0 < kept[True] < kept[False] / 3, kept  # 4.7x fewer bytes on this model


def test_moe_with_tp_and_context_parallelism_are_accepted():
    # The layout arithmetic is mindrl's layout validator's (tests/foundation/test_config.py).
    validate(cases.MOE, ParallelSpec(tp=2, ep=2))
    validate(cases.DENSE, ParallelSpec(cp=2))  # test_context_parallel.py runs it


def hf_model(hf_state: dict):
    """A transformers Qwen2 model holding ``hf_state`` (the pre-step weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = cases.DENSE
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.ffn_hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_query_groups,
        rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=True,
        max_position_embeddings=spec.max_position_embeddings,
    )
    model = Qwen2ForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(hf_state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    return model


def test_resuming_from_a_checkpoint_gives_the_next_losses_of_an_uninterrupted_run(runs):
    reference, _ = runs
    resume = reference["resume"]
    assert resume["position"] == {"next_step": 2}
    assert resume["resumed"] == resume["uninterrupted"][2:]  # bit-exact on CPU, 2 steps
    assert resume["uninterrupted"][3] != resume["uninterrupted"][2]


def test_every_parameter_reports_its_layout_for_the_resharder(runs):
    _, two = runs
    tp = two[0]["tp2"]["layouts"]
    attn = "decoder.layers.1.self_attention."
    assert tp[attn + "linear_qkv.weight"].kind == "column"
    assert tp[attn + "linear_qkv.weight"].full_shape == (128, 64)  # (4 + 2*2) heads * 16
    assert tp[attn + "linear_proj.weight"].kind == "row"
    fc1 = tp["decoder.layers.0.mlp.linear_fc1.weight"]
    assert (fc1.kind, fc1.fused_pieces, fc1.full_shape) == ("column", 2, (256, 64))
    assert tp["embedding.word_embeddings.weight"].kind == "vocab"
    assert tp["decoder.final_layernorm.weight"].kind == "replicated"
    pp_stage_1 = two[1]["pp2"]["layouts"]
    assert "decoder.layers.1.input_layernorm.weight" in pp_stage_1  # global layer index
    assert "decoder.layers.0.input_layernorm.weight" not in pp_stage_1
    experts = two[1]["ep2"]["layouts"]
    indexes = {lay.expert_index for lay in experts.values() if lay.is_expert}
    assert indexes == {2, 3}  # EP rank 1 holds the second half of the 4 experts
    assert experts["decoder.layers.1.mlp.router.weight"].expert_index is None


def test_a_critic_with_a_value_head_scores_every_response_token_and_learns(runs):
    reference, _ = runs
    critic = reference["critic"]
    assert critic["values"].shape == (4, 6)  # 2 micro-batches of [2, 12], responses of 6
    losses = critic["losses"]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
