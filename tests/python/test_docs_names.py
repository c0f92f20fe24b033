"""The README and the docs never open one cache name with two sizes.

Run one example after another and the second would fail with
IncompatibleFileError, or silently open the file at the first one's size.
"""

from __future__ import annotations

import re
from pathlib import Path

from nearcache import DEFAULT_SIZE
from nearcache.units import parse_size

ROOT = Path(__file__).resolve().parents[2]
OPENS = re.compile(
    r"""\b(?:Cache|AsyncCache|ShmDriver)\(\s*"([^"]+)"(?P<args>[^)\n]*)""",
)
SIZE = re.compile(r"""\bsize\s*=\s*"([^"]+)"|\bsize\s*=\s*(\d+)""")


def test_each_cache_name_has_one_size() -> None:
    sizes: dict[str, dict[int, list[str]]] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for lineno, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in OPENS.finditer(line):
                size = SIZE.search(match.group("args"))
                n = parse_size(size.group(1) or int(size.group(2))) if size else DEFAULT_SIZE
                where = f"{doc.relative_to(ROOT)}:{lineno}"
                sizes.setdefault(match.group(1), {}).setdefault(n, []).append(where)
    assert "myapp" in sizes
    clashes = {name: found for name, found in sizes.items() if len(found) > 1}
    assert clashes == {}
