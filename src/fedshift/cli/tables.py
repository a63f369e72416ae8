"""The one plain-text table printer of the command line."""

from __future__ import annotations

from collections.abc import Sequence


def print_table(rows: Sequence[Sequence[object]], indent: str = "") -> None:
    """Print ``rows`` (the first is the header) in aligned columns two spaces apart; the last
    column is left ragged so a long description never widens the others."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print(indent + "  ".join([*padded, row[-1]]).rstrip())
