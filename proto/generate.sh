#!/usr/bin/env bash
# Regenerate the checked-in Python code for the ppfs.v1 contracts.
# CI (tests/test_proto_generated.py) fails when the checked-in files differ from this output.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-src}"
python -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out" \
    --grpc_python_out="$out" proto/ppfs/v1/*.proto
