"""`ddtree bench` in process with the engine's row length and context bucket set (the
pool's shape apart from everything else `ddtree serve` changes; lease call r162). Through
serve (lease 48) a round of ar c8 took 0.780 ms on the device as an MPS client with rows
of 8,192 tokens, 0.773 with a context bucket of 2,048 and 0.754 with rows of 1,024; in
process (rows of the run's longest request) 0.752.

    python3 scripts/gpu/bench_engine_config.py [--max-model-len N] [--context-bucket N] \
        -- bench args...
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ddtree.benchmark import inprocess
from ddtree.cli import main as cli_main
from ddtree.engine.config import EngineConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-model-len", type=int, default=0,
                        help="rows of this many tokens (0: the run's longest request)")
    parser.add_argument("--context-bucket", type=int, default=0)
    parser.add_argument("bench", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    sized = inprocess.engine_config

    def engine_config(bounds: inprocess.RunBounds) -> EngineConfig:
        config = sized(bounds)
        return dataclasses.replace(
            config, max_model_len=args.max_model_len or config.max_model_len,
            context_bucket=args.context_bucket)

    inprocess.engine_config = engine_config  # type: ignore[assignment]
    return cli_main(["bench", *bench])


if __name__ == "__main__":
    sys.exit(main())
