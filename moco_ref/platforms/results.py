"""What every platform's results share: each check numbered within its family without
betraying a withheld one, points a platform's JSON accepts, a results dict checked against
the platform's JSON schema, and the one interface of a learning platform's package."""

from __future__ import annotations

import json
import math
from pathlib import Path

from moco_ref.judge.results import CheckResult
from moco_ref.judge.rubric import VISIBILITIES


def numbered(results: list[CheckResult], visibility_of) -> list[str]:
    """``I4.1``, ``I4.2``, ``contract.1``: the family and the check's place in it, counting
    first the checks a student sees sooner (``VISIBILITIES`` is in that order), so what a
    student sees at any time is numbered 1..n without gaps and no number betrays a test
    withheld from them."""
    order = sorted(range(len(results)), key=lambda i: (
        VISIBILITIES.index(visibility_of(results[i].check_id)), i))
    seen: dict[str, int] = {}
    numbers = [""] * len(results)
    for i in order:
        family = results[i].family
        seen[family] = seen.get(family, 0) + 1
        numbers[i] = f"{family}.{seen[family]}"
    return numbers


def points(value: float) -> float:
    value = round(float(value), 4) + 0.0
    return value if math.isfinite(value) else 0.0


def schema_problems(data, schema_path: Path) -> list[str]:
    import jsonschema

    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        problems.append(f"{where}: {error.message}")
    return problems


