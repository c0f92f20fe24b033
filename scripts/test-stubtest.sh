#!/usr/bin/env bash
# The .pyi stubs and annotations agree with the runtime: mypy's stubtest over
# the whole package, with the justified exceptions of
# scripts/stubtest-allowlist.txt (an unused entry fails too).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m mypy.stubtest nearcache \
    --allowlist scripts/stubtest-allowlist.txt \
    --mypy-config-file pyproject.toml
