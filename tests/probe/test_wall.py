"""One rule for what crosses the process wall (``probe.wall``): what the writer side sends the
reader side takes, what is beyond the rule's limits is cut or refused before it is sent, and
the three sides keep the limits the grader had before they were one rule.

The limits a value reaches are measured here by a walk of its own, not by the rule's code."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given

from moco_ref.judge.record import Invalid
from moco_ref.probe.wall import WALL, WallRule, WallViolation
from tests.helpers.strategies import any_values, plain_values, wall_rules

# --------------------------------------------------------------------------- measured here


def _levels(value, level: int = 0):
    """``(level, value)`` of ``value`` and of everything in it; a dict's keys are no level."""
    yield level, value
    if isinstance(value, dict):
        for item in value.values():
            yield from _levels(item, level + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _levels(item, level + 1)


def _measure(value) -> dict:
    """The deepest level, the most entries of one container, the longest text (keys too)
    and the bytes of tensor elements of ``value``."""
    deepest, widest, longest, tensor_bytes = 0, 0, 0, 0
    for level, item in _levels(value):
        deepest = max(deepest, level)
        if isinstance(item, dict | list | tuple):
            widest = max(widest, len(item))
        if isinstance(item, str):
            longest = max(longest, len(item))
        if isinstance(item, dict):
            longest = max([longest, *(len(key) for key in item if isinstance(key, str))])
        if isinstance(item, torch.Tensor):
            tensor_bytes += item.numel() * item.element_size()
    return {"deepest": deepest, "widest": widest, "longest": longest, "bytes": tensor_bytes}


def _within(value, rule: WallRule) -> bool:
    size = _measure(value)
    return (size["deepest"] <= rule.max_depth and size["widest"] <= rule.max_items
            and size["longest"] <= rule.max_text and size["bytes"] <= rule.max_tensor_bytes)


def _only_plain(value, containers=(list, tuple, dict)) -> bool:
    for _, item in _levels(value):
        if type(item) is dict and not all(type(key) in (str, int) for key in item):
            return False
        if type(item) not in (type(None), bool, int, float, str, torch.Tensor, *containers):
            return False
    return True


def _same(got, want, *, lossy: bool = False) -> bool:
    """Equal as data: the same container types, tensors equal in dtype, shape and values,
    floats equal or both NaN. ``lossy``: a tuple as a list, a dict's keys as text."""
    if isinstance(want, torch.Tensor):
        return type(got) is torch.Tensor and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, dict):
        keys = [str(key) if lossy else key for key in want]
        return type(got) is dict and list(got) == keys and all(
            _same(got[key], item, lossy=lossy) for key, item in zip(keys, want.values()))
    if isinstance(want, list | tuple):
        kind = list if lossy else type(want)
        return type(got) is kind and len(got) == len(want) and all(
            _same(a, b, lossy=lossy) for a, b in zip(got, want))
    if isinstance(want, float) and math.isnan(want):
        return type(got) is float and math.isnan(got)
    return type(got) is type(want) and got == want


def _received(value):
    """What the judge's process gets: ``torch.save`` then ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _verdict(step) -> str:
    try:
        step()
    except WallViolation:
        return "refused"
    return "accepted"


# --------------------------------------------------------------------------- the property


@given(rule=wall_rules(), value=plain_values)
def test_plain_data_crosses_exactly_when_it_is_within_the_rule(rule, value):
    """The writer and the reader agree, and agree with the limits measured here: plain data
    within every limit is copied as it is and taken by the reader; beyond any, both refuse."""
    within = _within(value, rule)
    assert _verdict(lambda: rule.check(value, "x")) == ("accepted" if within else "refused")
    if not within:
        with pytest.raises(WallViolation):
            rule.plain_copy(value)
        return
    copied = rule.plain_copy(value)
    assert _same(copied, value)
    assert rule.check(_received(copied), "x") == _measure(value)["bytes"]


@given(rule=wall_rules(), value=any_values)
def test_whatever_the_strict_side_sends_the_reader_takes(rule, value):
    """Any value at all: the strict copy refuses it (``TypeError`` for a kind that may not
    cross, ``WallViolation`` past a limit) or sends plain data within the rule, which the
    reader takes once it has been through ``torch.save`` and ``torch.load``."""
    try:
        copied = rule.plain_copy(value, "v")
    except (TypeError, WallViolation) as refusal:
        assert str(refusal).startswith("v")  # it says where
        return
    assert _only_plain(copied) and _within(copied, rule)
    rule.check(_received(copied), "x")


@given(rule=wall_rules(), value=any_values)
def test_the_lossy_side_cuts_anything_to_within_the_rule(rule, value):
    """The observer's conversion never refuses a kind of value: what it returns is lists,
    dicts keyed by text and plain leaves, cut to its own limits (a cut value's stub is a dict
    of two texts, one level further down), which the strict side then sends unless its
    tensors are too many bytes."""
    kept = rule.sanitized(value)
    size = _measure(kept)
    assert _only_plain(kept, containers=(list, dict))
    assert all(type(key) is str for _, item in _levels(kept) if type(item) is dict
               for key in item)
    assert size["deepest"] <= rule.lossy_depth + 2
    assert size["widest"] <= max(rule.lossy_items, 2)
    assert size["longest"] <= rule.max_text
    if size["bytes"] > rule.max_tensor_bytes:
        with pytest.raises(WallViolation, match="more than"):
            rule.plain_copy(kept)
    else:
        rule.check(_received(rule.plain_copy(kept)), "x")


@given(rule=wall_rules(), value=plain_values)
def test_the_lossy_side_keeps_plain_data_within_its_limits_as_it_is(rule, value):
    """Within the lossy limits nothing is cut: a tuple arrives as a list, a key as text."""
    size = _measure(value)
    assume(all(len(set(map(str, item))) == len(item) for _, item in _levels(value)
               if isinstance(item, dict)))  # 1 and "1" would be one key
    if (size["deepest"] <= rule.lossy_depth and size["widest"] <= rule.lossy_items
            and size["longest"] <= rule.max_text):
        assert _same(rule.sanitized(value), value, lossy=True)


# --------------------------------------------------------------------------- the rule in force


def _nested_in_lists(levels: int):
    value = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("value, beyond", [
    (_nested_in_lists(24), _nested_in_lists(25)),
    ([None] * 100_000, [None] * 100_001),
    ({"k" * 1_000_000: 0}, {"k" * 1_000_001: 0}),
    ("t" * 1_000_000, ["t" * 1_000_001]),
])
def test_the_writer_and_the_reader_share_each_limit(value, beyond):
    """Depth 24 (the reader's before the rule was one), 100,000 entries, 1,000,000
    characters: at the limit both sides take it, one past it both refuse."""
    WALL.check(_received(WALL.plain_copy(value)), "the part")
    with pytest.raises(WallViolation):
        WALL.plain_copy(beyond)
    with pytest.raises(Invalid):  # the judge's refusal is the wall's
        WALL.check(beyond, "the part")


def test_a_submission_s_own_value_is_cut_as_before():
    """The observer's cuts the grader had: 10,000 entries, below level 8, a repr of 200
    characters; and now texts of 1,000,000 characters."""
    assert WALL.sanitized(list(range(10_001))) == list(range(10_000))
    assert WALL.sanitized(dict.fromkeys(range(10_001), 1)) == dict.fromkeys(
        map(str, range(10_000)), 1)
    deep = WALL.sanitized(_nested_in_lists(10))
    for _ in range(9):
        deep = deep[0]
    assert deep == {"__type__": "list", "__repr__": "<nested too deep>"}
    assert WALL.sanitized(_nested_in_lists(8)) == _nested_in_lists(8)

    class Chatty:
        def __repr__(self) -> str:
            return "c" * 500

    assert WALL.sanitized([Chatty()]) == [{"__type__": "Chatty", "__repr__": "c" * 200}]
    assert WALL.sanitized("s" * 1_000_001) == "s" * 1_000_000


def test_the_rule_holds_every_list_a_probe_records():
    from moco_ref.judge.lab_record import MAX_VIEW_CALLS
    from moco_ref.probe.lab import MAX_EVENTS

    assert WALL.max_items >= max(MAX_VIEW_CALLS, MAX_EVENTS, WALL.lossy_items)


def test_a_rule_whose_lossy_side_would_keep_what_its_strict_side_refuses_is_refused():
    for limits in ({"lossy_depth": 23}, {"lossy_items": 100_001}, {"repr_text": 1_000_001},
                   {"max_items": 1, "lossy_items": 1}, {"max_text": 7, "repr_text": 7},
                   {"key_types": (int,)}):
        with pytest.raises(ValueError, match="exceed"):
            WallRule(**limits)


# --------------------------------------------------------------------------- each side


def test_the_strict_copy_converts_or_refuses():
    parameter = torch.nn.Parameter(torch.ones(2))
    data = WALL.plain_copy({"p": parameter, "a": np.arange(2), "n": np.float32(0.5),
                            "t": (1, None), np.int64(3): True})
    assert type(data["p"]) is torch.Tensor and not data["p"].requires_grad
    assert torch.equal(data["a"], torch.arange(2)) and data["n"] == 0.5 and data["t"] == (1, None)
    assert data[3] is True and type(next(reversed(data))) is int
    with pytest.raises(TypeError, match=r"observations\['bad'\]\[0\] is a builtins.object"):
        WALL.plain_copy({"bad": [object()]})
    with pytest.raises(TypeError, match=r"observations\['k'\] has a key of type builtins.float"):
        WALL.plain_copy({"k": {0.5: 1}})
    with pytest.raises(TypeError, match=r"observations\[1\] is a torch.sparse_coo tensor"):
        WALL.plain_copy([0, torch.zeros(2).to_sparse()])
    with pytest.raises(WallViolation, match=r"observations\['t'\] is a text of 1000001 char"):
        WALL.plain_copy({"t": "x" * 1_000_001})


def test_the_reader_checks_tensor_subclasses_for_density_too():
    """A ``Parameter`` passes ``torch.load(weights_only=True)``: an expanded one is refused by
    the walk done before any work, not only by the walk for types after it."""
    expanded = torch.nn.Parameter(torch.zeros(1, 4).expand(10**4, 4), requires_grad=False)
    with pytest.raises(WallViolation, match="not dense"):
        WALL.check([_received(expanded)], "the part", types=False)
    with pytest.raises(WallViolation, match="holds a Parameter"):
        WALL.check([torch.nn.Parameter(torch.zeros(2))], "the part", tensors=False)


def test_the_judge_refuses_a_part_beyond_the_rule_with_the_wall_s_words():
    from moco_ref.judge.styles import validate_part
    from moco_ref.probe.cases import default_lab_probe
    from moco_ref.probe.options import GradeOptions

    options = GradeOptions()
    meta = {"probe": default_lab_probe(options.seed, options.probe_key).to_dict()}
    warmup = {"defined": True, "error": None, "result": {"FIFO": ["c", "d"]}}
    assert validate_part("lab", "moco_warmup", warmup, meta, options) == ""
    warmup["error"] = "e" * 1_000_001
    assert validate_part("lab", "moco_warmup", warmup, meta, options) == (
        "the part holds a text of 1000001 characters, more than 1000000")
    warmup["error"], warmup["result"] = None, {"FIFO": list(range(100_001))}
    assert validate_part("lab", "moco_warmup", warmup, meta, options) == (
        "the part holds a list of 100001 entries, more than 100000")
