#!/usr/bin/env bash
# Regenerates protos/gen from protos/laya_proto/v1/*.proto (the public contract) and
# protos/laya_proto/internal/v1/*.proto (the services' internal calls), and copies the .proto sources
# beside the generated code (they ship in the wheel as package data, so a client in any language can
# generate its stubs from an installed laya-grpc). tests/test_protos_generated.py
# runs the same generation into a temp dir and fails on any difference from what is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-protos/gen}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
"$PY" -m grpc_tools.protoc -Iprotos --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/laya_proto/v1/*.proto protos/laya_proto/internal/v1/*.proto
cp protos/laya_proto/v1/*.proto "$out/laya_proto/v1/"
cp protos/laya_proto/internal/v1/*.proto "$out/laya_proto/internal/v1/"
touch "$out/laya_proto/__init__.py" "$out/laya_proto/v1/__init__.py" "$out/laya_proto/internal/__init__.py" \
  "$out/laya_proto/internal/v1/__init__.py"
