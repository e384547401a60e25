"""The analytic planner pinned to the paper (docs/architecture.md §4, §5)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from mindrl.config import load_config
from mindrl.planner.memory import plan_memory, redundant_bytes
from mindrl.planner.params import activated_params, model_params
from mindrl.planner.render import render_plan
from mindrl.planner.report import build_plan
from mindrl.planner.sample_flow import central_volume_bytes, dispatch_seconds, sample_flow
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB = 2**30


@pytest.mark.parametrize(
    ("recipe", "billions"),
    [("qwen25_7b", 7.62), ("qwen25_32b", 32.76), ("qwen3_30b_a3b", 30.53), ("deepseek671b", 671.0)],
)
def test_recipes_have_the_real_parameter_counts(recipe, billions):
    config = load_config(CONFIGS / f"{recipe}.yaml")
    assert model_params(config.model).total / 1e9 == pytest.approx(billions, rel=2e-3)


@pytest.mark.parametrize(("recipe", "billions"), [("qwen3_30b_a3b", 3.35), ("deepseek671b", 37.5)])
def test_moe_recipes_activate_their_published_share_per_token(recipe, billions):
    config = load_config(CONFIGS / f"{recipe}.yaml")  # published: A3B, 37B activated
    assert activated_params(config.model) / 1e9 == pytest.approx(billions, rel=1e-2)


def test_qwen25_32b_tp8_to_tp4_frees_about_8_gb_per_device():
    config = load_config(CONFIGS / "qwen25_32b.yaml")
    redundant = redundant_bytes(config.model, config.actor.parallel, config.rollout.ep)
    assert redundant / 1e9 == pytest.approx(8.19, abs=0.02)  # paper: 8 GB
    plan = plan_memory(config, 128 * 10**9)
    assert plan.generation_swap.kv_cache_budget - plan.generation_naive.kv_cache_budget >= redundant


def test_a_ppo_plan_keeps_the_reference_and_critic_resident_in_both_stages():
    config = load_config(CONFIGS / "qwen25_32b.yaml")
    grpo = plan_memory(config, 128 * 10**9, ("actor", "rollout", "reference"))
    ppo = plan_memory(config, 128 * 10**9, ("actor", "rollout", "reference", "critic"))
    weights = ppo.training.weights  # the reference: bf16 weights at the actor's TP8
    assert ppo.other_roles["reference"] == weights == grpo.other_roles["reference"]
    # The critic has the actor's layout and optimizer: between its updates it keeps the
    # actor's weights and optimizer state (gradients are released after each update).
    assert ppo.other_roles["critic"] == pytest.approx(ppo.training.resident, rel=1e-3)
    assert ppo.training.resident == ppo.training.weights + ppo.training.optimizer
    assert ppo.training_stage_total == ppo.training.total + weights + ppo.other_roles["critic"]
    # With allgather-swap the actor leaves nothing resident; the others still do.
    assert ppo.generation_swap.resident_training == weights + ppo.other_roles["critic"]
    assert grpo.generation_swap.resident_training == weights


def test_generalised_eq3_matches_the_paper_form_for_the_figure3_layouts():
    # TP2 EP2 DP2 -> TP1 EP4 DP4: M = S_tp/T_u + S_ep*(T_u/D_g - 1/E_g)
    config = load_config(
        None,
        [
            "resources.devices_per_node=4",
            "model.num_experts=4",
            "model.moe_ffn_hidden_size=64",
            "actor.parallel.tp=2",
            "actor.parallel.ep=2",
            "reference.parallel.tp=2",
            "reference.parallel.ep=2",
            "critic.parallel.tp=2",
            "critic.parallel.ep=2",
            "rollout.engine=vllm",  # generation EP is the vllm engine's
            "rollout.tp=1",
            "rollout.ep=4",
        ],
    )
    params = model_params(config.model)
    s_tp, s_ep = params.tp * 4, params.expert * 4  # float32 bytes
    paper = s_tp / 2 + s_ep * (2 / 4 - 1 / 4)
    assert redundant_bytes(config.model, config.actor.parallel, 4) == pytest.approx(paper, abs=8)


# (G, N, L_p, n_l, L_r) -> volume GiB, seconds at 100 MB/s: docs/architecture.md §4
TABLE1_ROWS = [
    ((256, 8, 2048, 5, 8192), 0.96875, 9.92),
    ((8192, 64, 4096, 8, 65536), 3088.0, 31621.12),
]


@pytest.mark.parametrize(("row", "gib", "seconds"), TABLE1_ROWS)
def test_centralized_volume_and_dispatch_time_match_table1(row, gib, seconds):
    g, n, lp, nl, lr = row
    volume = central_volume_bytes(g, n, lp, nl, lr)
    assert volume / GIB == pytest.approx(gib)
    assert dispatch_seconds(volume) == pytest.approx(seconds)


def test_the_dock_splits_the_volume_over_warehouses_with_tiny_metadata():
    flow = sample_flow(256, 8, 2048, 8192, 5, warehouses=16, controllers=6)
    assert flow.dock_metadata_bytes < 0.01 * flow.central_bytes
    assert flow.dock_endpoint_bytes == pytest.approx(
        (flow.central_bytes + flow.dock_metadata_bytes) / 16
    )


def dpo_dry_run(device_bytes: int = 16 * GIB) -> dict:
    """The ``--dry-run`` plan of ``--trainer dpo --config configs/tiny_dpo.yaml``."""
    dpo = get_algorithm("dpo")
    config = load_config(CONFIGS / "tiny_dpo.yaml", algorithm=dpo)
    return build_plan(config, build_run_plan(dpo, config), "cpu", device_bytes, 64 * GIB)


def printed(report: dict) -> str:
    console = Console(file=io.StringIO(), width=200)
    render_plan(report, console)
    return console.file.getvalue()


def test_a_dpo_plan_places_no_generation_engine_and_sizes_no_kv_cache_or_swap():
    report = dpo_dry_run()
    (node,) = report["placement"]
    assert node["roles"] == ["actor", "reference"]
    assert (node["trains"], node["generates"]) == (True, False)
    assert node["td_controllers"] == ["ref_logp", "update"]
    assert list(report["training_layouts"]) == ["actor", "reference"]
    assert report["generation_layout"] is None
    memory = report["memory"]
    assert (memory["generation_naive"], memory["generation_swap"]) == (None, None)
    assert (memory["swap_bytes"], memory["host_swap_bytes"], memory["redundant_bytes"]) == (0, 0, 0)
    # The reference stays resident beside the actor's update: its fp32 weights at TP2.
    assert memory["other_roles"] == {"reference": memory["training"]["weights"]}
    assert (
        memory["training_stage_total"]
        == memory["training"]["total"] + memory["training"]["weights"]
    )
    assert report["allgather_swap"] is False and report["fit_problems"] == []


def test_the_dpo_dry_run_prints_the_training_rows_and_no_generation_kv_or_swap_row():
    text = printed(dpo_dry_run())
    for row in ("actor (train)", "reference (train)", "reference: resident (all stages)"):
        assert row in text
    assert "train: stage total" in text and "ref_logp, update" in text
    for row in ("rollout", "generation ", "gen:", "KV-cache", "allgather-swap", "swapped"):
        assert row not in text
    assert "fits: every stage fits in device memory\n" in text


def test_a_dpo_plan_too_big_for_the_device_names_the_training_stage_only():
    (problem,) = dpo_dry_run(device_bytes=10**6)["fit_problems"]
    assert problem.startswith("training stage (actor + reference) needs 0.0 GB per device")


def test_an_online_plan_still_sizes_generation_beside_training():
    grpo = get_algorithm("grpo")
    config = load_config(CONFIGS / "tiny.yaml", algorithm=grpo)
    report = build_plan(config, build_run_plan(grpo, config), "cpu", 16 * GIB, 64 * GIB)
    assert report["placement"][0]["roles"] == ["actor", "rollout"]  # tiny GRPO: no KL
    assert report["generation_layout"] is not None
    assert report["memory"]["generation_swap"]["kv_cache_budget"] > 0
    assert "gen: KV-cache budget" in printed(report)


def test_one_remote_prompt_put_and_its_announcement_are_all_a_two_node_flow_carries():
    from mindrl.planner.sample_flow import CALL_BYTES, DockLayout, StageWorkers, link_flow

    # 4 samples on 2 nodes, one warehouse each (2 samples per share); one stage whose
    # parts sit beside the warehouses reads the prompt and writes nothing.
    stage = StageWorkers("score", ("prompt_ids",), (), (0, 1), (0, 1), (True, True))
    layout = DockLayout(2, (0, 1), {"score": 0})
    flow = link_flow([stage], ("prompt_ids",), 4, layout, {"prompt_ids": 80.0})
    put, announce, clear = CALL_BYTES["put"], CALL_BYTES["announce"], CALL_BYTES["clear"]
    # The driver (node 0) puts warehouse 1's two prompts: values, a length and an index
    # each; warehouse 1 tells the stage's controller (node 0) their indexes and lengths;
    # at the end the driver clears warehouse 1. Reads are local: nothing else crosses.
    put_out = 2 * 80 + 2 * 8 * 2 + put.request + put.request_per_field
    clear_out = clear.request
    assert flow.up[0] == pytest.approx(put_out + announce.reply + clear_out)
    assert flow.down[1] == flow.up[0]
    assert flow.up[1] == pytest.approx(put.reply + 2 * 16 + announce.request + clear.reply)
    assert flow.calls == 3


def test_a_four_node_tiny_layout_puts_the_centralized_stages_on_node_0s_link():
    from mindrl.planner.report import layout_link_flow

    overrides = ["resources.nodes=4", "resources.devices_per_node=1", "actor.parallel.tp=1",
                 "reference.parallel.tp=1", "critic.parallel.tp=1"]  # fmt: skip
    config = load_config(CONFIGS / "tiny.yaml", overrides)
    plan = build_run_plan(get_algorithm("grpo"), config)
    flow = layout_link_flow(config, plan)
    # Each actor rank reads and writes its own node's warehouse; the driver's prompts and
    # the reward worker's reads and writes (node 0) are what crosses: nodes 1-3 alike.
    assert flow.up[1] == flow.up[2] == flow.up[3] and flow.down[1] == flow.down[3]
    assert flow.down[0] > flow.down[1] and flow.up[0] > flow.up[1]
    one_config = load_config(CONFIGS / "tiny.yaml")
    one_node = layout_link_flow(one_config, build_run_plan(get_algorithm("grpo"), one_config))
    assert one_node.up == [0.0] and one_node.calls == 0


def test_a_groups_prompt_crosses_once_and_grpo_advantages_stay_on_each_node():
    from mindrl.planner.report import layout_link_flow, stage_workers
    from mindrl.planner.sample_flow import DockLayout, StageWorkers, link_flow

    # The driver's prompt put to warehouse 1: 2 samples of one group, sent once.
    stage = StageWorkers("score", ("prompt_ids",), (), (0, 1), (0, 1), (True, True))
    layout = DockLayout(2, (0, 1), {"score": 0})
    each = link_flow([stage], ("prompt_ids",), 4, layout, {"prompt_ids": 80.0})
    once = link_flow([stage], ("prompt_ids",), 4, layout, {"prompt_ids": 80.0}, prompt_repeat=2)
    assert each.up[0] - once.up[0] == pytest.approx(80 + 8)  # one value row, one length

    overrides = ["resources.nodes=4", "resources.devices_per_node=1", "actor.parallel.tp=1",
                 "reference.parallel.tp=1", "critic.parallel.tp=1", "reward.workers=4"]  # fmt: skip
    config = load_config(CONFIGS / "tiny.yaml", overrides)
    grpo = layout_link_flow(config, build_run_plan(get_algorithm("grpo"), config))
    # A reward worker and a warehouse per node, group-local advantages: every node's
    # link carries the same (the driver's prompts, claims and announcements aside).
    assert grpo.down[1] == grpo.down[2] == grpo.down[3]
    one_worker = load_config(CONFIGS / "tiny.yaml", overrides[:-1])
    on_node_0 = layout_link_flow(one_worker, build_run_plan(get_algorithm("grpo"), one_worker))
    assert grpo.down[0] < on_node_0.down[0] and grpo.up[1] < on_node_0.up[1]
    # PPO whitens its advantages over the batch: reward rank 0 fetches every response.
    ppo_plan = build_run_plan(get_algorithm("ppo"), config)
    (advantage,) = [s for s in stage_workers(config, ppo_plan) if s.name == "advantage"]
    assert advantage.nodes == (0,) and not advantage.by_warehouse
    (advantage,) = [
        s for s in stage_workers(config, build_run_plan(get_algorithm("grpo"), config))
        if s.name == "advantage"
    ]  # fmt: skip
    assert advantage.nodes == (0, 1, 2, 3) and advantage.by_warehouse


def grpo_dry_run(recipe: str) -> dict:
    grpo = get_algorithm("grpo")
    config = load_config(CONFIGS / f"{recipe}.yaml", algorithm=grpo)
    return build_plan(config, build_run_plan(grpo, config), "cpu", 80 * GIB, 1024 * GIB)


def test_the_671b_checkpoint_is_9_4_tb_of_which_each_rank_writes_25_gb_in_parallel():
    report = grpo_dry_run("deepseek671b")
    ckpt = report["checkpoint"]
    (actor,) = ckpt["roles"]
    # bf16 weights, fp32 moments and fp32 main weights of 671B parameters
    assert actor["weights"] / 1e12 == pytest.approx(1.342, rel=1e-3)
    assert actor["moments"] == 4 * actor["weights"]
    assert actor["main_weights"] == 2 * actor["weights"]
    # A rank writes its stage's share: the busiest of 6 stages over its 64 ranks.
    assert actor["per_rank"] / 1e9 == pytest.approx(25.4, abs=0.1)
    assert actor["per_rank"] < actor["total"] / 300
    assert ckpt["per_node"] == 8 * actor["per_rank"]
    assert ckpt["write_seconds"] == pytest.approx(ckpt["per_node"] / 2e9)
    # The export holds one tensor: the embedding, 129280 x 7168 in bf16.
    assert ckpt["hf_largest_tensor"] == 129280 * 7168 * 2
    text = printed(report)
    assert "checkpoint: each rank writes its part, all at once" in text
    assert "9,394.37 GB" in text and "25.37 GB" in text and "101.5 s" in text


def test_smollm2s_two_dp_ranks_each_write_half_of_its_checkpoint_and_the_reference_none():
    ckpt = grpo_dry_run("smollm2_135m")["checkpoint"]
    (actor,) = ckpt["roles"]  # the reference is not trained: it is never saved
    assert actor["role"] == "actor" and actor["main_weights"] == 0  # fp32, AdamW
    assert actor["per_rank"] == actor["total"] // 2


def test_without_local_claims_each_rank_reads_three_quarters_of_its_share_remotely():
    from mindrl.planner.sample_flow import part_composition

    shares, nodes = [32.0] * 4, (0, 1, 2, 3)
    local = part_composition([0, 1, 2, 3], shares, nodes)
    blind = part_composition([0, 1, 2, 3], shares, nodes, local_claims=False)
    assert local[1] == [0.0, 32.0, 0.0, 0.0]  # rank 1 takes warehouse 1's share
    assert blind[1] == [8.0, 8.0, 8.0, 8.0]  # a quarter of every share, 24 of 32 remote


def test_a_rollout_device_without_room_for_the_next_weights_is_a_fit_problem():
    # Qwen2.5-7B's 15 GB of bf16 weights on an 80 GB vLLM rollout device: at 0.9 of it the
    # engine's weights and KV cache leave 8 GB, too little to receive the next weights into.
    grpo = get_algorithm("grpo")
    layout = ["resources.nodes=1", "rollout.placement=disaggregated", "rollout.devices=4",
              "rollout.tp=1", "rollout.engine=vllm"]  # fmt: skip

    def problems(fraction: float) -> list[str]:
        overrides = [*layout, f"rollout.memory_fraction={fraction}"]
        config = load_config(CONFIGS / "qwen25_7b.yaml", overrides, grpo)
        report = build_plan(config, build_run_plan(grpo, config), "cuda", 80 * GIB, 1024 * GIB)
        return [p for p in report["fit_problems"] if "rollout device" in p]

    (problem,) = problems(0.9)
    assert "the next weights as they arrive" in problem and "of its 85.9 GB" in problem
    assert problems(0.7) == []


def qwen_actor(*overrides: str):
    grpo = get_algorithm("grpo")
    return load_config(CONFIGS / "qwen25_7b.yaml", list(overrides), algorithm=grpo)


def test_a_token_budget_sizes_one_packed_micro_batch_by_its_tokens():
    from mindrl.planner.activations import activation_bytes, micro_batch_shape

    # 2048-token prompts and responses, 16 per prompt: one sequence is 4096 tokens.
    one_sequence = qwen_actor("actor.max_tokens_per_micro_batch=4096")
    assert micro_batch_shape(one_sequence, one_sequence.actor) == micro_batch_shape(
        qwen_actor(), qwen_actor().actor
    )  # the recipe's micro_batch_size=1 is that same row
    budget = qwen_actor("actor.max_tokens_per_micro_batch=8192")
    shape = micro_batch_shape(budget, budget.actor)
    # A prompt once and three responses fill 8192 tokens; their logits are computed.
    assert (shape.rows, shape.seq, shape.logit_positions) == (1, 8192, 3 * 2048)
    assert activation_bytes(budget) > 1.9 * activation_bytes(one_sequence)
    longer = qwen_actor("actor.max_tokens_per_micro_batch=1000")  # a sequence runs alone
    assert micro_batch_shape(longer, longer.actor).tokens == 4096


def test_the_dry_run_names_the_micro_batch_s_tokens_and_its_budget():
    grpo = get_algorithm("grpo")
    config = load_config(CONFIGS / "tiny.yaml", ["actor.max_tokens_per_micro_batch=256"], grpo)
    report = build_plan(config, build_run_plan(grpo, config), "cpu", 16 * GIB, 64 * GIB)
    assert report["memory"]["training"]["micro_batch_tokens"] == 256
    assert "train: activations (one micro-batch of 256 tokens, budget 256)" in printed(report)


def test_context_parallelism_divides_a_ranks_activations_and_the_plan_shows_cp_and_dp():
    from mindrl.planner.activations import activation_bytes
    from tests.foundation.plans import TINY, dry_run

    long = [
        "model.max_position_embeddings=4096",
        "rollout.max_prompt_length=512",
        "rollout.max_response_length=2048",
        "actor.share_prompts=false",  # a shared prompt's mask is the whole row's on every rank
    ]
    one = load_config(CONFIGS / "tiny.yaml", [*long, "actor.parallel.tp=1"])
    two = load_config(CONFIGS / "tiny.yaml", [*long, "actor.parallel.tp=1", "actor.parallel.cp=2"])
    assert activation_bytes(two) < 0.6 * activation_bytes(one)
    plan = dry_run("grpo", TINY, "actor.parallel.tp=1", "actor.parallel.cp=2")
    layout = plan["training_layouts"]["actor"]
    assert (layout["tp"], layout["cp"], layout["dp"]) == (1, 2, 1)
