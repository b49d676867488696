"""The `ddtree` console script: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ddtree.cli import bench, generate, models, serve, train
from ddtree.errors import DDTreeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddtree", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (generate, bench, models, serve, train):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DDTreeError as exc:
        print(f"ddtree: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
