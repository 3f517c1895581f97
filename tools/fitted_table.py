"""A table that fits the terminal it is drawn on without cutting a figure (``troupe ctl top``).

rich fits a table too wide for the terminal by shortening its columns, the last resort all of
them alike: at 80 columns a mailbox of ``0/1000`` read ``0/1…`` (950/1000 would read ``950…``),
and at 40 whole columns were drawn empty. Here a figure (a number, a state) is never shortened
or wrapped. The table gives way step by step, in the order its columns say, until it fits: a
column that matters little is left out (the title says which), a text column (names) wraps down
to a floor; a terminal too narrow even then gets one line that says how wide it must be. It is
fitted each time it is drawn, at the width it is given: a live view follows the terminal's
resizes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "FittedTable"]

TEXT_FLOOR = 8  # a text column wraps down to this many cells (or its header's, if wider)

Cell = str | Text  # a str is markup, as a rich Table takes it


@dataclass(frozen=True)
class Column:
    """A column of a :class:`FittedTable`.

    Attributes:
        header: its heading (never cut).
        text: free text (a name), which may wrap; else a figure, shown whole or not at all.
        gives_way: the step, on a narrow terminal, at which the column is left out (lowest
            first); None: never.
        wraps: the step at which a text column may wrap (0: first of all).
        justify: as rich's.
    """

    header: str
    text: bool = False
    gives_way: int | None = None
    wraps: int = 0
    justify: JustifyMethod = "left"


class FittedTable:
    """A table of ``columns``, fitted to the width it is drawn at."""

    def __init__(self, title: str | Text, columns: Iterable[Column]) -> None:
        self.title = title
        self.columns = list(columns)
        self._rows: list[tuple[Cell, ...]] = []

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self._rows.append(cells)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        fit = self._fit(console, options.max_width)
        if fit is None:
            needed = _table_width(self._floors(console, range(len(self.columns))).values())
            title = self.title.plain if isinstance(self.title, Text) else self.title
            yield Text(
                f"{title}: the terminal is too narrow ({needed} columns needed, {options.max_width} here)",
                style="yellow",
            )
            return
        yield self._table(fit)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        kept = [i for i, c in enumerate(self.columns) if c.gives_way is None]
        narrowest = _table_width(self._floors(console, kept).values())
        widest = _table_width(self._naturals(console).values())
        return Measurement(narrowest, widest).clamp(max_width=options.max_width)

    def _naturals(self, console: Console) -> dict[int, int]:
        """Each column's width with nothing wrapped: its header or its widest cell."""
        return {
            i: max([_cell_len(console, column.header), *(_cell_len(console, row[i]) for row in self._rows)])
            for i, column in enumerate(self.columns)
        }

    def _floors(self, console: Console, kept: Iterable[int]) -> dict[int, int]:
        """The narrowest each of the ``kept`` columns may be: a figure's natural width; a text's
        ``TEXT_FLOOR``, or less if it is narrower, or its header's if that is wider."""
        natural = self._naturals(console)
        floors = {}
        for i in kept:
            column = self.columns[i]
            floor = min(natural[i], max(TEXT_FLOOR, _cell_len(console, column.header)))
            floors[i] = floor if column.text else natural[i]
        return floors

    def _fit(self, console: Console, width: int) -> dict[int, int] | None:
        """The columns kept and their widths at ``width``; None if it cannot fit."""
        natural = self._naturals(console)
        steps = sorted(
            {c.gives_way for c in self.columns if c.gives_way is not None}
            | {c.wraps for c in self.columns if c.text}
        )
        kept = list(range(len(self.columns)))
        for step in [None, *steps]:  # None: as it is, nothing given
            if step is not None:
                kept = [i for i in kept if self.columns[i].gives_way != step]
            may_wrap = {
                i for i in kept if self.columns[i].text and step is not None and self.columns[i].wraps <= step
            }
            widths = {i: natural[i] for i in kept}
            floors = {i: f if i in may_wrap else natural[i] for i, f in self._floors(console, kept).items()}
            excess = _table_width(widths.values()) - width
            while excess > 0:  # the widest text column above its floor wraps first
                wrapping = [i for i in kept if widths[i] > floors[i]]
                if not wrapping:
                    break
                widest = max(wrapping, key=lambda i: widths[i])
                widths[widest] -= 1
                excess -= 1
            if excess <= 0:
                return widths
        return None

    def _table(self, widths: dict[int, int]) -> Table:
        left_out = [c.header for i, c in enumerate(self.columns) if i not in widths]
        title: str | Text = self.title
        if left_out:
            note = f" (narrow terminal: no {', '.join(left_out)})"
            title = Text.assemble(self.title, note) if isinstance(self.title, Text) else self.title + note
        table = Table(title=title)
        for i, width in widths.items():
            column = self.columns[i]
            table.add_column(
                column.header,
                justify=column.justify,
                width=width,
                no_wrap=not column.text,
                overflow="fold" if column.text else "ellipsis",
            )
        for row in self._rows:
            table.add_row(*(row[i] for i in widths))
        return table


def _cell_len(console: Console, cell: Cell) -> int:
    text = cell if isinstance(cell, Text) else console.render_str(cell)
    return max((line.cell_len for line in text.split()), default=0)


def _table_width(widths: Iterable[int]) -> int:
    """A rich table's width for columns of these widths: a space of padding each side of every
    column, and a border between them and at each edge."""
    widths = list(widths)
    return sum(widths) + 3 * len(widths) + 1
