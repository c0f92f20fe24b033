"""Tables, figure formats, the cmpthese matrix and the loss notes."""

from __future__ import annotations

import pytest
from rich.console import Console

from nearcache.bench.report import (
    Table,
    cmpthese,
    fmt_int,
    fmt_ns,
    fmt_rate,
    fmt_ratio,
    loss_notes,
    pick_reference,
    print_tables,
)


def test_cmpthese_orders_by_rate_and_computes_percentages() -> None:
    table = cmpthese([("fast", 300.0), ("slow", 100.0), ("mid", 200.0), ("none", 0.0)], "t")
    assert table.columns == ["", "Rate", "slow", "mid", "fast"]
    assert [row[0] for row in table.rows] == ["slow", "mid", "fast"]
    slow, mid, fast = table.rows
    assert slow[2] == "--" and mid[3] == "--" and fast[4] == "--"
    # Row A, column B: rate_A / rate_B - 1.
    assert fast[2] == "200%"  # 300/100 - 1
    assert slow[4] == "-67%"  # 100/300 - 1
    assert mid[2] == "100%" and mid[4] == "-33%"
    assert fast[1] == "300/s"


def test_table_markdown_and_rich() -> None:
    table = Table("title", ["name", "value"], [["a|b", "1"]], right={1}, notes=["a note"])
    md = table.to_markdown()
    assert "**title**" in md
    assert "| name | value |" in md
    assert "|:---|---:|" in md
    assert "a\\|b" in md
    assert "- a note" in md
    console = Console(record=True, width=120)
    print_tables(console, [table, Table("hidden", ["x"], [["y"]], terminal=False)])
    out = console.export_text()
    assert "title" in out and "a note" in out and "hidden" not in out


def test_table_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError):
        Table("t", ["a", "b"], [["only one"]])


def test_formats() -> None:
    assert fmt_int(1234567.4) == "1,234,567"
    assert fmt_rate(12345.6) == "12,346/s"
    assert fmt_rate(12.345) == "12.3/s"
    assert fmt_ratio(2.345) == "2.35x"
    assert fmt_ratio(23.45) == "23.4x"
    assert fmt_ratio(0) == "-"
    assert fmt_ns(812) == "812ns"
    assert fmt_ns(36_001) == "36us"
    assert fmt_ns(1_500) == "1.5us"
    assert fmt_ns(8_893_000) == "8.89ms"
    assert fmt_ns(2.5e9) == "2.5s"


def test_pick_reference_prefers_the_public_api() -> None:
    assert pick_reference(["dict", "nearcache-native", "nearcache"]) == "nearcache"
    assert pick_reference(["dict", "nearcache-native"]) == "nearcache-native"
    assert pick_reference(["dict"]) is None


def test_loss_notes_name_every_faster_backend_with_figures_and_reason() -> None:
    figures = {
        "get": [("nearcache", 100.0), ("dict", 300.0), ("diskcache", 10.0)],
        "set": [("nearcache", 100.0), ("dict", 104.0)],
    }
    notes = loss_notes(figures, "nearcache", {"dict": "keeps a reference"})
    assert len(notes) == 1
    note = notes[0]
    assert note.startswith("nearcache loses to dict on get 300/s vs 100/s (3.00x)")
    assert "set" not in note  # 4% is under the 5% threshold
    assert note.endswith("Why: dict keeps a reference.")
    # Lower is better (latencies): the faster backend has the smaller figure.
    lat = loss_notes(
        {"p50": [("nearcache", 500.0), ("dict", 100.0)]},
        "nearcache",
        {},
        higher_is_better=False,
        fmt=fmt_ns,
    )
    assert lat == ["nearcache loses to dict on p50 100ns vs 500ns (5.00x)."]
    assert loss_notes(figures, None, {}) == []
