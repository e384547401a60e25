"""``mindrl-export``: a checkpoint becomes an HF folder transformers loads, with the
engine's weights and the engine's log-probs."""

from __future__ import annotations

import json

import pytest
import torch

from tests.megatron import checkpoint_cases
from tests.support.spawn import run_ranks
from trainers.export import main as export_main


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("run") / "checkpoints" / "actor"
    (engine,) = run_ranks(checkpoint_cases.trained_and_saved, 1, str(root))
    out = root.parent.parent / "hf"
    assert export_main([str(root.parent), str(out)]) == 0  # a run's checkpoints folder
    return engine, out


def test_the_exported_tensors_equal_the_engines_hf_state_dict(exported):
    from safetensors.torch import load_file

    engine, out = exported
    tensors = load_file(out / "model.safetensors")
    assert sorted(tensors) == sorted(engine["hf"])
    assert all(torch.equal(tensors[name], value) for name, value in engine["hf"].items())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["num_hidden_layers"] == 2


def test_transformers_log_probs_of_the_export_equal_the_engines(exported):
    from transformers import AutoModelForCausalLM

    engine, out = exported
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = engine["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits.float()
    # log p(token t | tokens before t), for the response: the second half of each row
    start = ids.shape[1] // 2
    logprobs = torch.log_softmax(logits[:, start - 1 : -1], dim=-1)
    token_logprobs = logprobs.gather(-1, ids[:, start:, None]).squeeze(-1)
    mask = engine["mask"].bool()
    torch.testing.assert_close(token_logprobs[mask], engine["logprobs"][mask], rtol=1e-4, atol=1e-5)


def test_a_missing_checkpoint_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert export_main([str(tmp_path), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mindrl-export: error: no 'latest' file under") and err.count("\n") == 1
