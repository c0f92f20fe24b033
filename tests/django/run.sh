#!/usr/bin/env bash
# Django's own cache test suite against nearcache's Django backends, for the
# pinned Django versions (see run.py for what it does and its options).
set -euo pipefail
exec python3 "$(dirname "$0")/run.py" "$@"
