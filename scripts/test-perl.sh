#!/usr/bin/env bash
# Build and test the Perl distribution perl/Cache-Near the way a Perl user
# does (perl Makefile.PL && make && make test): Cache::Near's tests
# (types, expiry, fork, kill -9 mid-write, get_and_set races between
# processes, serializers, bad arguments, round trips with the Python
# package on one file), CHI's own driver suite against CHI::Driver::Near
# in both layouts (with AUTHOR_TESTING=1 so CHI's multi-process and timing
# tests run too), and Cache::FastMmap's own test suite, taken from Debian's
# source package of libcache-fastmmap-perl (t/90-fastmmap-suite.t; it
# reports a skip if the archive does not serve the source). Then the
# author tests (xt/: POD and its coverage) and podchecker.
# Assumes scripts/install-deps.sh ran (it installs Perl, CHI and the test
# modules, and nearcache's Python package for the cross-language tests).
set -euo pipefail
cd "$(dirname "$0")/../perl/Cache-Near"
# Missing CHI, test modules or Python package fail instead of skipping.
export NEARCACHE_REQUIRE_CHI=1 NEARCACHE_REQUIRE_PYTHON=1 NEARCACHE_FASTMMAP_SUITE=1
export NEARCACHE_PYTHON="${NEARCACHE_PYTHON:-$(command -v python3)}"
perl Makefile.PL
make
AUTHOR_TESTING=1 make test
prove -b xt/
podchecker lib/Cache/Near.pm lib/CHI/Driver/Near.pm

# `nearcache bench` runs the Perl seed-000 benchmark now that the modules are built.
cd ../..
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m nearcache bench perl-chi-2010 --profile tiny --backends nearcache --no-progress --no-save \
    --dir "$tmp/scratch" --json "$tmp/perl-bench.json" >/dev/null
python3 - "$tmp/perl-bench.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["workloads"][0]
assert w["name"] == "perl-chi-2010", w["name"]
assert len(w["cases"]) == 5, [c["case"] for c in w["cases"]]
for case in w["cases"]:
    assert not case["skipped"].get("nearcache"), case["skipped"]
    (m,) = case["measurements"]
    for module in ("C:Near", "CHI:Near", "C:FMmap", "CHI:Mem", "CHI:FMmap"):
        assert m["metrics"][f"{module} ops/s"] > 0, (case["case"], module)
print("nearcache bench perl-chi-2010: 5 cases measured")
PY
