"""Shared helpers of the harness's tests: loading an example submission into a fresh namespace
and grading it in-process (observe + judge, through a torch.save round trip as in the real
runner). The sandboxed runner is exercised by the grading tests, not here."""

from __future__ import annotations

import ast
import importlib.util
import io
import itertools
import json
from pathlib import Path

import torch

from moco_ref.judge.judge import judge
from moco_ref.judge.results import Status
from moco_ref.observe.observers import observe
from moco_ref.probe.options import GradeOptions

ROOT = Path(__file__).resolve().parents[2]
SUBMISSIONS = ROOT / "examples" / "submissions"
MANIFEST = SUBMISSIONS / "manifest.json"
_counter = itertools.count()


def manifest_entries() -> list[dict]:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["submissions"]


def load_namespace(path: Path) -> dict:
    """The module globals of a ``.py`` submission, or a notebook's definitions."""
    if path.suffix == ".ipynb" or "get_ipython()" in path.read_text():
        return _load_notebook(path)  # IPython's meaning (a notebook, or its .py export)
    spec = importlib.util.spec_from_file_location(f"example_submission_{next(_counter)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.__dict__


def _load_notebook(path: Path) -> dict:
    try:
        from moco_ref.observe.loader import load_submission
    except ImportError:  # the real loader is written elsewhere; keep definitions only
        import nbformat

        namespace: dict = {"__name__": "example_notebook"}
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type != "code":
                continue
            lines = [line for line in cell.source.splitlines()
                     if not line.lstrip().startswith(("!", "%"))]
            tree = ast.parse("\n".join(lines))
            tree.body = [node for node in tree.body if isinstance(
                node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
                or (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant))]
            exec(compile(tree, str(path), "exec"), namespace)
        return namespace
    return load_submission(str(path)).namespace


def round_trip(record: dict) -> dict:
    """What the grader's process receives: ``torch.save`` then ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(record, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def grade(namespace: dict, style: str, options: GradeOptions | None = None):
    options = options or GradeOptions()
    return judge(round_trip(observe(namespace, style, options)), style, options)


def not_passed_families(results) -> set[str]:
    return {r.family for r in results
            if r.status in (Status.FAILED, Status.ERROR, Status.TIMEOUT, Status.NOT_JUDGED)}


def explain(results) -> str:
    return "\n".join(f"{r.status.value:>14}  {r.check_id}: {r.message}" for r in results
                     if r.status is not Status.PASSED)
