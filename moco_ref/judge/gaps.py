"""A part of the record the grader has no observation of, as a typed value.

The grade assembles the record from the parts the sandbox observed; a part that ran out of
time, whose process died, or whose observations were discarded as inconsistent is put in as
an ``Unobserved`` entry. Evidence reads every part through ``observed``, so a check that needs
such a part raises ``PartNotObserved`` and the judge reports it ``timeout`` (when time ran
out) or ``error``, with the reason, instead of judging it.
"""

from __future__ import annotations

from moco_ref.judge.assertions import SubmissionError
from moco_ref.probe.parts import Unobserved


class PartNotObserved(SubmissionError):
    def __init__(self, gap: Unobserved) -> None:
        super().__init__(f"not judged: {gap.part} was not observed: {gap.reason}")
        self.gap = gap


def observed(entry):
    """``entry`` itself, or ``PartNotObserved`` when it stands for a part never observed."""
    if isinstance(entry, Unobserved):
        raise PartNotObserved(entry)
    return entry
