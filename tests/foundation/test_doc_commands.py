"""Every shell command the docs show: the cheap ones run here and exit as their doc says,
the others are sorted into kinds too dear for a test, so a new command in a doc cannot
escape unnoticed. Every config a doc names exists and loads.

The commands are those of README.md and docs/guide/*.md: ```bash blocks, and README's
4-space indented blocks whose first command names a program. A line's trailing
``# exits N`` is the exit status its doc promises (0 otherwise). Cheap commands plan or
explain and train nothing: ``mindrl-train --dry-run`` / ``--help`` / ``--help-config``,
``mindrl-export`` (of a checkpoint built here) and a benchmark's ``--help``. They run in
this process through their ``main``: a subprocess would import torch, Ray and Megatron
again for each one (5-10 s apiece on two cores).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import runpy
import shlex
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
INDEX = ROOT / "docs" / "index.md"
DOCS = (README, *sorted(GUIDE.glob("*.md")))

#: The kind of a command this test runs.
RUN = "run here"
#: Kinds that are too dear for a test, and why.
EXPENSIVE = {
    "training run": "starts Ray and the workers and trains: a minute or more",
    "install": "downloads and installs packages",
    "cluster": "starts the nodes of a Ray cluster",
    "benchmark run": "a measurement: minutes, some need root or the heavy-run lock",
    "tests and lint": "the test suite (this test is part of it) and the linters",
    "device checks": "needs a GPU or NPU",
    "reads a finished run": "needs the run folder a training run leaves",
    "viewer": "a server that runs until it is stopped",
    "recording": "rolls a simulator's scripted expert out: a minute or more",
}
UNKNOWN = "unknown"

FENCE = re.compile(r"^\s*```(\S*)\s*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
EXIT_NOTE = re.compile(r"#\s*exits?\s+(\d+)")
#: The first word of an indented README block that holds commands, not code or output.
PROGRAM = re.compile(
    r"^([A-Z_][A-Z0-9_]*=\S+\s+)?(\.venv[\w-]*/bin/\S+|mindrl-|python|bash |ray |flock )"
)
HELP = {"--help", "-h", "--help-config"}
INSTALL_SCRIPTS = {"scripts/setup.sh", "scripts/install_trl.sh", "scripts/install_vllm_cpu.sh"}
CONFIG_NAME = re.compile(r"configs/[a-z0-9_]+\.yaml")  # configs/X.yaml: a placeholder


@dataclass(frozen=True)
class Command:
    """One logical shell line of a doc (continuations joined, its comment kept)."""

    doc: str
    line: int
    text: str

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def segments(self) -> list[list[str]]:
        """The commands of a ``a && b`` line."""
        parts: list[list[str]] = [[]]
        for word in self.words:
            if word == "&&":
                parts.append([])
            else:
                parts[-1].append(word)
        return [p for p in parts if p]

    @property
    def kind(self) -> str:
        kinds = [kind_of(segment) for segment in self.segments]
        return next((k for k in kinds if k != RUN), RUN)

    @property
    def expected_exit(self) -> int:
        note = EXIT_NOTE.search(self.text)
        return int(note.group(1)) if note else 0

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def program_and_args(words: list[str]) -> tuple[str, list[str]]:
    """The program a command runs (``flock LOCK`` and ``VAR=value`` prefixes dropped)."""
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if words[:1] == ["flock"]:
        words = words[2:]
    return Path(words[0]).name, words[1:]


def kind_of(words: list[str]) -> str:
    program, args = program_and_args(words)
    helped = bool(HELP & set(args))
    if program == "mindrl-train":
        return RUN if helped or "--dry-run" in args else "training run"
    if program in ("mindrl-export", "mindrl-sandbox"):
        return RUN
    if program == "mindrl-plot":
        return RUN if helped else "reads a finished run"
    if program.startswith("python"):
        if args[:2] == ["-m", "pytest"]:
            return "tests and lint"
        if args[:2] == ["-m", "pip"]:
            return "install"
        target = args[1] if args[:1] == ["-m"] else args[0]
        if target.startswith("benchmarks"):
            return RUN if helped else "benchmark run"
        if target == "scripts/metaworld_expert_data.py":
            return RUN if helped else "recording"
    if program == "bash" and args:
        if args[0] in INSTALL_SCRIPTS:
            return "install"
        if args[0] == "scripts/accelerator_checks.sh":
            return "device checks"
    return {"ray": "cluster", "ruff": "tests and lint", "tensorboard": "viewer"}.get(
        program, UNKNOWN
    )


def fenced_blocks(lines: list[str]) -> Iterator[tuple[str, int, list[str]]]:
    """``(language, line number of its first line, lines)`` of each fenced block."""
    language, start, body = None, 0, []
    for number, line in enumerate(lines, start=1):
        fence = FENCE.match(line)
        if fence and language is None:
            language, start, body = fence.group(1), number + 1, []
        elif fence:
            yield language, start, body
            language = None
        elif language is not None:
            body.append(line)


def indented_blocks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """Markdown's indented code blocks (4+ spaces after a blank line), outside fences."""
    in_fence, start, body = False, 0, []
    for number, line in enumerate([*lines, ""], start=1):
        if FENCE.match(line):
            in_fence = not in_fence
        indented = not in_fence and line.startswith("    ") and line.strip()
        if indented and (body or not lines[number - 2].strip()):
            start, body = (start or number), [*body, line]
        elif body and not line.strip() and number < len(lines) and lines[number].startswith("    "):
            body.append(line)
        elif body:
            indent = min(len(b) - len(b.lstrip()) for b in body if b.strip())
            yield start, [b[indent:] for b in body]
            start, body = 0, []


def shell_lines(start: int, body: list[str]) -> Iterator[tuple[int, str]]:
    """The logical lines of a shell block (``\\`` continuations joined; comments, blanks
    skipped)."""
    pending, first = "", start
    for number, line in enumerate(body, start=start):
        if not pending:
            first = number
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        if text and not text.startswith("#"):
            yield first, text


def doc_commands(doc: Path) -> list[Command]:
    lines = doc.read_text().splitlines()
    name = str(doc.relative_to(ROOT))
    blocks = [(start, body) for language, start, body in fenced_blocks(lines) if language == "bash"]
    if doc == README:
        blocks += [
            (start, body)
            for start, body in indented_blocks(lines)
            if PROGRAM.match(next((b for b in body if not b.startswith("#")), ""))
        ]
    return [
        Command(name, number, text)
        for start, body in blocks
        for number, text in shell_lines(start, body)
    ]


COMMANDS = [command for doc in DOCS for command in doc_commands(doc)]
#: Each cheap command once (README and the guide repeat some), at its first place.
CHEAP = list({c.text: c for c in reversed(COMMANDS) if c.kind == RUN}.values())[::-1]


# -- running a command in this process ------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str


def run_in_process(words: list[str]) -> Outcome:
    """Run a cheap command through its ``main`` (or its script as ``__main__``)."""
    program, args = program_and_args(words)
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_path = sys.argv, list(sys.path)  # scripts put the root on sys.path
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = _call(program, args)
    except SystemExit as done:  # argparse's --help, a script's sys.exit
        code = done.code if isinstance(done.code, int) else 0
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return Outcome(code or 0, out.getvalue(), err.getvalue())


def _call(program: str, args: list[str]) -> int | None:
    if program == "mindrl-train":
        from trainers.driver.cli import main

        return main(args)
    if program == "mindrl-export":
        from trainers.export import main

        return main(args)
    if program == "mindrl-plot":
        from mindrl.metrics.plot import main

        return main(args)
    if program == "mindrl-sandbox":
        from mindrl.rewards.sandbox import main

        return main(args)
    if args[:1] == ["-m"]:  # python -m benchmarks.x ...
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = [str(ROOT / args[0]), *args[1:]]  # python benchmarks/x.py ...
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


@pytest.fixture(scope="module")
def export_folder(tmp_path_factory) -> Path:
    """A folder holding, at the checkpoints path each documented ``mindrl-export`` names,
    the checkpoint of a small model trained two steps and saved (one rank)."""
    from tests.megatron import checkpoint_cases
    from tests.support.spawn import run_ranks

    folder = tmp_path_factory.mktemp("docs")
    exports = [c for c in CHEAP if program_and_args(c.words)[0] == "mindrl-export"]
    for command in exports:
        checkpoints = folder / program_and_args(command.words)[1][0]
        if not (checkpoints / "actor").exists():
            run_ranks(checkpoint_cases.trained_and_saved, 1, str(checkpoints / "actor"))
    return folder


def check_output(command: Command, outcome: Outcome, cwd: Path) -> None:
    """What a cheap command's output must show, by what it is."""
    program, args = program_and_args(command.words)
    if outcome.code == 2:
        assert "mindrl-train: config error:" in outcome.stderr
    elif "--help-config" in args:
        assert "[int, default actor.parallel.tp]" in outcome.stdout
    elif HELP & set(args):
        assert outcome.stdout.startswith("usage:")
    elif program == "mindrl-sandbox":
        verdict = json.loads(outcome.stdout)
        assert (verdict["status"], verdict["passed"]) == ("ok", True)
    elif program == "mindrl-export":
        written = cwd / args[1]
        assert outcome.stdout.strip() == args[1]
        assert (written / "config.json").is_file()
        assert (written / "model.safetensors.index.json").is_file()
    elif "--json" in args:
        assert json.loads(outcome.stdout)["mode"] in ("collocated", "disaggregated", "offline")
    else:  # a plan, as text
        assert outcome.stdout.startswith("mindrl plan:")
        last = outcome.stdout.strip().splitlines()[-1]
        assert last.startswith("fits:") if outcome.code == 0 else "does not fit" in outcome.stdout


@pytest.mark.parametrize("command", CHEAP, ids=[f"{c.doc}:{c.line}" for c in CHEAP])
def test_each_cheap_command_exits_as_its_doc_says(command, request, monkeypatch):
    cwd = ROOT
    if program_and_args(command.words)[0] == "mindrl-export":
        cwd = request.getfixturevalue("export_folder")
    monkeypatch.chdir(cwd)
    outcome = run_in_process(command.words)
    assert outcome.code == command.expected_exit, (
        f"{command}\nexit {outcome.code}\n{outcome.stderr[-2000:]}"
    )
    check_output(command, outcome, cwd)


# -- the commands not run, by kind ---------------------------------------------------


def test_every_documented_command_is_run_here_or_of_a_known_expensive_kind():
    unknown = [str(c) for c in COMMANDS if c.kind == UNKNOWN]
    assert not unknown, "commands of no known kind (add one to kind_of):\n" + "\n".join(unknown)
    kinds = Counter(c.kind for c in COMMANDS)
    assert set(kinds) <= {RUN, *EXPENSIVE}
    for kind, reason in EXPENSIVE.items():
        listed = [str(c) for c in COMMANDS if c.kind == kind]
        print(f"not run, {kind} ({reason}): {len(listed)}", *listed, sep="\n  ")


def test_the_guide_shows_commands_of_every_kind_a_user_meets():
    guide = [c for c in COMMANDS if c.doc.startswith("docs/guide/")]
    kinds = Counter(c.kind for c in guide)
    assert kinds[RUN] >= 10 and kinds["training run"] >= 10
    assert {"install", "cluster", "benchmark run", "device checks"} <= set(kinds)
    assert {c.doc for c in guide} == {f"docs/guide/{p.name}" for p in GUIDE.glob("*.md")}


def test_the_docs_keep_their_dry_runs_few():
    dry_runs = [c for c in CHEAP if "--dry-run" in c.words]
    assert 4 <= len(dry_runs) <= 10, [str(c) for c in dry_runs]
    assert any(c.expected_exit == 3 for c in dry_runs)  # a plan that does not fit
    assert any(c.expected_exit == 2 for c in dry_runs)  # a recipe's ??? left unset


def test_every_benchmark_script_answers_help_in_the_benchmarks_page():
    page = (GUIDE / "benchmarks.md").read_text()
    scripts = [
        p.relative_to(ROOT)
        for p in sorted((ROOT / "benchmarks").rglob("*.py"))
        if 'if __name__ == "__main__"' in p.read_text() and "harness" not in p.parts
    ]
    module = {s: ".".join(s.with_suffix("").parts) for s in scripts}
    missing = [
        str(s)
        for s in scripts
        if f"python {s} --help" not in page and f"-m {module[s]} --help" not in page
    ]
    # flow.py is started by linearity.py inside each node's namespace, never by hand.
    assert missing == ["benchmarks/cluster/flow.py"]


# -- configs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def your_model(tmp_path_factory) -> Path:
    """An HF folder (config.json only) standing in for the model a user's command names."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("your-model")
    LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=2048,
    ).save_pretrained(folder)
    return folder


def with_your_model(overrides: list[str], folder: Path) -> list[str]:
    """``model.hf_path=`` a folder not in this checkout (yours) -> the stand-in folder."""
    return [
        f"model.hf_path={folder}"
        if item.startswith("model.hf_path=") and not Path(item.split("=", 1)[1]).exists()
        else item
        for item in overrides
    ]


def documented_trainers() -> dict[str, set[str]]:
    """Each config a doc names, with the trainers its commands run it with (grpo where no
    command does)."""
    from trainers.driver.cli import DEFAULT_CONFIG, parse_args

    names: dict[str, set[str]] = {}
    for doc in (*DOCS, INDEX):
        for name in CONFIG_NAME.findall(doc.read_text()):
            names.setdefault(name, set())
    for command in COMMANDS:
        program, args = program_and_args(command.words)
        if program == "mindrl-train" and not HELP & set(args):
            parsed = parse_args(args)
            name = str((ROOT / (parsed.config or DEFAULT_CONFIG)).relative_to(ROOT))
            names.setdefault(name, set()).add(parsed.trainer)
    return {name: trainers or {"grpo"} for name, trainers in names.items()}


def test_every_config_a_doc_names_exists_and_loads_for_its_trainers(your_model):
    from mindrl.config import ConfigError, load_config
    from trainers.registry import get_algorithm

    named = documented_trainers()
    assert {"configs/tiny.yaml", "configs/hf_model.yaml", "configs/tiny_dpo.yaml"} <= set(named)
    for name, trainers in sorted(named.items()):
        assert (ROOT / name).is_file(), f"{name} is named in the docs but does not exist"
        for trainer in sorted(trainers):
            yours = ["model.hf_path=/models/yours", "data.source=questions.jsonl"]
            overrides = with_your_model(yours, your_model) if name.endswith("hf_model.yaml") else []
            try:
                load_config(ROOT / name, overrides, algorithm=get_algorithm(trainer))
            except ConfigError as error:
                pytest.fail(f"{name} --trainer {trainer}: {error.problems}")


def test_every_documented_training_command_loads_with_its_overrides(your_model):
    from mindrl.config import ConfigError, load_config
    from trainers.driver.cli import parse_args
    from trainers.registry import get_algorithm

    trainings = [
        c
        for c in COMMANDS
        for segment in c.segments
        if program_and_args(segment)[0] == "mindrl-train" and kind_of(segment) == "training run"
    ]
    assert len(trainings) >= 15
    for command in trainings:
        segment = next(s for s in command.segments if program_and_args(s)[0] == "mindrl-train")
        args = parse_args(program_and_args(segment)[1])
        overrides = with_your_model([*args.sets, *args.overrides], your_model)
        try:
            load_config(ROOT / args.config, overrides, algorithm=get_algorithm(args.trainer))
        except ConfigError as error:
            pytest.fail(f"{command}: {error.problems}")


def test_a_recipes_keys_left_to_you_are_named_and_with_them_it_loads(your_model):
    from mindrl.config import ConfigError, load_config
    from trainers.registry import get_algorithm

    recipe, grpo = ROOT / "configs" / "hf_model.yaml", get_algorithm("grpo")
    with pytest.raises(ConfigError) as refused:
        load_config(recipe, [], algorithm=grpo)
    named = [p.split(": ")[1] for p in refused.value.problems]
    assert named == ["model.hf_path", "data.source"]
    config = load_config(
        recipe, [f"model.hf_path={your_model}", "data.source=questions.jsonl"], algorithm=grpo
    )
    assert config.model.tokenizer == str(your_model)  # auto: the model's own folder
    assert config.model.max_position_embeddings == 2048  # the architecture is the folder's
    assert config.reference.parallel.tp == config.actor.parallel.tp == 1


# -- the pages themselves -----------------------------------------------------------------

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_every_fenced_block_of_the_guide_names_its_language_and_parses():
    for page in sorted(GUIDE.glob("*.md")):
        for language, start, body in fenced_blocks(page.read_text().splitlines()):
            where = f"{page.relative_to(ROOT)}:{start}"
            assert language in {"bash", "yaml", "text", "python", "json"}, where
            if language == "yaml":
                assert isinstance(yaml.safe_load("\n".join(body)), dict), where
            if language == "python":
                compile("\n".join(body), where, "exec")


def test_every_link_of_the_guide_and_the_index_reaches_a_file():
    for page in (INDEX, *sorted(GUIDE.glob("*.md"))):
        for target, _ in LINK.findall(page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"


def test_the_index_links_every_guide_page_and_every_design_note():
    linked = {(INDEX.parent / target).resolve() for target, _ in LINK.findall(INDEX.read_text())}
    pages = {*GUIDE.glob("*.md"), *(INDEX.parent.glob("*.md"))} - {INDEX}
    assert {p.resolve() for p in pages} <= linked
