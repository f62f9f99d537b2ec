"""A batch's progress on stderr, one submission at a time: a rich progress bar on a terminal,
one plain line per submission otherwise (which reads well in CI logs). Names are shown as
``text.shown_name`` shows them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from moco_ref.report.scoring import points_str
from moco_ref.report.text import shown_name

if TYPE_CHECKING:
    from moco_ref.run.batch import Outcome


class Progress:
    """``start(total)`` once, ``advance(outcome)`` as each submission finishes, ``stop()``."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.total = 0
        self.done = 0
        self._rich = None
        self._task = None

    def start(self, total: int) -> None:
        self.total = total
        if self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import Progress as RichProgress
            except ImportError:
                return
            self._rich = RichProgress(
                TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.description}"),
                console=Console(file=self.stream), transient=False,
            )
            self._rich.start()
            self._task = self._rich.add_task("", total=total)

    def advance(self, outcome: Outcome) -> None:
        self.done += 1
        report = outcome.report
        verdict = "not gradable" if not report.gradable else \
            f"{points_str(report.score)}/{points_str(report.max_score)}"
        suffix = " (cached)" if outcome.cached else ""
        name = shown_name(outcome.target.name)
        if self._rich is not None:
            from rich.markup import escape  # the description is read as rich markup

            self._rich.update(self._task, advance=1,
                              description=f"{escape(name)}: {verdict}{suffix}")
        else:
            print(f"[{self.done}/{self.total}] {name}: {verdict}{suffix}",
                  file=self.stream, flush=True)

    def stop(self) -> None:
        if self._rich is not None:
            self._rich.stop()
