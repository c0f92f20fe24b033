#!/usr/bin/env bash
# Install everything the test suite and the benchmarks need on a fresh
# Debian machine: redis-server and memcached (Debian packages; tests start
# their own instances on free loopback ports), and nearcache itself with its
# test and benchmark extras (this builds the Rust extension with maturin).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)
# scripts/test-venv.sh and the Django suite make virtualenvs (Debian splits venv out).
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)  # HTTP load generator of the e2e bench
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)  # Redis Cluster tests
# Perl binding (perl/Cache-Near): headers, CHI, the modules it is compared with, CHI's test modules.
perl -MConfig -MCHI -MCache::FastMmap -MCache::Memcached::Fast -MCHI::Driver::Memcached::Fast -MTest::Class -MTest::Deep -MTest::Exception -MTest::Warn -MSereal -e 'exit(-f "$Config::Config{archlibexp}/CORE/perl.h" ? 0 : 1)' >/dev/null 2>&1 || need_apt+=(perl make libperl-dev libchi-perl libcache-fastmmap-perl libcache-memcached-fast-perl libchi-driver-memcached-perl libtest-class-perl libtest-deep-perl libtest-exception-perl libtest-warn-perl libsereal-perl)
# Cache::Near's author tests, the compressors and serializers Cache::FastMmap's suite exercises, and
# BerkeleyDB for seed 001's complex-data rows (perl/bench).
perl -MTest::Pod -MTest::Pod::Coverage -MCompress::LZ4 -MCompress::Snappy -MJSON -MBerkeleyDB -e 1 >/dev/null 2>&1 || need_apt+=(libtest-pod-perl libtest-pod-coverage-perl libcompress-lz4-perl libcompress-snappy-perl libjson-perl libberkeleydb-perl)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # policy-rc.d keeps the packages' own services from starting: the tests
    # start their own servers on free loopback ports and stop them.
    if [ -d /usr/sbin ] && [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# A nearcache installed from a wheel (not editable) is what gets tested: only
# the test extras are added (`make build` or `pip install -e .` tests this
# checkout instead). Otherwise: an editable install of this checkout.
installed=$(python3 - <<'PY'
import json
from importlib import metadata
try:
    dist = metadata.distribution("nearcache")
except metadata.PackageNotFoundError:
    print("none")
else:
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    print("editable" if url.get("dir_info", {}).get("editable") else dist.version)
PY
)
case "$installed" in
    none | editable) python3 -m pip install -q -e ".[test]" ;;
    *)
        echo "nearcache $installed is installed from a wheel: testing that install (not this checkout's build); run 'make build' to test the checkout"
        python3 -m pip install -q "nearcache[test]==$installed"
        ;;
esac
