#!/usr/bin/env bash
# Regenerates ddtree/v1/*_pb2.py, *_pb2_grpc.py and *.pyi from protos/ddtree/v1/*.proto.
# Use grpcio-tools 1.84.0: generated stubs refuse any grpcio runtime older than the tools
# (GPU hosts ship grpcio 1.84.0).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I protos \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  protos/ddtree/v1/*.proto
