"""I1: key grads stay None; keys are computed without autograd."""

from __future__ import annotations

from moco_ref.judge.assertions import (
    SubmissionError,
    at_step,
    fail,
    require,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import builder_where
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check

KEY_GRADS_NONE = check(
    "I1-key-grads-none",
    "no key parameter ever receives .grad",
    points=2,
    contract=(
        "No key-encoder parameter ever receives a gradient: after any number of steps every key "
        "parameter's .grad is None."
    ),
)


@KEY_GRADS_NONE.judges('lab')
def i1_key_grads_none_lab(ev: LabEvidence) -> str | None:
    """Every parameter of the key encoder has ``.grad is None`` throughout training and after
    it: the key encoder is moved only by the EMA, never by back-propagation."""
    run = ev.require_run()
    ev.require_key_encoder_used()
    names = [n for n, _ in ev.segments]
    for step in ev.steps:
        event = run["events"][step.key_event]
        key_tag = step.key_tag  # the copy that encoded this step's keys
        if key_tag in event["snapshot_tags"] and event["has_grad"][event["snapshot_tags"].index(
                key_tag)]:
            fail("the key encoder received gradients (keys computed with autograd, or the key "
                 "encoder is in the loss's graph)", where=at_step(step.index, step.ids),
                 expected="every key parameter's .grad to be None",
                 got=".grad set on the key encoder's parameters")
    grads_none = ev.returned.get("key_grads_none")
    if grads_none is None:
        raise SubmissionError("train_moco returned no key encoder to inspect")
    with_grad = [n for n, none in zip(names, grads_none) if not none]
    require(not with_grad, "the key encoder received gradients", where="after training",
            expected="every key parameter's .grad to be None",
            got=f".grad set on {', '.join(with_grad)}")
    return None


@KEY_GRADS_NONE.judges('builder')
def i1_key_grads_none_builder(ev: BuilderEvidence) -> str | None:
    """After every ``loss.backward()`` of the official loop (cross-entropy of the returned
    logits), every parameter of ``encoder_k`` has ``.grad is None``: the key encoder is moved
    only by the EMA, never by back-propagation."""
    names = [entry["name"] for entry in ev.module.get("layout_k", [])]
    for step in ev.steps:
        with_grad = [name for name, has in zip(names, step.key_grads) if has]
        require(not with_grad, "the key encoder received gradients (the keys are in the loss's "
                "graph: no torch.no_grad() around the key forward, and θk still requires grad)",
                where=builder_where(step.index),
                expected="every encoder_k parameter's .grad to be None after loss.backward()",
                got=f".grad set on {', '.join(with_grad[:4])}"
                    + (f" and {len(with_grad) - 4} more" if len(with_grad) > 4 else ""))
    return None


@KEY_GRADS_NONE.judges('components')
def i1_key_grads_none_components(ev: ComponentsEvidence) -> str | None:
    """``momentum_update`` records no autograd history: afterwards every key parameter still
    has ``.grad is None`` and is a leaf."""
    for number, case, output in ev.outputs("ema"):
        require(all(output["key_grads_none"]) and not any(output["key_grad_fn"]),
                "momentum_update left gradients or a graph on the key parameters",
                where=f"in case {number} (m = {case.m:g})",
                expected="every key parameter's .grad None, no grad_fn",
                got=f".grad set: {output['key_grads_none'].count(False)}, grad_fn: "
                    f"{sum(output['key_grad_fn'])}")
    return None


KEYS_WITHOUT_AUTOGRAD = check(
    "I1-keys-without-autograd",
    "keys are computed without autograd",
    points=1,
    contract=(
        "Keys are computed without autograd: the key encoder's outputs carry no grad_fn, so "
        "nothing of the loss flows back into the key branch."
    ),
)


@KEYS_WITHOUT_AUTOGRAD.judges('lab')
def i1_keys_without_autograd_lab(ev: LabEvidence) -> str | None:
    """The key encoder's output carries no autograd graph (``torch.no_grad()``, or frozen
    parameters and a detached input): no gradient can flow into θk."""
    for step in ev.steps:
        require(not step.key_has_grad_fn,
                "keys were computed with autograd: the key forward builds a graph into θk",
                where=at_step(step.index, step.ids),
                expected="a key projection without grad_fn (wrap the key forward in "
                         "torch.no_grad())",
                got="a key projection with grad_fn"
                    + (" (autograd was enabled)" if step.key_grad_enabled else ""))
    return None


@KEYS_WITHOUT_AUTOGRAD.judges('builder')
def i1_keys_without_autograd_builder(ev: BuilderEvidence) -> str | None:
    """``encoder_k``'s output carries no autograd graph (``torch.no_grad()``, or frozen
    parameters): no gradient can flow into θk."""
    for step in ev.steps:
        require(not step.key_has_grad_fn,
                "keys were computed with autograd: the key forward builds a graph into θk",
                where=builder_where(step.index),
                expected="encoder_k's output without grad_fn (run it under torch.no_grad())",
                got="an output with grad_fn" + (" (autograd was enabled)"
                                                if step.key_grad_enabled else ""))
    return None
