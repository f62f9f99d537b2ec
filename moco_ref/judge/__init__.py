"""The judging side: runs in the grader's process and decides every verdict by recomputation.

A record is validated against the probe the grader ran (``record`` for what every record
must be; ``lab_record``, ``components_record``, ``builder_record`` per style), turned into
evidence per style (``lab_evidence``, ``components_evidence``, ``builder_evidence``,
``ranks_evidence``), and judged by the checks (``checks/``, one module per invariant family,
declared in ``registry``) with the reference's laws (``invariants``) and one module of
assertions that give every message the same shape (``assertions``). ``styles`` is the one
dispatcher by style; ``judge`` runs the checks; ``rubric`` turns verdicts into points.

May import: the standard library, torch, numpy, hypothesis, the reference (``moco_ref.core``)
and the contract (``moco_ref.probe``). Never the observing side or the sandbox (an
import-linter contract); the only import circle is the check registry's.
"""
