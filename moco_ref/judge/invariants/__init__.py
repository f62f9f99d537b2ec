"""The invariant logic of the harness, as functions on plain tensors.

One module per group of invariants; each function takes tensors and numbers (never a
submission or an observation record), so the grader's checks and the reference's own tests
call the same code:

- ``fifo``: what a FIFO dictionary holds after a sequence of batches (I3), by the
  reference's ``KeyQueue``, and which misconception explains a queue that holds something
  else; which recorded vectors a queue's entries are (I2).
- ``ema``: the EMA recurrence θk ← m·θk + (1 − m)·θq fitted to parameter snapshots (I7): the
  momentum ``m``, the θq each update used, and from that the step order (I6).
- ``buffer``: I2 and I3 on a module's ``[dim, K]`` queue buffer and ``queue_ptr`` (the
  ``builder`` style): what each column is a copy of, step by step, and what the reference's
  FIFO holds.
- ``logits``: I8 and I9 on the logits a module returns (``builder``): the reference's form
  and the forms of known mistakes, by ``loss.form_logits``, and the form that explains them.
- ``loss``: the InfoNCE loss in the reference's form and in the forms of known mistakes
  (I4, I8, I9), its gradient w.r.t. the query's raw projection, and the form that explains
  an observed gradient.
"""

from moco_ref.judge.invariants.buffer import (
    ColumnTrace,
    arrival_labels,
    expected_fifo,
    initial_labels,
    oldest_first,
    trace_columns,
)
from moco_ref.judge.invariants.ema import (
    EmaAnalysis,
    KeyUpdate,
    analyse_key_updates,
    ema_prediction,
    fit_momentum,
    fits_ema,
)
from moco_ref.judge.invariants.fifo import (
    QUEUE_RULES,
    arrival_numbers,
    fifo_contents,
    identify_queue_rule,
    match_rows,
    queue_contents,
    rotation_of,
    through_one_buffer,
)
from moco_ref.judge.invariants.logits import (
    LogitsFit,
    StepLogits,
    describe_logits_form,
    expected_logits,
    identify_logits_form,
    logits_error,
)
from moco_ref.judge.invariants.loss import (
    REFERENCE_FORM,
    FormFit,
    LossForm,
    StepLossInputs,
    form_gradient,
    form_logits,
    gradient_error,
    identify_loss_form,
)

__all__ = [
    "ColumnTrace",
    "EmaAnalysis",
    "FormFit",
    "KeyUpdate",
    "LogitsFit",
    "LossForm",
    "QUEUE_RULES",
    "REFERENCE_FORM",
    "StepLogits",
    "StepLossInputs",
    "analyse_key_updates",
    "arrival_labels",
    "arrival_numbers",
    "describe_logits_form",
    "ema_prediction",
    "expected_fifo",
    "expected_logits",
    "fifo_contents",
    "fit_momentum",
    "fits_ema",
    "form_gradient",
    "form_logits",
    "gradient_error",
    "identify_logits_form",
    "identify_loss_form",
    "identify_queue_rule",
    "initial_labels",
    "logits_error",
    "match_rows",
    "oldest_first",
    "queue_contents",
    "through_one_buffer",
    "rotation_of",
    "trace_columns",
]
