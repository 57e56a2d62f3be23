"""Text tables of named columns under group headings (a sampling setting, a prompt set), each column as
wide as its widest cell."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby


@dataclass(frozen=True)
class Column:
    """One column: the group heading above it (`""`: none), its own heading, one cell per row."""

    group: str
    name: str
    cells: list[str]
    left: bool = False

    @property
    def width(self) -> int:
        """The widest of its heading and cells."""
        return max(len(self.name), *map(len, self.cells)) if self.cells else len(self.name)

    def show(self, text: str, width: int | None = None) -> str:
        """`text` aligned in this column."""
        w = self.width if width is None else width
        return f"{text:<{w}}" if self.left else f"{text:>{w}}"


def _widths(columns: Sequence[Column]) -> list[int]:
    """Each column's width; a group's last column widened where the group's heading is wider than them."""
    widths = [c.width for c in columns]
    start = 0
    for group, cols in groupby(columns, key=lambda c: c.group):
        end = start + len(list(cols))
        span = sum(widths[start:end]) + 2 * (end - start - 1)
        widths[end - 1] += max(len(group) - span, 0)
        start = end
    return widths


def render(columns: Sequence[Column]) -> list[str]:
    """The group heading line (when any column has a group), the heading line and one line per row;
    a group's heading spans its columns, two spaces between columns."""
    widths = _widths(columns)
    rows = len(columns[0].cells) if columns else 0
    lines = []
    if any(c.group for c in columns):
        heads, start = [], 0
        for group, cols in groupby(columns, key=lambda c: c.group):
            end = start + len(list(cols))
            heads.append(f"{group:<{sum(widths[start:end]) + 2 * (end - start - 1)}}")
            start = end
        lines.append("  ".join(heads).rstrip())
    lines.append("  ".join(c.show(c.name, w) for c, w in zip(columns, widths, strict=True)).rstrip())
    lines += [
        "  ".join(c.show(c.cells[i], w) for c, w in zip(columns, widths, strict=True)).rstrip() for i in range(rows)
    ]
    return lines


def table_width(columns: Sequence[Column]) -> int:
    """The characters one rendered line takes at most."""
    return sum(_widths(columns)) + 2 * max(len(columns) - 1, 0)
