"""``python -m nearcache``: the ``nearcache`` command (see :mod:`nearcache.cli`)."""

from __future__ import annotations

from nearcache.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
