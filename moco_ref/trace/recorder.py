"""The recorder: hooks on the user's own modules and loop, in the user's own process.

``record_moco(parts)`` is a context manager. Inside it every forward of the named encoders, every
``F.cross_entropy`` call and every ``optimizer.step()`` is observed:

- a *step* opens at the first encoder forward after the previous ``optimizer.step()`` and closes
  at the next one; its "before" state (θq, θk, the dictionary) is read when it opens;
- at each encoder forward: its input rows (to tell which view and which image each row is), its
  output (moved to the CPU), whether autograd was on, and θq, θk at that moment;
- at ``optimizer.step()``: the dictionary and θ after the forward, which key parameters hold a
  ``.grad``; after it, θ again (an EMA run after the step shows at the next step's forwards).

Nothing of the user's code changes; leaving the block removes every hook. ``Recording.judge``
gives the grader's verdicts (``moco_ref.trace.judging``).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from moco_ref.trace.parts import MoCoParts


@dataclass
class Forward:
    """One forward of the query or the key encoder."""

    role: str  # "q" or "k"
    rows: list[bytes]  # a digest of each input row, to match rows across forwards
    grad_enabled: bool
    training: bool
    params_q: torch.Tensor
    params_k: torch.Tensor
    output: torch.Tensor | None = None  # [n, dim] on the CPU
    has_grad_fn: bool = False


@dataclass
class State:
    params_q: torch.Tensor
    params_k: torch.Tensor
    queue: torch.Tensor | None
    pointer: torch.Tensor | None


@dataclass
class Step:
    before: State
    forwards: list[Forward] = field(default_factory=list)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # CE inputs
    after_forward: State | None = None
    key_grads: list[bool] = field(default_factory=list)
    after_step: State | None = None
    cuda: bool = False
    views: list[list[bytes]] = field(default_factory=list)  # MoCoParts.views: rows per view
    settled: bool = False  # the dictionary after the step has been read


class _Snapshots:
    """Flat parameter vectors; an unchanged one is the same tensor as the last (memory). Read
    every time: a write through ``p.data`` (mmengine's EMA, lightly's) leaves ``_version``
    alone, so no cheaper sign of a change can be trusted."""

    def __init__(self, named: list[tuple[str, nn.Parameter]]) -> None:
        self.params = [p for _, p in named]
        self._last: torch.Tensor | None = None

    def take(self) -> torch.Tensor:
        with torch.no_grad():
            now = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64)
                             for p in self.params]) if self.params else torch.zeros(0)
        if self._last is not None and torch.equal(now, self._last):
            return self._last
        self._last = now
        return now


class Recording:
    """What one ``record_moco`` block saw; ``judge`` turns it into the grader's verdicts."""

    def __init__(self, parts: MoCoParts, name: str = "your MoCo", *,
                 steps: int | None = None) -> None:
        if steps is not None and steps < 1:
            raise ValueError(f"steps must be ≥ 1, not {steps}")
        self.parts = parts
        self.name = name
        self.max_steps = steps
        self.steps: list[Step] = []
        self.initial: State | None = None
        self.layout_q = [(n, p) for n, p in parts.parameters("q")]
        self.layout_k = [(n, p) for n, p in parts.parameters("k")]
        self._snap_q = _Snapshots(self.layout_q)
        self._snap_k = _Snapshots(self.layout_k)
        self._open: Step | None = None
        # inputs waiting for their output, first in first out: a (backbone, neck) pair may run
        # the backbone on both views before the neck runs on either (solo-learn)
        self._pending: dict[str, list[Forward]] = {"q": [], "k": []}
        self.ignored_forwards = 0  # forwards outside training mode (validation, monitors)

    # ------------------------------------------------------------------ state

    def _state(self, with_queue: bool = True) -> State:
        return State(self._snap_q.take(), self._snap_k.take(),
                     self.parts.read_queue() if with_queue else None,
                     self.parts.read_pointer() if with_queue else None)

    def _training(self) -> bool:
        return bool(self.parts.modules("q")[0].training)

    def _step(self) -> Step:
        if self._open is None:
            before = self._state()
            self._settle(before)
            self._open = Step(before=before)
        return self._open

    def _settle(self, now: State | None = None) -> None:
        """The last closed step's dictionary is read when the next step opens (or the block
        ends): a loop may enqueue after ``optimizer.step()``."""
        if self.steps and not self.steps[-1].settled:
            now = now or self._state()
            last = self.steps[-1]
            last.after_forward.queue, last.after_forward.pointer = now.queue, now.pointer
            last.settled = True

    # ------------------------------------------------------------------ hooks

    def _input(self, role: str, args: tuple, kwargs: dict) -> None:
        if not self._training():
            self.ignored_forwards += 1
            return
        step = self._step()
        x = _first_tensor(args) if args else _first_tensor(tuple(kwargs.values()))
        if x is not None and x.is_cuda:
            step.cuda = True
        self._pending[role].append(Forward(
            role, _row_digests(x), torch.is_grad_enabled(), self._training(),
            self._snap_q.take(), self._snap_k.take()))

    def _views(self, args: tuple, kwargs: dict) -> None:
        """The views as ``MoCoParts.views`` receives them: its tensors of one batch, in order
        (nested in lists and tuples too)."""
        if not self._training():
            return
        tensors = _all_tensors((*args, *kwargs.values()))
        images = [t for t in tensors if t.ndim >= 2 and t.is_floating_point()]
        if images:
            size = len(images[0])
            self._step().views = [_row_digests(t) for t in images if len(t) == size]

    def _output(self, role: str, output) -> None:
        if not self._pending[role]:
            return
        forward = self._pending[role].pop(0)
        y = _first_tensor(output if isinstance(output, (tuple, list)) else (output,))
        if y is None:
            return
        forward.output = y.detach().to("cpu", copy=True)
        forward.has_grad_fn = y.grad_fn is not None
        self._step().forwards.append(forward)

    def _cross_entropy(self, logits, labels) -> None:
        if self._open is None or not isinstance(logits, torch.Tensor) or not isinstance(
                labels, torch.Tensor) or logits.ndim != 2 or labels.ndim != 1 or \
                labels.is_floating_point():
            return
        self._open.pairs.append((logits.detach().to("cpu", torch.float64, copy=True),
                                 labels.detach().to("cpu", copy=True)))

    def _before_optimizer_step(self) -> None:
        if self._open is None:
            return
        self._open.after_forward = self._state()
        self._open.key_grads = [p.grad is not None for _, p in self.layout_k]

    def _after_optimizer_step(self) -> None:
        step = self._open
        if step is None:
            return
        if step.after_forward is None:  # attached inside this step's closure: read it now
            self._before_optimizer_step()
        step.after_step = self._state(with_queue=False)
        self.steps.append(step)
        self._open = None
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            raise RecordingComplete(f"{len(self.steps)} steps recorded")

    def start(self):
        """Hook the parts and the loop; returns what unhooks them (``record_moco`` does
        both)."""
        return _start(self)

    @property
    def cuda(self) -> bool:
        """Whether the user's encoders ran on CUDA (recorded, moved to the CPU)."""
        return any(step.cuda for step in self.steps)

    # ------------------------------------------------------------------ judging

    def judge(self, **policy):
        """The grader's verdicts on what was recorded (``judging.judge_recording``)."""
        from moco_ref.trace.judging import judge_recording

        return judge_recording(self, **policy)

    def assert_correct(self, **policy) -> None:
        """Raise ``AssertionError`` with the grader's explained messages unless every check
        that applies passed."""
        report = self.judge(**policy)
        if report.failed or report.not_judged:
            raise AssertionError(report.text())


@contextmanager
def record_moco(parts: MoCoParts, name: str = "your MoCo", *, steps: int | None = None):
    """Record the training steps run inside the block (see the module's docstring);
    ``steps``: stop the user's run (``RecordingComplete``, caught by the block) after that
    many."""
    recording = Recording(parts, name, steps=steps)
    stop = recording.start()
    try:
        yield recording
    except RecordingComplete:
        pass
    finally:
        stop()


class RecordingComplete(BaseException):
    """Raised from ``optimizer.step()`` once the asked number of steps is recorded: it ends the
    user's own loop wherever it is (a ``BaseException``, so no ``except Exception`` of the
    user's code or of Lightning swallows it)."""


def _start(recording: Recording):
    """Every hook of a recording; returns what removes them."""
    parts = recording.parts
    recording.initial = recording._state()
    handles = []
    for role in ("q", "k"):
        modules = parts.modules(role)
        handles.append(modules[0].register_forward_pre_hook(
            lambda _m, args, kwargs, role=role: recording._input(role, args, kwargs),
            with_kwargs=True))
        handles.append(modules[-1].register_forward_hook(
            lambda _m, _args, output, role=role: recording._output(role, output)))
    restore = _watch_views(parts.views, recording)
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    handles.append(register_optimizer_step_pre_hook(
        lambda _optimizer, args, kwargs: _after_closure(recording, args, kwargs)))
    handles.append(register_optimizer_step_post_hook(
        lambda *_: recording._after_optimizer_step()))
    functional = torch.nn.functional
    original = functional.cross_entropy

    def cross_entropy(input, target, *args, **kwargs):  # noqa: A002 - torch's own names
        recording._cross_entropy(input, target)
        return original(input, target, *args, **kwargs)

    functional.cross_entropy = cross_entropy

    def stop() -> None:
        functional.cross_entropy = original
        recording._settle()
        restore()
        for handle in handles:
            handle.remove()

    return stop


def _after_closure(recording: Recording, args: tuple, kwargs: dict):
    """``optimizer.step(closure)`` (Lightning's automatic optimization, LBFGS) runs the
    forward and backward inside the step: the state after the forward is read when the
    closure returns, before the update."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: self
    if closure is None:
        recording._before_optimizer_step()
        return None

    def closure_then_read():
        result = closure()
        recording._before_optimizer_step()
        return result

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure_then_read}
    return (args[0], closure_then_read, *args[2:]), kwargs


def _watch_views(views, recording: Recording):
    """Hook where the views arrive; returns what undoes it."""
    if views is None:
        return lambda: None
    if isinstance(views, nn.Module):
        handle = views.register_forward_pre_hook(
            lambda _m, args, kwargs: recording._views(args, kwargs), with_kwargs=True)
        return handle.remove
    owner, name = views
    method = getattr(owner, name)
    had_own = name in getattr(owner, "__dict__", {})

    def watched(*args, **kwargs):
        recording._views(args, kwargs)
        return method(*args, **kwargs)

    setattr(owner, name, watched)

    def restore() -> None:
        if had_own:
            setattr(owner, name, method)
        else:
            delattr(owner, name)

    return restore


def _all_tensors(values) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += _all_tensors(value)
        elif isinstance(value, dict):
            found += _all_tensors(tuple(value.values()))
    return found


def _first_tensor(values) -> torch.Tensor | None:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (tuple, list)):
            found = _first_tensor(value)
            if found is not None:
                return found
        if isinstance(value, dict):
            found = _first_tensor(tuple(value.values()))
            if found is not None:
                return found
    return None


def _row_digests(x: torch.Tensor | None) -> list[bytes]:
    if x is None or x.ndim == 0:
        return []
    flat = x.detach().to("cpu").contiguous().reshape(len(x), -1)
    return [hashlib.blake2b(row.numpy().tobytes(), digest_size=12).digest() for row in flat]
