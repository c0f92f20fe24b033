#!/usr/bin/env bash
# Flask-Caching's own tests against nearcache's Flask-Caching backend (see run.py).
set -euo pipefail
exec python3 "$(dirname "$0")/run.py" "$@"
