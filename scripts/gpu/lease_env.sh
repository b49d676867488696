#!/usr/bin/env bash
# Sourced by every lease step on the GPU host: carried wheels onto PYTHONPATH, repo importable.
if [ -d .whl ] && [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
