#!/usr/bin/env bash
# Install without Rust: build the manylinux wheel (maturin, linked with zig
# against glibc 2.28, both from PyPI; CPython's stable ABI, so one wheel
# serves CPython 3.10+) and the sdist, install the wheel into a
# fresh virtualenv on a PATH without cargo or rustc, and from there run a
# smoke test and a quick benchmark workload. What a user of the wheel gets,
# checked on every CI run (a few minutes: one release build).
#
# Wheels and the sdist land in $NEARCACHE_WHEEL_DIR (default target/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out="${NEARCACHE_WHEEL_DIR:-$repo/target/wheels}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/nearcache"
tools="$cache/wheel-tools"
step() { printf '\n==> %s\n' "$*"; }

step "build tools (maturin, zig) from PyPI"
[ -x "$tools/bin/maturin" ] || python3 -m venv --clear "$tools"
"$tools/bin/python" -m pip install -q "maturin>=1.7,<2" "ziglang>=0.13"

step "manylinux_2_28 wheel and sdist"
rm -rf "$out"
# The tools' bin first: maturin finds zig as the ziglang package's `python -m ziglang`.
PATH="$tools/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target/wheel-build}" \
    maturin build --release --zig --compatibility manylinux_2_28 --features abi3 --out "$out"
PATH="$tools/bin:$PATH" maturin sdist --out "$out"
wheels=("$out"/nearcache-*-abi3-manylinux_2_28_x86_64*.whl)
sdists=("$out"/nearcache-*.tar.gz)
[ -f "${wheels[0]}" ] || { echo "no abi3 manylinux_2_28 wheel in $out"; ls -l "$out"; exit 1; }
[ -f "${sdists[0]}" ] || { echo "no sdist in $out"; exit 1; }
ls -l "$out"
# The sdist builds the same package: the engine, the glue and the Python sources.
members=$(tar tzf "${sdists[0]}")
for member in Cargo.toml crates/nearcache-core/src/lib.rs crates/nearcache-python/src/lib.rs \
    python/nearcache/__init__.py pyproject.toml; do
    grep -qx "[^/]*/$member" <<<"$members" || { echo "sdist lacks $member"; exit 1; }
done

step "install the wheel into a fresh virtualenv, no Rust on PATH"
venv=$(mktemp -d "${TMPDIR:-/tmp}/nearcache-wheel-XXXXXX")
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv/venv"
# PATH: the virtualenv, then the system's directories that hold no cargo/rustc.
clean_path="$venv/venv/bin"
for dir in /usr/local/bin /usr/bin /bin; do
    [ -x "$dir/cargo" ] || [ -x "$dir/rustc" ] || clean_path="$clean_path:$dir"
done
run() { env -u VIRTUAL_ENV -u CARGO_HOME -u RUSTUP_HOME PATH="$clean_path" HOME="$venv" "$@"; }
if run sh -c 'command -v cargo || command -v rustc' >/dev/null; then
    echo "cargo or rustc is still on the PATH: $clean_path"; exit 1
fi
run python3 -m pip install -q --only-binary nearcache "${wheels[0]}"

step "smoke test from the wheel"
# A file, not stdin: the spawned pool worker imports the main module again.
cat >"$venv/smoke.py" <<'PY'
import multiprocessing
import os
import pickle
import tempfile

import nearcache
from nearcache import Cache


def main() -> None:
    where = os.path.dirname(nearcache.__file__)
    assert "site-packages" in where, where
    print(f"nearcache {nearcache.__version__} from {where}")
    with tempfile.TemporaryDirectory() as d:
        c = Cache(path=os.path.join(d, "smoke"), size="4MiB")
        c.set("user:1", {"name": "Ada"})
        c.set("n", 41)
        assert c.incr("n") == 42
        assert c.get("user:1") == {"name": "Ada"}
        assert pickle.loads(pickle.dumps(c.get))("user:1") == {"name": "Ada"}
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(c.get, ("n",)) == 42

        @c.memoize(ttl=60)
        def square(x: int) -> int:
            return x * x

        assert square(7) == 49 and square(7) == 49
        c.close()
    print("smoke test: ok")


if __name__ == "__main__":
    main()
PY
(cd "$venv" && run timeout 300 python3 smoke.py)
(cd "$venv" && run nearcache --version)

step "quick benchmark workload from the wheel"
(cd "$venv" && COLUMNS=100 run timeout 600 nearcache bench chi-2010 --quick --no-save --no-progress \
    --backends nearcache,nearcache-native,dict)
echo "wheel: ${wheels[0]##*/} installed and ran without Rust"
