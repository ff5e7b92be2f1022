"""Terminal output for the course tools: tables (via ``rich`` when it is installed) and progress."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a table; ``rich`` draws it when importable, plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _plain_table(title, columns, rows)
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    width = None if sys.stdout.isatty() else 140
    Console(width=width, highlight=False).print(table)


def _plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


def progress(message: str) -> None:
    """One line of progress, flushed at once so it shows up live in CI logs."""
    print(message, flush=True)
