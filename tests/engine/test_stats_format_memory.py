"""The state's memory as text: the status line's "mem" part, its tooltip by part, and the
--json figures, from a request's Stats."""

from __future__ import annotations

import dataclasses

from engine.events import Stats
from engine.stats_format import (
    byte_size,
    final_line,
    json_figures,
    memory_tooltip,
    stats_dict,
    terminal_line,
)

BASE = Stats("r", 52, 10, 12, 40, 0.25, 160.0, 40.0, 0, 0, 62, 8192)
MEASURED = dataclasses.replace(
    BASE,
    kv_bytes=3 << 20,
    snapshot_bytes=18 << 20,
    branch_cache_bytes=(1 << 20) + (1 << 19),
    drafter_bytes=812,
    memory_bytes=(22 << 20) + (1 << 19) + 812,
    memory_budget_bytes=4 << 30,
)


def test_byte_sizes_read_in_binary_units() -> None:
    sizes = [812, 1024, 46_399_488, 150 << 20, 1536 << 20, 4 << 30]
    assert [byte_size(n) for n in sizes] == [
        "812 B",
        "1 KiB",
        "44.2 MiB",
        "150 MiB",
        "1.5 GiB",
        "4 GiB",
    ]


def test_the_status_line_ends_with_the_memory_held_of_the_budget() -> None:
    assert final_line(stats_dict(MEASURED)).endswith(" · prefilled 40 · mem 22.5 MiB/4 GiB")
    assert "mem" not in final_line(stats_dict(BASE))  # figures from before the budget


def test_the_terminal_line_ends_with_it_too() -> None:
    assert terminal_line(MEASURED).endswith(" · 10 tokens · mem 22.5 MiB/4 GiB]")
    assert "mem" not in terminal_line(BASE)


def test_the_tooltip_gives_each_part_in_the_order_eviction_spares_them() -> None:
    assert memory_tooltip(stats_dict(MEASURED)).splitlines() == [
        "Memory held by the model's computed state:",
        "3 MiB  live state (KV rows, recurrent state): never evicted",
        "812 B  lookup drafter's index: evicted last",
        "18 MiB  rollback snapshots: evicted next, oldest position first",
        "1.5 MiB  cached sibling branches: evicted first",
        "22.5 MiB in all, of a 4 GiB budget",
    ]
    over = dataclasses.replace(MEASURED, memory_budget_bytes=1 << 20)
    assert memory_tooltip(stats_dict(over)).endswith(
        "of a 1 MiB budget (over it: the live state is never evicted)"
    )
    assert memory_tooltip(stats_dict(BASE)) == ""


def test_the_json_figures_carry_the_bytes_by_part() -> None:
    assert json_figures(MEASURED)["memory_bytes"] == {
        "kv": 3 << 20,
        "snapshots": 18 << 20,
        "branch_cache": (1 << 20) + (1 << 19),
        "drafter": 812,
        "total": (22 << 20) + (1 << 19) + 812,
        "budget": 4 << 30,
    }
    assert "memory_bytes" not in json_figures(BASE)
