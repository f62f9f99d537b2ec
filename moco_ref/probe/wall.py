"""The one rule for what crosses the process wall, from the submission's process to the judge.

A value may cross if it is plain data — ordinary strided tensors, the rule's leaf types
(None, bool, int, float, str), and lists, tuples and dicts keyed by str or int — within the
rule's limits: nesting depth, entries per container, characters per text, bytes of tensor
elements in all. ``WALL`` is the rule in force; ``WallRule`` declares its limits once, and all
three places that apply it read them from the same instance:

- ``WallRule.sanitized`` (the observer, on what the submission returns): lossy, never
  raises for a value's kind; what is not plain data becomes ``{"__type__", "__repr__"}``,
  and long containers, long texts and deep nesting are cut;
- ``WallRule.plain_copy`` (the worker, before ``torch.save``): strict; a copy of exactly
  what was given, or ``TypeError`` for a kind of value that may not cross and
  ``WallViolation`` for one beyond a limit, either naming where;
- ``WallRule.check`` (the judge, on what arrived): the reader's validation, raising
  ``WallViolation``; anything ``plain_copy`` returns passes it once through ``torch.save`` and
  ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import islice
from types import NoneType

import torch

_NOT_A_LEAF = object()
STUB_KEYS = ("__type__", "__repr__")  # what the lossy side puts for a value it cannot keep


class WallViolation(ValueError):
    """A value beyond the rule: the writer sends nothing, the reader believes nothing."""


@dataclass(frozen=True)
class WallRule:
    """What may cross the wall. Depth counts containers from the value handed over (level
    0): a value at a level deeper than ``max_depth`` is refused; dict keys are no level."""

    # strict and reader: the deepest level a value may sit at
    max_depth: int = 24
    # strict and reader: most entries of one list, tuple or dict; above every list a probe
    # records (lab_record.MAX_VIEW_CALLS view calls, probe.lab.MAX_EVENTS forwards)
    max_items: int = 100_000
    # all three: most characters of one text (a value or a key); the lossy side cuts to it
    max_text: int = 1_000_000
    # strict and reader: bytes of tensor elements in one value handed over (a part's data,
    # or the rest of its record), far above what any probe records
    max_tensor_bytes: int = 512 * 2**20
    # all three: the leaves besides tensors (the strict side copies a subclass's value as
    # the first of these it is an instance of, so bool comes before int)
    leaf_types: tuple[type, ...] = (NoneType, bool, int, float, str)
    # all three: the types a dict's keys may have (the lossy side turns every key into text)
    key_types: tuple[type, ...] = (str, int)
    # lossy: a submission's own value is cut below this level, each container after so many
    # entries, an unknown object's type name and repr after so many characters
    lossy_depth: int = 8
    lossy_items: int = 10_000
    repr_text: int = 200

    def __post_init__(self) -> None:
        # what the lossy side keeps must cross: a cut value's stub sits one level below
        # ``lossy_depth`` and holds texts one level further down; its keys are text
        if not (str in self.leaf_types and str in self.key_types
                and self.lossy_depth + 2 <= self.max_depth
                and max(self.lossy_items, len(STUB_KEYS)) <= self.max_items
                and max(self.repr_text, *map(len, STUB_KEYS)) <= self.max_text):
            raise ValueError(f"the lossy limits of {self} exceed its strict ones")

    # ----------------------------------------------------------------------- lossy

    def sanitized(self, value):
        """``value`` as plain data, whatever it is: tensors become detached CPU copies,
        numpy values tensors or numbers, tuples lists, dict keys text; anything else, or
        anything below level ``lossy_depth``, becomes ``{"__type__", "__repr__"}``. Lists and
        dicts keep their first ``lossy_items`` entries, texts their first ``max_text``
        characters. Tensors are not cut: ``plain_copy`` refuses too many of their bytes."""
        return self._sanitized(value, 0)

    def _sanitized(self, value, depth: int):
        if depth > self.lossy_depth:
            return self._stub(value, "<nested too deep>")
        leaf = self._leaf(value)
        if leaf is not _NOT_A_LEAF:
            return leaf[:self.max_text] if isinstance(leaf, str) else leaf
        if isinstance(value, torch.Tensor):
            tensor = _tensor_copy(value)
            return self._stub(value, repr(value)) if tensor is None else tensor
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            if value.dtype.kind in "biuf":
                return torch.from_numpy(numpy.array(value))
            return self._sanitized(value.tolist(), depth)
        if isinstance(value, dict):
            return {str(key)[:self.max_text]: self._sanitized(item, depth + 1)
                    for key, item in islice(value.items(), self.lossy_items)}
        if isinstance(value, list | tuple):
            return [self._sanitized(item, depth + 1)
                    for item in islice(value, self.lossy_items)]
        return self._stub(value, repr(value))

    def _stub(self, value, text: str) -> dict:
        return dict(zip(STUB_KEYS, (type(value).__name__[:self.repr_text],
                                    text[:self.repr_text])))

    # ----------------------------------------------------------------------- strict

    def plain_copy(self, value, where: str = "observations"):
        """A copy of ``value`` that may cross: plain tensors (detached, on the CPU, no
        subclass), numpy values as tensors or numbers, leaves as their exact leaf type,
        lists, tuples and dicts as themselves. A kind of value that may not cross raises
        ``TypeError`` (a bug in the observer), one beyond a limit ``WallViolation``; both
        name where, from ``where`` down (``where['key'][3]``)."""
        return self._copy(value, where, 0, [0])

    def _copy(self, value, where: str, depth: int, tensor_bytes: list[int]):
        if depth > self.max_depth:
            raise WallViolation(f"{where} is nested deeper than {self.max_depth} levels")
        leaf = self._leaf(value)
        if leaf is not _NOT_A_LEAF:
            if isinstance(leaf, str) and len(leaf) > self.max_text:
                raise WallViolation(f"{where} is a text of {len(leaf)} characters, more than "
                                    f"{self.max_text}")
            return leaf
        if isinstance(value, dict):
            self._few(value, where)
            return {self._key(key, where): self._copy(item, f"{where}[{key!r}]", depth + 1,
                                                      tensor_bytes)
                    for key, item in value.items()}
        if isinstance(value, list | tuple):
            self._few(value, where)
            items = [self._copy(item, f"{where}[{index}]", depth + 1, tensor_bytes)
                     for index, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        tensor = self._tensor_of(value, where)
        tensor_bytes[0] += tensor.numel() * tensor.element_size()
        if tensor_bytes[0] > self.max_tensor_bytes:
            raise WallViolation(f"{where} brings the tensors to more than "
                                f"{self.max_tensor_bytes} bytes")
        return tensor

    def _tensor_of(self, value, where: str) -> torch.Tensor:
        """The tensor a tensor or numpy array crosses as, or ``TypeError``."""
        if isinstance(value, torch.Tensor):
            tensor = _tensor_copy(value)
            if tensor is not None:
                return tensor
            raise TypeError(f"{where} is a {value.layout} tensor; observations must be "
                            "ordinary strided tensors")
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            try:
                return torch.from_numpy(numpy.array(value))
            except TypeError as exc:
                raise TypeError(f"{where} is an array torch cannot hold ({exc})") from None
        raise TypeError(
            f"{where} is a {type(value).__module__}.{type(value).__qualname__}; observations "
            "must be tensors, numbers, strings, bools, None, lists, tuples or dicts"
        )

    def _key(self, key, where: str):
        leaf = self._leaf(key)
        if leaf is _NOT_A_LEAF or not isinstance(leaf, self.key_types):
            raise TypeError(f"{where} has a key of type {type(key).__module__}."
                            f"{type(key).__qualname__}; keys must be "
                            + " or ".join(kind.__name__ for kind in self.key_types))
        if isinstance(leaf, str) and len(leaf) > self.max_text:
            raise WallViolation(f"{where} has a key of more than {self.max_text} characters")
        return leaf

    def _few(self, container, where: str) -> None:
        if len(container) > self.max_items:
            raise WallViolation(f"{where} holds {len(container)} entries, more than "
                                f"{self.max_items}")

    def _leaf(self, value):
        """``value`` as the first of the leaf types it is an instance of (a numpy scalar as
        its Python value), or ``_NOT_A_LEAF``."""
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.generic):
            value = value.item()
        for kind in self.leaf_types:
            if isinstance(value, kind):
                return None if value is None else kind(value)
        return _NOT_A_LEAF

    # ----------------------------------------------------------------------- reader

    def check(self, value, where: str, *, types: bool = True, tensors: bool = True) -> int:
        """The walk done on what arrived before anything in it is believed; raises
        ``WallViolation`` naming ``where``. Always: no level deeper than ``max_depth``, no
        container over ``max_items`` entries, no text over ``max_text`` characters. With
        ``types``: only leaves, plain ``torch.Tensor``\\ s, lists, tuples and dicts keyed by
        ``key_types``. With ``tensors``: every tensor an ordinary strided one whose elements
        all lie in bytes that were sent (no stride-0 expansion, no overlapping view that
        multiplies its storage), all of them together within ``max_tensor_bytes``. Returns
        the bytes of tensor elements counted (0 without ``tensors``)."""
        tensor_bytes = [0]
        self._check(value, where, 0, types, tensor_bytes if tensors else None)
        return tensor_bytes[0]

    def _check(self, value, where: str, depth: int, types: bool,
               tensor_bytes: list[int] | None) -> None:
        _need(depth <= self.max_depth, f"{where} is nested too deep")
        if isinstance(value, torch.Tensor):
            if tensor_bytes is not None:
                self._dense(value, where, tensor_bytes)
            _need(not types or type(value) is torch.Tensor,
                  f"{where} holds a {type(value).__name__}")
        elif isinstance(value, dict):
            self._bounded(value, where)
            for key, item in value.items():
                _need(not types or isinstance(key, self.key_types),
                      f"{where} has a key of type {type(key).__name__}")
                _need(not isinstance(key, str) or len(key) <= self.max_text,
                      f"{where} has a key of more than {self.max_text} characters")
                self._check(item, where, depth + 1, types, tensor_bytes)
        elif isinstance(value, list | tuple):
            self._bounded(value, where)
            for item in value:
                self._check(item, where, depth + 1, types, tensor_bytes)
        elif isinstance(value, str):
            _need(len(value) <= self.max_text,
                  f"{where} holds a text of {len(value)} characters, more than {self.max_text}")
        else:
            _need(not types or isinstance(value, self.leaf_types),
                  f"{where} holds a {type(value).__name__}")

    def _bounded(self, container, where: str) -> None:
        _need(len(container) <= self.max_items,
              f"{where} holds a {type(container).__name__} of {len(container)} entries, "
              f"more than {self.max_items}")

    def _dense(self, tensor: torch.Tensor, where: str, tensor_bytes: list[int]) -> None:
        _need(tensor.layout == torch.strided and not tensor.is_quantized,
              f"{where} holds a {tensor.layout} tensor")
        logical = tensor.numel() * tensor.element_size()
        stored = tensor.untyped_storage().nbytes()
        _need(logical <= stored and (tensor.numel() <= 1 or tensor.is_contiguous() or all(
            stride > 0 or size == 1 for size, stride in zip(tensor.shape, tensor.stride()))),
            f"{where} holds a tensor of shape {list(tensor.shape)} that is not dense "
            f"({logical} bytes of elements over {stored} bytes sent)")
        tensor_bytes[0] += logical
        _need(tensor_bytes[0] <= self.max_tensor_bytes,
              f"{where} holds more than {self.max_tensor_bytes} bytes of tensors")


WALL = WallRule()


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise WallViolation(message)


def _tensor_copy(value: torch.Tensor) -> torch.Tensor | None:
    """A detached CPU copy of ``value`` as a plain ``torch.Tensor``; None unless it is an
    ordinary strided tensor (the reader refuses sparse, quantized and other layouts)."""
    if value.layout != torch.strided or value.is_quantized:
        return None
    tensor = value.detach().cpu()
    if type(tensor) is not torch.Tensor:
        tensor = tensor.as_subclass(torch.Tensor)
    return tensor.clone()
