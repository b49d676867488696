"""Reads a Compose file the way `docker compose config` does, without Docker: YAML (anchors
and merge keys), then the Compose specification's variable interpolation, then a strict
validator of the specification (the `compose-spec` package of the dev extra: unknown keys,
bad ports, images, conditions and types are errors) plus the references between services.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from compose_spec import PyCompose

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ComposeError(ValueError):
    """The file is not a valid Compose file."""


def _braced(text: str, start: int) -> int:
    """Index just past the `}` closing the `${` at `start` (nesting allowed)."""
    depth, i = 0, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ComposeError(f"unclosed '${{' in {text!r}")


def _expression(body: str, env: Mapping[str, str]) -> str:
    """`NAME`, `NAME:-default`, `NAME-default`, `NAME:?err`, `NAME?err`, `NAME:+alt`,
    `NAME+alt` (the specification's forms); defaults are interpolated in turn."""
    match = _NAME.match(body)
    if match is None:
        raise ComposeError(f"invalid interpolation '${{{body}}}'")
    name, rest = match.group(), body[match.end():]
    value = env.get(name)
    if not rest:
        return value or ""
    is_colon = rest.startswith(":")
    operator, word = (rest[1], rest[2:]) if is_colon else (rest[0], rest[1:])
    is_set = value is not None and (value != "" or not is_colon)
    if operator == "-":
        return str(value) if is_set else interpolate(word, env)
    if operator == "+":
        return interpolate(word, env) if is_set else ""
    if operator == "?":
        if not is_set:
            raise ComposeError(f"required variable {name} is missing: {word}")
        return str(value)
    raise ComposeError(f"invalid interpolation '${{{body}}}'")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = _braced(text, i)
            out.append(_expression(text[i + 2:end - 1], env))
            i = end
        elif text[i] == "$" and (match := _NAME.match(text, i + 1)):
            out.append(env.get(match.group(), ""))
            i = match.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolated(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    return node


def load_compose(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The file's model after interpolation; raises ComposeError unless it is valid."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict):
        raise ComposeError("a Compose file is a mapping with a 'services' mapping")
    model = _interpolated(raw, env)
    try:
        PyCompose.from_json(json.dumps(model))
    except ValueError as exc:
        raise ComposeError(str(exc)) from exc
    services = model["services"]
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for other in depends if isinstance(depends, (dict, list)) else ():
            if other not in services:
                raise ComposeError(f"service {name} depends on undefined service {other}")
    return model
