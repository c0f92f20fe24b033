#!/usr/bin/env bash
# The whole test suite: formatting, lints, type checks, the engine's Rust
# tests (unit, property, multi-process, hit ratio, corrupt-file fuzzing),
# the Python tests (with real redis-server and memcached on loopback), and
# Django's own cache test suite against nearcache's backend.
# Assumes scripts/install-deps.sh ran (make test does both).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }
# Server-backed tests fail (instead of skipping) when a server binary is missing.
export NEARCACHE_REQUIRE_SERVERS=1

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test"
cargo test --workspace
step "fuzz smoke run: corrupt shards and headers (proptest)"
PROPTEST_CASES="${FUZZ_CASES:-2000}" cargo test -p nearcache-core --test security -- corrupt
step "ruff"
ruff check python tests benchmarks
ruff format --check python tests benchmarks
step "mypy --strict"
mypy
step "stubtest: stubs and annotations match the runtime"
scripts/test-stubtest.sh
step "pytest"
python3 -m pytest -q tests/python
step "Perl: Cache::Near and CHI's driver suite (perl/Cache-Near)" && scripts/test-perl.sh
if [ -x tests/django/run.sh ]; then
    step "Django's cache test suite"
    tests/django/run.sh
fi
step "Flask-Caching's test suite"; tests/flask/run.sh
