"""README's "Using it" commands run as written: every `ddtree` and `scripts/soak.py`
command parses with the real argument parsers, every path it names exists once the
commands before it ran (or is made by `make serve`), the curl bodies are valid JSON, and
the tiny-pair lines really run."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def using_it_commands() -> list[list[str]]:
    """The first bash block under '## Using it', continuations joined, `&&` split."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it"):]
    block = section[section.index("```bash") + 7:]
    block = block[:block.index("```")].replace("\\\n", " ")
    commands, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:  # a quoted argument may span lines (curl's JSON body)
            words = shlex.split(pending, comments=True)
        except ValueError:
            continue
        pending = ""
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";") or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    command.append(word[:-1])
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def load_soak():  # noqa: ANN201 (the script as a module)
    spec = importlib.util.spec_from_file_location("soak", REPO / "scripts" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_command_parses_with_the_real_parsers() -> None:
    commands = using_it_commands()
    kinds = {argv[0] if argv[0] != "python" else argv[1] for argv in commands}
    assert {"ddtree", "scripts/soak.py", "curl", "."} <= kinds
    soak = load_soak()
    for argv in commands:
        if argv[0] == "ddtree":
            build_parser().parse_args(argv[1:])
        elif argv[:2] == ["python", "scripts/soak.py"]:
            soak.parse_args(argv[2:])
        elif argv[0] == "curl" and "-d" in argv:
            json.loads(argv[argv.index("-d") + 1])


def test_the_paths_it_names_are_in_the_repository() -> None:
    assert (REPO / ".venv").name == ".venv"  # made by make serve / make test
    for argv in using_it_commands():
        for arg in argv:
            if arg.startswith(("models/", "scripts/")):
                assert (REPO / arg).exists(), arg


@pytest.mark.slow
def test_the_tiny_pair_lines_run(tmp_path: Path) -> None:
    ran = 0
    for argv in using_it_commands():
        if argv[0] == "ddtree" and argv[1] in ("models", "generate") and any(
                a.startswith("/tmp/tiny") for a in argv):
            argv = [a.replace("/tmp/tiny", str(tmp_path / "tiny")) for a in argv]
            result = subprocess.run([sys.executable, "-m", "ddtree.cli", *argv[1:]],
                                    cwd=REPO, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, result.stderr[-2000:]
            ran += 1
    assert ran == 2
