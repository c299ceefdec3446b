"""Tables that fit their output without cutting a number: ``runs`` and ``compare``.

A column is either *whole* (an id, a count, a metric value: never narrower than its longest
cell, so nothing in it is ever cut) or *text* (wrapped, down to where each of its cells takes
at most two lines). A row that is too wide first loses the columns with a ``drop`` rank, the
least important first, while that keeps it on one line; then its text columns wrap; when the
whole columns alone are wider than the output, the lines are longer than it rather than cut.
On a terminal the table fits the terminal; into a pipe or a file it fits ``COLUMNS`` when that
is set, and is as wide as its widest row otherwise (one line a row, for grep and awk). No cell
is ever shortened with an ellipsis.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table

from evalq.shared.cli import out

__all__ = ["Col", "fit", "print_table"]


@dataclass(frozen=True)
class Col:
    """One column: its header, whether it is ``whole`` or ``text``, how it is justified, and
    when it is left out of a narrow table (``drop`` 1 first; None: never)."""

    header: str
    kind: Literal["whole", "text"] = "whole"
    """``whole``: no narrower than its longest cell (its header may wrap); ``text``: wraps."""
    justify: Literal["left", "right"] = "left"
    drop: int | None = None


def _lines(text: str, width: int) -> int:
    """How many lines ``text`` takes wrapped at spaces to ``width`` (a longer word folded)."""
    lines, used = 0, 0
    for word in text.split():
        size = cell_len(word)
        if lines and used + 1 + size <= width:  # after a space on the line begun
            used += 1 + size
        elif size <= width:
            lines, used = lines + 1, size
        else:
            full, rest = divmod(size, width)
            lines, used = lines + full + (1 if rest else 0), rest or width
    return max(lines, 1)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _two_lines(text: str) -> int:
    """The narrowest width at which ``text`` takes at most two lines."""
    low, high = max(1, -(-cell_len(text) // 2)), max(1, cell_len(text))
    while low < high:
        middle = (low + high) // 2
        if _lines(text, middle) <= 2:
            high = middle
        else:
            low = middle + 1
    return low


def fit(columns: Sequence[Col], rows: Sequence[Sequence[str]], available: int | None) -> list[int]:
    """Each column's width (0: left out) so that a row fits ``available`` characters (None:
    no limit) with its columns one space apart, as the module says."""
    cells = [[row[i] for row in rows] for i in range(len(columns))]
    natural = [
        max([cell_len(c.header), *(cell_len(v) for v in cells[i])]) for i, c in enumerate(columns)
    ]
    floors = [
        max(
            _longest_word(c.header),
            *(cell_len(v) if c.kind == "whole" else _two_lines(v) for v in cells[i]),
            1,
        )
        for i, c in enumerate(columns)
    ]
    if available is None:
        return natural
    kept = list(range(len(columns)))
    dropping = sorted(
        (i for i, c in enumerate(columns) if c.drop is not None),
        key=lambda i: columns[i].drop or 0,
    )

    def excess_of(widths: list[int]) -> int:
        return sum(widths) + len(kept) - 1 - available

    # one line a row while leaving out the least important columns can make it so
    while dropping and excess_of([natural[i] for i in kept]) > 0:
        kept.remove(dropping.pop(0))
    widths = [natural[i] if i in kept else 0 for i in range(len(columns))]
    excess = excess_of(widths)
    # then the columns give up width from the right, a whole one only as far as its header
    # wraps, a text one down to two lines a cell
    for i in reversed(kept):
        give = min(max(excess, 0), widths[i] - floors[i])
        widths[i] -= give
        excess -= give
    return widths


def width_of_output() -> int | None:
    """How wide a table may be: the terminal's width; into a pipe or a file ``COLUMNS`` when it
    is set, else no limit."""
    if out.is_terminal:
        return out.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def print_table(
    columns: Sequence[Col],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    available: int | None = None,
) -> None:
    """Print ``rows`` under ``columns`` at the widths :func:`fit` gives for ``available``
    (default: :func:`width_of_output`)."""
    widths = fit(columns, rows, width_of_output() if available is None else available)
    shown = [i for i, w in enumerate(widths) if w]
    table = Table(
        *(
            Column(columns[i].header, width=widths[i], justify=columns[i].justify, overflow="fold")
            for i in shown
        ),
        title=title,
        box=None,
        pad_edge=False,
        collapse_padding=True,
    )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    total = max(sum(widths) + len(shown) - 1, cell_len(title or ""))
    if total <= out.width:
        out.print(table)
        return
    # wider than the console (a pipe, or whole columns wider than the terminal): printed at its
    # own width, its lines longer than the output rather than cut
    wide = Console(
        file=out.file,
        width=total,
        markup=False,
        force_terminal=out.is_terminal,
        no_color=out.no_color,
    )
    wide.print(table)
