"""The ``builder`` probe: runs INSIDE the submission's process and records what an
official-style ``MoCo(base_encoder, dim, K, m, T, mlp)`` module does when trained.

The grader supplies ``base_encoder(num_classes=dim)`` — ``ProbeEncoder``, a tiny conv → BN →
ReLU → pool → ``.fc`` net on ``[B, 3, 8, 8]`` images, with a forward hook that records every
forward of it or of any copy of it (which encoder ran, on which image rows, with autograd on
or off, its raw output, both encoders' parameters at that moment). It builds the module with
its own small ``dim``, ``K``, ``m``, ``T`` and runs the official training loop itself:

    logits, labels = model(im_q, im_k); loss = cross_entropy(logits, labels)
    optimizer.zero_grad(); loss.backward(); optimizer.step()   # SGD over model.parameters()

recording per step the queue buffer and ``queue_ptr`` before and after, the logits and labels,
both encoders' parameters before the forward, after it and after the optimizer step, and
which key parameters received ``.grad``. A second, shorter run builds it with ``mlp=True``.

It all runs inside a one-process ``torch.distributed`` group with ``.cuda()`` mapped to the CPU
(``builder_env``). Nothing here judges; everything recorded is plain data.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from moco_ref.observe.tracebacks import submission_error_text
from moco_ref.probe.builder import (
    ENCODER_NAMES,
    KEY_VIEW,
    NO_MLP_OPTION,
    QUERY_VIEW,
    BuilderProbe,
    ProbeEncoder,
    is_intact_probe_encoder,
    probe_images,
)
from moco_ref.probe.lab import flat_parameters, parameter_layout
from moco_ref.probe.schema import (
    BuilderForward,
    BuilderModule,
    BuilderRun,
    BuilderState,
    BuilderStep,
    EncoderParameters,
)

UNTRACED = -1


def _row_key(row: torch.Tensor) -> bytes:
    return row.detach().to(torch.float32).contiguous().reshape(-1).cpu().numpy().tobytes()


class BuilderRecorder:
    """The ``base_encoder`` factory and every forward of the encoders it made (or copies)."""

    def __init__(self, probe: BuilderProbe) -> None:
        self.probe = probe
        self.factory_calls: list[dict] = []
        self.model: nn.Module | None = None
        self.events: list[BuilderForward] = []
        self._rows: dict[bytes, tuple[int, int]] = {}
        self._images = torch.empty(0)
        recorder = self

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            # A plain function, so copy.deepcopy(encoder) keeps it (a bound method would
            # deep-copy the recorder).
            recorder.on_forward(module, args, output)

        def pre_hook(module: nn.Module, args: tuple) -> None:
            recorder.running.append(module)

        self._hook, self._pre_hook = hook, pre_hook
        self.running: list[nn.Module] = []  # the followed forwards begun and not yet ended
        self.encoder_names = ENCODER_NAMES[0]  # the model's, once ``follow`` has seen it

    def base_encoder(self, num_classes: int = 1000, **kwargs) -> ProbeEncoder:
        """What the submission calls: ``base_encoder(num_classes=dim)``."""
        self.factory_calls.append({"num_classes": int(num_classes), "kwargs": sorted(kwargs)})
        encoder = ProbeEncoder(int(num_classes))
        encoder.register_forward_pre_hook(self._pre_hook)
        encoder.register_forward_hook(self._hook)
        return encoder

    def follow(self, model: nn.Module) -> None:
        """The module built with ``base_encoder``: the forwards of its ``encoder_q`` and
        ``encoder_k`` are the q and k events. An encoder that wraps the probe encoder
        (``nn.Sequential(base_encoder(...))``, a backbone and a neck) is followed at its own
        output; the probe encoder's forward inside it stays an event of its own."""
        self.model = model
        self.encoder_names = encoder_names(model)
        for name in self.encoder_names:
            encoder = getattr(model, name, None)
            if isinstance(encoder, nn.Module) and not isinstance(encoder, ProbeEncoder):
                encoder.register_forward_pre_hook(self._pre_hook)
                encoder.register_forward_hook(self._hook)

    # ----------------------------------------------------------------- one step

    def begin_step(self, im_q: torch.Tensor, im_k: torch.Tensor) -> None:
        """Images of the step: rows of ``im_q`` are view 0, rows of ``im_k`` view 1."""
        self.events = []
        self.running = []
        self._rows = {}
        for view, images in ((QUERY_VIEW, im_q), (KEY_VIEW, im_k)):
            for row, image in enumerate(images):
                self._rows[_row_key(image)] = (view, row)
        self._images = torch.cat([im_q, im_k]).reshape(2 * len(im_q), -1)

    def end_step(self) -> list[BuilderForward]:
        events, self.events = self.events, []
        return events

    def _trace_rows(self, images) -> tuple[torch.Tensor, torch.Tensor]:
        """``(view [n], row [n])`` of every input row; −1 when it is no image of the step."""
        if not isinstance(images, torch.Tensor) or images.ndim == 0:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        views, rows = [], []
        for image in images:
            view, row = self._rows.get(_row_key(image), (UNTRACED, UNTRACED))
            if view == UNTRACED and len(self._images):
                flat = image.detach().to(torch.float32).reshape(1, -1).cpu()
                if flat.shape[1] == self._images.shape[1]:
                    distance, index = torch.cdist(flat, self._images).min(dim=1)
                    if float(distance) < 1e-5:
                        view, row = divmod(int(index), len(self._images) // 2)
            views.append(view)
            rows.append(row)
        return torch.tensor(views, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64)

    def crashed_in(self) -> str:
        """The encoder (``"q"``, ``"k"``) whose forward had begun and not ended — the one a
        step's exception came from — or ``""``."""
        roles = [self._role(module) for module in self.running]
        return next((role for role in roles if role in ("q", "k")), "")

    def _role(self, module: nn.Module) -> str:
        model = self.model
        query, key = self.encoder_names
        if model is not None and module is getattr(model, query, None):
            return "q"
        if model is not None and module is getattr(model, key, None):
            return "k"
        return "other"

    def on_forward(self, module: nn.Module, args: tuple, output) -> None:
        if self.running and self.running[-1] is module:
            self.running.pop()
        if not isinstance(output, torch.Tensor):
            return
        views, rows = self._trace_rows(args[0] if args else None)
        self.events.append({
            "role": self._role(module),
            "grad_enabled": torch.is_grad_enabled(),
            "has_grad_fn": output.grad_fn is not None,
            "training": bool(module.training),
            "probe_encoder": is_intact_probe_encoder(module),
            "output": output.detach().to(torch.float32).cpu().clone(),  # [n, dim]
            "views": views,
            "rows": rows,
            **parameters_of(self.model),
        })


# --------------------------------------------------------------------------- state


def encoder_names(model) -> tuple[str, str]:
    """The names of ``model``'s query and key encoders (``ENCODER_NAMES``; the official ones
    when it has no pair)."""
    for query, key in ENCODER_NAMES:
        if isinstance(getattr(model, query, None), nn.Module) and \
                isinstance(getattr(model, key, None), nn.Module):
            return query, key
    return ENCODER_NAMES[0]


def encoder_of(model, role: str):
    """``model``'s query (``"q"``) or key (``"k"``) encoder, or None."""
    return getattr(model, encoder_names(model)[role == "k"], None)


def _flat(module) -> torch.Tensor | None:
    return flat_parameters(module) if isinstance(module, nn.Module) else None


def parameters_of(model) -> EncoderParameters:
    """Both encoders' parameters ``[P]`` (None when the module has no such encoder)."""
    return {"params_q": _flat(encoder_of(model, "q")), "params_k": _flat(encoder_of(model, "k"))}


def buffer_copy(model, name: str):
    """A copy of the tensor ``model.<name>`` (a plain int, e.g. a pointer kept as a Python
    attribute, as a one-element tensor); None when there is neither."""
    value = getattr(model, name, None)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.tensor([value], dtype=torch.int64)
    return None


def state_of(model) -> BuilderState:
    """Parameters of both encoders, the queue buffer and the pointer, as they are now."""
    return {**parameters_of(model), "queue": buffer_copy(model, "queue"),
            "queue_ptr": buffer_copy(model, "queue_ptr")}


def describe_value(value) -> dict:
    info: dict = {"type": type(value).__name__}
    if isinstance(value, torch.Tensor):
        info.update(shape=list(value.shape), dtype=str(value.dtype).replace("torch.", ""))
    elif isinstance(value, (tuple, list)):
        info.update(length=len(value), items=[describe_value(v) for v in list(value)[:4]])
    return info


def _number(value) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def describe_module(model: nn.Module, recorder: BuilderRecorder) -> BuilderModule:
    """The module's structure: encoders, buffers, attributes, parameter layouts."""
    info: BuilderModule = {
        "class": type(model).__name__,
        "factory_calls": list(recorder.factory_calls),
        "buffers": [name for name, _ in model.named_buffers()],
        "queue": describe_value(getattr(model, "queue", None)),
        "queue_ptr": describe_value(getattr(model, "queue_ptr", None)),
        "attributes": {name: _number(getattr(model, name, None)) for name in ("T", "m", "K")},
    }
    info["encoder_names"] = list(encoder_names(model))
    for role in ("q", "k"):
        encoder = encoder_of(model, role)
        info[f"encoder_{role}"] = isinstance(encoder, nn.Module)
        if isinstance(encoder, nn.Module):
            info[f"encoder_{role}_probe"] = isinstance(encoder, ProbeEncoder)
            info[f"layout_{role}"] = parameter_layout(encoder)
            info[f"requires_grad_{role}"] = [bool(p.requires_grad) for p in encoder.parameters()]
            head = _head_layers(encoder)
            info[f"fc_{role}"] = [type(m).__name__ for m in head]
            info[f"fc_linear_{role}"] = [[int(m.in_features), int(m.out_features)]
                                         for m in head if isinstance(m, nn.Linear)]
    return info


def _head_layers(encoder: nn.Module) -> list[nn.Module]:
    """The layers of an encoder's head, in registration order: its ``.fc`` (the probe
    encoder's interface, as torchvision's ResNet has it); for an encoder that wraps the probe
    encoder (``nn.Sequential(backbone, neck)``), the probe encoder's ``.fc`` and every layer
    the wrapper registers after it."""
    fc = getattr(encoder, "fc", None)
    if isinstance(fc, nn.Module):
        return list(fc.modules())
    layers, inside = [], None
    for module in encoder.modules():
        if module is encoder:
            continue
        if isinstance(module, ProbeEncoder):
            inside = {id(m) for m in module.modules()}
            fc = getattr(module, "fc", None)
            layers += list(fc.modules()) if isinstance(fc, nn.Module) else []
            continue
        if inside is not None and id(module) not in inside:
            layers.append(module)
    return layers


# --------------------------------------------------------------------------- the run




def names_parameter(cls, name: str) -> bool:
    """Whether ``cls(...)``'s signature names the keyword ``name`` itself."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters and parameters[name].kind is not inspect.Parameter.POSITIONAL_ONLY


def accepts_keyword(cls, name: str) -> bool:
    """Whether ``cls(...)`` takes the keyword ``name`` (by name or through ``**kwargs``); True
    when its signature cannot be read, so the call itself says."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD
               for p in parameters)


# more keyword arguments of the constructor (GradeOptions.init_kwargs), set by the observer
# for the runs it makes (the two-process run's children inherit it)
CONSTRUCTOR_EXTRAS: dict = {}


def build_options(moco_class, probe: BuilderProbe, mlp: bool = False) -> dict:
    """The keyword arguments the module is built with: the probe's dim, K, m, T; ``mlp`` when
    the constructor takes it; ``symmetric=True`` under ``--variant symmetric`` when it takes
    that (modules with both losses often default to the asymmetric one)."""
    options = {"dim": probe.dim, "K": probe.K, "m": probe.m, "T": probe.T}
    if accepts_keyword(moco_class, "mlp"):
        options["mlp"] = mlp
    if probe.symmetric and names_parameter(moco_class, "symmetric"):
        options["symmetric"] = True
    options.update({name: value for name, value in CONSTRUCTOR_EXTRAS.items()
                    if name not in options})
    return options


def run_builder(moco_class, probe: BuilderProbe, *, mlp: bool = False) -> BuilderRun:
    """Build ``moco_class`` with the probe's values and train it ``probe.steps`` steps."""
    recorder = BuilderRecorder(probe)
    run: BuilderRun = {"mlp": mlp, "error": None, "stage": "construct", "steps": []}
    options = build_options(moco_class, probe, mlp)
    if mlp and "mlp" not in options:  # a MoCo v1 module: no head option to build with
        run["stage"] = NO_MLP_OPTION
        return run
    torch.manual_seed(probe.seed)
    try:
        model = moco_class(recorder.base_encoder, **options)
        recorder.follow(model)
        run["module"] = describe_module(model, recorder)
        run["initial"] = state_of(model)
        run["stage"] = "optimizer"
        optimizer = torch.optim.SGD(model.parameters(), lr=probe.lr)
    except BaseException as exc:  # noqa: BLE001 - the submission's failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        run["error"] = submission_error_text(exc)
        return run
    for t in range(probe.steps):
        run["stage"] = f"step {t}"
        try:
            run["steps"].append(train_step(model, optimizer, recorder, *probe_images(probe, t)))
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            run["error"] = submission_error_text(exc)
            run["crashed_in"] = recorder.crashed_in()
            return run
    run["stage"] = "done"
    return run


@contextmanager
def cross_entropy_calls(calls: list) -> Iterator[None]:
    """Record ``(input, target)`` of every ``F.cross_entropy`` call in the block (also through
    ``nn.CrossEntropyLoss``), and ``(input, None)`` of every ``F.log_softmax`` over the columns
    of a 2-D input (a cross-entropy written out, ``-log_softmax(logits, 1)[:, 0]``): how the
    pairs of a module whose forward returns a loss are seen."""
    cross_entropy, log_softmax = F.cross_entropy, F.log_softmax

    def recording(input, target, *args, **kwargs):  # noqa: A002 - torch's own names
        if isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor):
            calls.append((input, target))
        return cross_entropy(input, target, *args, **kwargs)

    def recording_log_softmax(input, dim=None, *args, **kwargs):  # noqa: A002
        if isinstance(input, torch.Tensor) and input.ndim == 2 and dim in (1, -1):
            calls.append((input, None))
        return log_softmax(input, dim, *args, **kwargs)

    F.cross_entropy, F.log_softmax = recording, recording_log_softmax
    try:
        yield
    finally:
        F.cross_entropy, F.log_softmax = cross_entropy, log_softmax


def _is_pair(value) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, torch.Tensor) for v in value)


def returned_pairs(output, captured: list, described: dict):
    """``([(logits, labels)], loss)``: one pair (the official interface), two (a symmetric
    module returning both, or returning a loss computed from two cross-entropies); ``loss``
    is the returned loss, or None."""
    if _is_pair(output) and output[0].ndim == 2:
        return [tuple(output)], None
    if isinstance(output, (tuple, list)) and len(output) == 2 and all(map(_is_pair, output)):
        return [tuple(pair) for pair in output], None
    if isinstance(output, torch.Tensor) and output.ndim == 0 and output.requires_grad:
        pairs = [(logits, labels) for logits, labels in captured
                 if logits.ndim == 2 and labels is not None]
        if not pairs:  # written out: -log_softmax(logits)[:, 0], the positive at column 0
            pairs = [(logits, torch.zeros(len(logits), dtype=torch.long))
                     for logits, labels in captured if labels is None]
        if len(pairs) in (1, 2):
            return pairs, output
        raise TypeError(f"forward(im_q, im_k) returned a loss computed from {len(pairs)} "
                        "cross-entropies of [B, 1 + K] logits; the grader follows one (the "
                        "official interface) or two (a symmetric loss), made with "
                        "F.cross_entropy, nn.CrossEntropyLoss or F.log_softmax: return "
                        "(logits, labels) to be followed whatever the loss")
    raise TypeError(f"forward(im_q, im_k) must return (logits, labels), two such pairs (a "
                    f"symmetric loss) or a loss, got {described}")


def stacked_halves(pairs: list, batch: int) -> list | None:
    """The two halves of a symmetric module that stacks both directions into one pair:
    logits ``[2B, 1 + K]`` with labels ``[2B]`` for a batch of ``B`` images per view, read as
    rows ``0 … B − 1`` and ``B … 2B − 1`` (each half one view's queries against the other
    view's keys); None for anything else."""
    if len(pairs) != 1:
        return None
    logits, labels = pairs[0]
    if logits.ndim != 2 or labels.ndim != 1 or batch < 1 or \
            logits.shape[0] != 2 * batch or labels.shape[0] != 2 * batch:
        return None
    return [(logits[:batch], labels[:batch]), (logits[batch:], labels[batch:])]


def train_step(model, optimizer, recorder: BuilderRecorder, im_q: torch.Tensor,
               im_k: torch.Tensor, *, call=None, traced=None,
               after_backward=None) -> BuilderStep:
    """One step of the official loop on ``model``; ``call`` is what is called (the module, or
    its ``DistributedDataParallel`` wrapper) and ``traced`` the images rows are traced to (this
    batch, or the world batch whose shard it is)."""
    step: BuilderStep = {"before": state_of(model)}
    recorder.begin_step(*(traced or (im_q, im_k)))
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with cross_entropy_calls(captured):
            output = (call or model)(im_q, im_k)
    finally:
        step["events"] = recorder.end_step()
    step["returned"] = describe_value(output)
    pairs, returned_loss = returned_pairs(output, captured, step["returned"])
    # [B, 1 + K] and [B] as returned (a stacked symmetric module's [2B, 1 + K] and [2B])
    step["logits"] = pairs[0][0].detach().cpu().clone()
    step["labels"] = pairs[0][1].detach().cpu().clone()
    halves = stacked_halves(pairs, len(im_q)) or pairs
    if len(halves) == 2:  # a symmetric module: (q of im_q, k of im_k), (q of im_k, k of im_q)
        step["pairs"] = [{"logits": logits.detach().cpu().clone(),
                          "labels": labels.detach().cpu().clone()} for logits, labels in halves]
    step["loss_returned"] = returned_loss is not None
    step["after_forward"] = state_of(model)
    # the official loop's loss: one cross-entropy per returned pair (of all 2B rows of a
    # stacked pair: the mean of its halves)
    loss = returned_loss if returned_loss is not None else sum(
        F.cross_entropy(logits, labels) for logits, labels in pairs)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    encoder_k = encoder_of(model, "k")
    step["key_grads"] = [p.grad is not None for p in encoder_k.parameters()] if isinstance(
        encoder_k, nn.Module) else []
    step["loss"] = float(loss.detach())
    if after_backward is not None:
        after_backward()
    optimizer.step()
    step["after_step"] = parameters_of(model)
    return step
