"""The commands' summary tables: rich when importable, plain columns otherwise; the
terminal's width, or 80 columns (``COLUMNS``) when piped, like the grading report
(``report.formats.report_console``)."""

from __future__ import annotations

from moco_ref.report.formats import report_console

MOST_NAMED = 10  # submissions named in the closing line; the rest counted


def print_verdict_line(below: list[str], total: int, minimum) -> None:
    """The closing line of a grading: all reach ``minimum``, or how many do not and which
    (the first ``MOST_NAMED``); names that do not fit the report's width are folded into
    the lines above it, so the verdict is always the last line."""
    import textwrap

    if not below:
        print(f"all {total} submission(s) reach {minimum.describe()}")
        return
    shown = ", ".join(below[:MOST_NAMED]) + (f" and {len(below) - MOST_NAMED} more"
                                             if len(below) > MOST_NAMED else "")
    verdict = f"{len(below)} of {total} submission(s) below {minimum.describe()}"
    width = report_console().width
    if len(verdict) + 2 + len(shown) <= width:
        print(f"{verdict}: {shown}")
        return
    print(textwrap.fill(f"below {minimum.describe()}: {shown}", width=width,
                        subsequent_indent="  ", break_on_hyphens=False))
    print(f"{verdict} (named above)")  # the verdict stays the last line


def print_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]], *,
                no_wrap: tuple[str, ...] = (), styles: list[str | None] | None = None) -> None:
    """One table: ``rows`` under ``headers``; ``styles`` colours the last cell of each row.
    A table wider than the report's width shares it out: each wrapping column in proportion
    to its longest cell (the ``no_wrap`` columns keep their width), so no column shrinks to
    an ellipsis while another holds a long text whole."""
    try:
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
                  for i, h in enumerate(headers)]
        for row in (headers, *rows):
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        return
    console = report_console()

    def table(fitted: bool) -> Table:
        made = Table(title=title, expand=fitted)
        for index, header in enumerate(headers):
            if header in no_wrap or not fitted:
                made.add_column(header, no_wrap=header in no_wrap)
                continue
            longest = max([len(header), *(len(row[index]) for row in rows)])
            made.add_column(header, ratio=max(1, min(longest, 60)), overflow="fold",
                            min_width=min(longest, 8))
        for number, row in enumerate(rows):
            style = styles[number] if styles else None
            made.add_row(*[Text(cell, overflow="fold") for cell in row[:-1]],
                         Text(row[-1], style=style or ""))
        return made

    natural = table(fitted=False)
    fits = console.measure(natural).maximum <= console.width
    console.print(natural if fits else table(fitted=True))
