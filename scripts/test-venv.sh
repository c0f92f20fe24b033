#!/usr/bin/env bash
# The whole test suite again, inside a fresh virtualenv, as most users run it:
# `make test` there installs nearcache and its test extras into the
# virtualenv and runs scripts/check.sh with its interpreter.  This guards the
# places where the suite starts other interpreters (Django's suite makes one
# virtualenv per Django version; those must see this virtualenv's nearcache,
# not the base interpreter's packages).
# The virtualenv is $NEARCACHE_TEST_VENV (default
# ~/.cache/nearcache/test-venv), emptied and made anew on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${NEARCACHE_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nearcache/test-venv}"
python3 -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python3 -m pip install -q --upgrade pip
make test
