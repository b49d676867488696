"""`ddtree generate`: one generation in one process (the round without the wire)."""

from __future__ import annotations

import argparse
import json
import time

from ddtree.cli.options import (
    add_model_options,
    add_sampling_options,
    add_spec_options,
    load_from_args,
    sampling_from_args,
    spec_from_args,
)
from ddtree.engine import GenerationRequest, generate


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="generate text in one process")
    add_model_options(parser)
    add_spec_options(parser)
    add_sampling_options(parser)
    parser.add_argument("--max-tokens", type=int, default=128)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="raw prompt text")
    prompt.add_argument("--chat", help="a user message, wrapped in the chat template")
    parser.add_argument("--json", action="store_true", help="print token_ids, text and stats")
    parser.set_defaults(func=run)


def encode_prompt(tokenizer, prompt: str | None, chat: str | None) -> list[int]:  # noqa: ANN001
    if chat is not None:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": chat}], tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def run(args: argparse.Namespace) -> int:
    target, drafter, tokenizer = load_from_args(args, need_drafter=args.mode != "ar")
    request = GenerationRequest(
        prompt_ids=encode_prompt(tokenizer, args.prompt, args.chat),
        max_tokens=args.max_tokens, sampling=sampling_from_args(args), spec=spec_from_args(args),
    )
    token_ids: list[int] = []
    start = time.perf_counter()
    finish_reason = None
    stats = None
    printed = ""
    for result, stats in generate(target, drafter, request):  # noqa: B007 (last stats)
        token_ids.extend(result.new_tokens)
        finish_reason = result.finish_reason
        text = tokenizer.decode(token_ids, skip_special_tokens=True)
        # Hold back a partial UTF-8 character (decoded as U+FFFD) until the next round.
        if not args.json and not text.endswith("\ufffd"):
            print(text[len(printed):], end="", flush=True)
            printed = text
    elapsed = time.perf_counter() - start
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if args.json:
        assert stats is not None
        print(json.dumps({
            "token_ids": token_ids, "text": text, "finish_reason": finish_reason,
            "stats": stats.to_dict() | {"wall_seconds": round(elapsed, 4)},
        }))
    else:
        print(text[len(printed):])
    return 0
