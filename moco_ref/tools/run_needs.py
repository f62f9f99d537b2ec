"""What one grading run needs, measured: the memory and the seconds a platform's container
must give it (``RUN_NEEDS``), stated by ``gradescope build`` and ``prairielearn build``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunNeeds:
    """What grading one submission needs, measured once (a constant, not a live figure)."""

    peak_mb: int  # peak memory: PSS summed over grader, warm process and job
    max_rss_mb: int  # the largest single process's peak RSS (``/usr/bin/time -v``)
    seconds: int  # wall clock of one whole run of a correct submission, start-up included
    how: str

    @property
    def container_mb(self) -> int:
        """The memory to give the platform's container: the peak and a quarter, rounded up."""
        return _rounded_up(self.peak_mb * 1.25, 256)

    def text(self) -> str:
        """What one run needs, in one line for the staff who size the platform's container."""
        return (f"about {self.peak_mb} MB of memory at its peak and about {self.seconds} s "
                f"per submission ({self.how}); give the container at least "
                f"{self.container_mb} MB")

    def as_dict(self) -> dict:
        return {"peak_memory_mb": self.peak_mb, "max_rss_mb": self.max_rss_mb,
                "seconds": self.seconds, "measured": self.how}


def _rounded_up(value: float, step: int) -> int:
    return int(-(-value // step) * step)


# Measured on 2 cores with CPU torch (as setup.sh installs it) by `tox -e memory`: PSS summed
# over the whole process tree of `moco-ref gradescope run`, sampled every 50 ms
# (benchmarks/test_memory_peak.py), 455-540 MB over a LAB and a builder submission on bwrap and
# on the confined rung; the largest process's peak RSS by `/usr/bin/time -v moco-ref grade
# examples/submissions/correct_lab_order.py` (297 MB, 4.7 s). The package registry's default
# torch wheel (CUDA libraries) needs about 850 MB: the autograder never installs it. Measure
# again when grading's memory changes.
RUN_NEEDS = RunNeeds(
    peak_mb=550, max_rss_mb=297, seconds=6,
    how="measured on 2 cores with CPU torch, as the autograder installs it: moco-ref "
        "gradescope run on a LAB and a builder submission, PSS summed over the grader, its "
        "warm process and the job")
