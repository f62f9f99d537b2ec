"""Validation of a ``components`` record: the seed and fingerprints are the grader's, and
each part holds one output per case the grader draws itself (see ``record``)."""

from __future__ import annotations

import torch

from moco_ref.judge.record import (
    boolean,
    entries,
    need,
    tensor_of,
    validate_warmup,
)
from moco_ref.probe import schema
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.styles import COMPONENTS


def validate_components_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _components_meta(meta, options)
    if name == "moco_warmup":
        validate_warmup(data)
    else:
        _component_outputs(name, data, options)

def _components_meta(meta: dict, options: GradeOptions) -> None:
    entries(meta, schema.ComponentsRecord, "the record's shared entries")
    names = {entry for part in COMPONENTS.parts for entry in part.entry_points}
    need(meta.get("seed") == int(options.seed), "the record's seed is not the grader's")
    defined = meta.get("defined", {})
    need(isinstance(defined, dict) and set(defined) <= names
          and all(isinstance(v, bool) for v in defined.values()),
          "the record's 'defined' entry is malformed")
    fingerprints = meta.get("fingerprints", {})
    need(isinstance(fingerprints, dict) and all(isinstance(v, str)
                                                 for v in fingerprints.values()),
          "the record's fingerprints are malformed")

def _component_outputs(kind: str, data, options: GradeOptions) -> None:
    from moco_ref.probe.cases import component_cases

    if data is None:
        return  # not defined
    cases = component_cases(kind, options.seed)
    need(isinstance(data, list) and len(data) == len(cases),
          f"{kind}: {len(data) if isinstance(data, list) else '?'} outputs for "
          f"{len(cases)} cases")
    for number, output in enumerate(data):
        where = f"{kind} case {number}"
        need(isinstance(output, dict), f"{where} is not a dict")
        if "error" in output:
            entries(output, schema.CaseError, where)
            need(isinstance(output["error"], str), f"{where}'s error is malformed")
            continue
        entries(output, schema.CASE_OUTPUTS[kind], where)
        if kind == "queue":
            batches = len(cases[number].batch_sizes)
            for key in ("keys", "ids", "len"):
                need(isinstance(output.get(key), list) and len(output[key]) == batches,
                      f"{where}.{key} does not hold one entry per enqueue")
            for tensor in output["keys"] + output["ids"]:
                tensor_of(tensor, where)
            need(all(isinstance(n, int) for n in output["len"]), f"{where}.len is malformed")
        elif kind == "ema":
            for key in ("key_params", "key_buffers"):
                need(isinstance(output.get(key), list), f"{where}.{key} is not a list")
                for tensor in output[key]:
                    tensor_of(tensor, where)
            boolean(output.get("query_unchanged"), f"{where}.query_unchanged")
        elif kind == "logits":
            tensor_of(output.get("logits"), f"{where}.logits", dtype=torch.float64)
        elif kind == "loss":
            need(isinstance(output.get("loss"), float), f"{where}.loss is not a number")
