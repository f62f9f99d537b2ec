"""The evidence of a recording of trusted code (``moco_ref.trace``), read as a builder run.

A recording is turned into the ``builder`` record's shape, one *track* per dictionary (one,
or one per view when the code keeps a queue per view), so the builder checks judge it with
the same laws and messages. What differs is what the grader did not choose: the sizes, T
and m are the user's. T and m the user did not declare are inferred for the other checks,
and the checks that hold them to a declared value say they were not judged; what a recording
of one process cannot show (the two-process run, the constructor's ``mlp`` option, the
official interface's buffers) is not applicable, with the reason.
"""

from __future__ import annotations

from functools import cached_property

import torch

from moco_ref.judge.assertions import NotExercised
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.invariants.buffer import arrival_labels, initial_labels
from moco_ref.judge.invariants.logits import BUILDER_FORM, fit_temperature
from moco_ref.probe.options import GradeOptions

NOT_RECORDED = {
    "contract-builder-interface": "a recording names its parts (MoCoParts): there is no "
                                  "constructor or buffer interface to hold it to",
    "contract-builder-mlp": "a recording runs the code as built: the constructor's mlp option "
                            "is not exercised",
    "I3-keys-of-all-ranks": "recorded in one process: no other rank's keys to gather",
    "I8-positive-across-ranks": "recorded in one process: no other rank's keys to gather",
}


class TraceEvidence(BuilderEvidence):
    """A builder run recorded in the user's own process (see the module's docstring)."""

    style = "builder"

    def __init__(self, record: dict, options: GradeOptions, *, temperature: float | None,
                 momentum: float | None, from_start: bool = True) -> None:
        super().__init__(record, options)
        self.declared_temperature = temperature
        self.declared_momentum = momentum
        self.not_applicable = dict(NOT_RECORDED)
        if not from_start:
            self.not_applicable["I6-key-starts-as-copy"] = (
                "the recording starts mid-training (MoCoParts(from_start=False))")

    def ragged(self):
        return None  # one run: the user's own K and batch

    def ragged_refusal(self):
        return None

    @cached_property
    def temperature(self) -> float:
        """The declared T, else the T that best explains the recorded logits (so the other
        checks can read them); I8-temperature-divides-logits is then not judged."""
        if self.declared_temperature is not None:
            return float(self.declared_temperature)
        fitted = None
        try:
            fitted = fit_temperature(BUILDER_FORM, self._unfitted_logit_steps())
        except Exception:  # noqa: BLE001 - nothing to fit: the checks that need logits say so
            fitted = None
        return float(f"{fitted:.6g}") if fitted else 1.0

    def _unfitted_logit_steps(self):
        return BuilderEvidence.logit_steps.func(self)

    @property
    def momentum(self) -> float:
        if self.declared_momentum is None:
            raise NotExercised("not judged: the recording declares no momentum (pass "
                               "MoCoParts(momentum=m) to hold the EMA to it); the fitted m is "
                               "in the report")
        return float(self.declared_momentum)

    def drop_policy_departure(self) -> str | None:
        """Where the buffer departs from a ring that *drops* the keys that do not fit before
        the wrap (writes ``min(B, K − ptr)`` keys at ``ptr``, then ``ptr`` moves by that
        many, mod K): None when every step's columns are exactly that ring's."""
        K, B = self.probe.K, self.probe.batch
        first = self.steps[0]
        ptr = (first.ptr_before or 0) % K
        labels = initial_labels(K, ptr)
        for step, trace in zip(self.steps, self.columns):
            written = min(B, K - ptr)
            labels = labels.clone()
            labels[ptr:ptr + written] = arrival_labels(K, B, step.index)[:written]
            ptr = (ptr + written) % K
            if not torch.equal(trace.labels, labels):
                return f"after step {step.index}"
        return None

    def inferred(self) -> dict:
        found = super().inferred()
        found["temperature_declared"] = self.declared_temperature
        found["m_declared"] = self.declared_momentum
        return found
