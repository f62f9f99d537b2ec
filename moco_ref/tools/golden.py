"""Golden values with provenance: what the reference produced, with a tolerance per value.

Each golden is a JSON file in ``golden/`` named after its producer. ``check`` recomputes every
producer and compares value by value; ``update`` rewrites the files, shows a readable diff and
records the reason. A producer without a file (missing) or a file without a producer (unused)
is an error, so a golden cannot silently stop being checked.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch import nn

from moco_ref.core.step import MoCoTrainer
from moco_ref.core.tolerance import NotComparable, mismatch
from moco_ref.core.warmup import moco_warmup
from moco_ref.tools.walk import run_walk

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "golden"
EXACT = {"rtol": 0.0, "atol": 0.0}
FLOAT64 = {"rtol": 1e-12, "atol": 1e-14}
FLOAT32 = {"rtol": 1e-4, "atol": 1e-5}

# Short trajectory: a 5 -> 4 linear encoder in float64, ragged batches, recurring ids.
TRAJECTORY_BATCHES = [[0, 1, 2], [3, 4], [0, 5, 6, 7], [1, 3], [2, 8, 0], [4, 5, 9]]
TRAJECTORY = {"in_dim": 5, "dim": 4, "m": 0.8, "temperature": 0.2, "capacity": 5, "lr": 0.5,
              "noise": 0.1, "seed": 11}


@dataclass(frozen=True)
class Golden:
    name: str
    produce: Callable[[], dict]  # name -> {"value": ..., "rtol": ..., "atol": ...}
    dtype: str
    seed: int | None
    route: str  # the independent route that cross-checks it in the tests


def _values(values: dict, tolerance: dict) -> dict:
    return {name: {"value": value, **tolerance} for name, value in values.items()}


def warmup_golden() -> dict:
    result = moco_warmup()
    values = {f"temperature_probabilities.{t}": p
              for t, p in result["temperature_probabilities"].items()}
    return {**_values(values, FLOAT64), **_values({"FIFO": result["FIFO"]}, EXACT),
            **_values({"EMA": result["EMA"]}, FLOAT64)}


def walk_golden() -> dict:
    out = {}
    for order in ("paper", "lab"):
        walk = run_walk(order)
        out.update(_values({f"{order}.loss": walk.loss}, FLOAT64))
        out.update(_values({f"{order}.stages": [e.stage for e in walk.events],
                            f"{order}.dictionary_after": walk.dictionary_after}, EXACT))
    return out


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # view_q, view_k, ids


def trajectory_inputs() -> tuple[torch.Tensor, list[Batch]]:
    """The initial weight ``[dim, in_dim]`` and the (view_q, view_k, ids) of every step."""
    generator = torch.Generator().manual_seed(TRAJECTORY["seed"])
    shape = (TRAJECTORY["dim"], TRAJECTORY["in_dim"])
    weight = torch.randn(shape, generator=generator, dtype=torch.float64) / 2
    images = torch.randn(10, TRAJECTORY["in_dim"], generator=generator, dtype=torch.float64)
    steps = []
    for ids in TRAJECTORY_BATCHES:
        ids = torch.tensor(ids)
        noise = TRAJECTORY["noise"] * torch.randn(2, len(ids), TRAJECTORY["in_dim"],
                                                  generator=generator, dtype=torch.float64)
        steps.append((images[ids] + noise[0], images[ids] + noise[1], ids))
    return weight, steps


def run_trajectory(order: str) -> dict:
    weight, steps = trajectory_inputs()
    encoder = nn.Linear(TRAJECTORY["in_dim"], TRAJECTORY["dim"], bias=False).double()
    with torch.no_grad():
        encoder.weight.copy_(weight)
    trainer = MoCoTrainer(encoder, torch.optim.SGD(encoder.parameters(), lr=TRAJECTORY["lr"]),
                          m=TRAJECTORY["m"], temperature=TRAJECTORY["temperature"],
                          capacity=TRAJECTORY["capacity"], order=order)
    record = {"ids": [], "keys": [], "losses": [], "queue_ids": [], "query_weight": [],
              "key_weight": []}
    for view_q, view_k, ids in steps:
        result = trainer.step(view_q, view_k, ids)
        record["ids"].append(ids.tolist())
        record["keys"].append(result.k.tolist())
        record["losses"].append(result.loss.item())
        record["queue_ids"].append(trainer.queue.ids.tolist())
        record["query_weight"].append(trainer.encoder_q.weight.tolist())
        record["key_weight"].append(trainer.encoder_k.weight.tolist())
    return record


def trajectory_golden(order: str) -> Callable[[], dict]:
    def produce() -> dict:
        record = run_trajectory(order)
        exact = {name: record[name] for name in ("ids", "queue_ids")}
        close = {name: record[name] for name in ("keys", "losses", "query_weight", "key_weight")}
        return {**_values(exact, EXACT), **_values(close, FLOAT64)}

    return produce


DIGITS_RUN = {"epochs": 2, "seed": 0, "noise": 0.1, "items": 600}
FLOAT32_RUN = {"rtol": 1e-3, "atol": 1e-4}  # 2 epochs of float32 training: stated drift bound


def _noise_views(seed: int):
    """Plain-torch views (no torchvision): the image plus seeded Gaussian noise."""
    generator = torch.Generator().manual_seed(seed)

    def views(batch: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(batch.shape, generator=generator, dtype=batch.dtype)
        return batch + DIGITS_RUN["noise"] * noise

    return views


def digits_run_golden() -> dict:
    """``train_moco`` in float32 on the first 600 bundled digits, LAB 07 settings, 2 epochs."""
    from moco_ref.core.lab import train_moco
    from moco_ref.tools.data import load_digits_dataset
    from moco_ref.tools.models import SmallConvNet
    from moco_ref.tools.recipes import RECIPES

    data = load_digits_dataset()
    torch.manual_seed(DIGITS_RUN["seed"])
    model = SmallConvNet(data.channels, **RECIPES["lab07"].model)
    train = torch.arange(DIGITS_RUN["items"])
    *_, queue, queue_ids, history, trace, drift = train_moco(
        model, data.images, train, DIGITS_RUN["epochs"], seed=DIGITS_RUN["seed"],
        views=_noise_views(DIGITS_RUN["seed"] + 1),
    )
    return {**_values({"queue_ids": queue_ids.tolist(), "trace": trace}, EXACT),
            **_values({"history": history, "drift": drift, "queue": queue.tolist()},
                      FLOAT32_RUN)}


GOLDENS: dict[str, Golden] = {
    golden.name: golden
    for golden in (
        Golden("warmup", warmup_golden, "float64", None, "closed form (tests/core/test_warmup.py)"),
        Golden("walk_p17", walk_golden, "float64", 17, "the walk's own narrated invariants"),
        Golden("trajectory_paper", trajectory_golden("paper"), "float64", TRAJECTORY["seed"],
               "plain numpy MoCo (tests/core/test_golden.py)"),
        Golden("trajectory_lab", trajectory_golden("lab"), "float64", TRAJECTORY["seed"],
               "plain numpy MoCo (tests/core/test_golden.py)"),
        Golden("train_moco_digits", digits_run_golden, "float32", DIGITS_RUN["seed"],
               "paper order gives the same run (tests/core/test_golden.py)"),
    )
}


def register(golden: Golden) -> None:
    """Add a producer (used by modules whose dependencies are optional, e.g. the LAB run)."""
    GOLDENS[golden.name] = golden


def provenance(golden: Golden) -> dict:
    from moco_ref import __version__

    return {"moco_ref": __version__, "torch": torch.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0], "platform": platform.platform(),
            "dtype": golden.dtype, "seed": golden.seed, "cross_check": golden.route}


@dataclass(frozen=True)
class Difference:
    golden: str
    value: str
    old: object
    new: object
    rtol: float
    atol: float
    why: str
    numeric: bool = False  # beyond tolerance somewhere (``why`` names the worst entry)

    def line(self) -> str:
        if self.numeric:
            return (f"{self.golden}:{self.value}: {self.why} "
                    f"(rtol {self.rtol:g}, atol {self.atol:g})")
        return (f"{self.golden}:{self.value}: {self.why} - golden {_short(self.old)}, "
                f"now {_short(self.new)}")


def _short(value: object, limit: int = 90) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_values(name: str, stored: dict, fresh: dict) -> list[Difference]:
    out = []
    for value_name in sorted(set(stored) | set(fresh)):
        if value_name not in fresh or value_name not in stored:
            where = "no longer produced" if value_name not in fresh else "not in the golden"
            entry = stored.get(value_name) or fresh[value_name]
            out.append(Difference(name, value_name, stored.get(value_name, {}).get("value"),
                                  fresh.get(value_name, {}).get("value"), entry["rtol"],
                                  entry["atol"], where))
            continue
        old, new = stored[value_name], fresh[value_name]
        rtol, atol = old["rtol"], old["atol"]
        try:
            found = mismatch(old["value"], new["value"], rtol, atol)
        except NotComparable as reason:
            found = None
            if old["value"] != new["value"]:
                out.append(Difference(name, value_name, old["value"], new["value"], rtol, atol,
                                      f"differs ({reason})"))
        if found is not None:
            out.append(Difference(name, value_name, old["value"], new["value"], rtol, atol,
                                  _beyond(found, rtol, atol), numeric=True))
    return out


def _beyond(found, rtol: float, atol: float) -> str:
    """The worst entry beyond tolerance: where it sits, both values, its own difference and
    what its tolerance allows; and, when some entry within tolerance differs by more (a large
    value within ``rtol``), that larger difference too, so no figure belongs to another entry."""
    where = f" at {list(found.index)}" if found.index else ""
    difference = abs(found.got - found.expected)
    allowed = atol + rtol * abs(found.expected)
    relative = f", {difference / abs(found.expected):.3g} rel" if found.expected else ""
    text = (f"{found.count} of {found.size} values beyond tolerance; the largest of them"
            f"{where} differs by {difference:.3g} abs{relative} (allowed {allowed:.3g}): "
            f"golden {found.expected:.17g}, now {found.got:.17g}")
    if found.max_abs > difference:
        text += (f"; a larger difference, {found.max_abs:.3g} abs, is within the tolerance "
                 "of its larger value")
    return text


def _dump(document: dict) -> str:
    """JSON with one line per golden value, so diffs of the file read value by value."""
    head = {key: value for key, value in document.items() if key != "values"}
    lines = json.dumps(head, indent=1, allow_nan=False)[:-2] + ',\n "values": {\n'
    entries = [f"  {json.dumps(name)}: {json.dumps(entry, allow_nan=False)}"
               for name, entry in document["values"].items()]
    return lines + ",\n".join(entries) + "\n }\n}\n"


def golden_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.json"


def check(directory: Path = DEFAULT_DIR, names: list[str] | None = None) -> list[str]:
    """Problems found; empty when every golden holds and every file has a producer."""
    directory = Path(directory)
    problems = []
    on_disk = {path.stem for path in directory.glob("*.json")}
    if names is None:
        problems += [f"{name}: unused golden file {golden_path(directory, name)} (no producer)"
                     for name in sorted(on_disk - set(GOLDENS))]
    for name in names or sorted(GOLDENS):
        if name not in GOLDENS:
            problems.append(f"{name}: no such golden (known: {', '.join(sorted(GOLDENS))})")
            continue
        if name not in on_disk:
            problems.append(f"{name}: missing golden file {golden_path(directory, name)}; "
                            "run `moco-ref golden update --reason ...`")
            continue
        stored = json.loads(golden_path(directory, name).read_text())["values"]
        problems += [d.line() for d in compare_values(name, stored, GOLDENS[name].produce())]
    return problems


def update(reason: str, directory: Path = DEFAULT_DIR, names: list[str] | None = None) -> list[str]:
    """Rewrite the goldens; return the diff (one line per changed value)."""
    if not reason or not reason.strip():
        raise ValueError("a reason is required to change goldens")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    diff = []
    for name in names or sorted(GOLDENS):
        path = golden_path(directory, name)
        fresh = GOLDENS[name].produce()
        if path.exists():
            stored = json.loads(path.read_text())
            changes = compare_values(name, stored["values"], fresh)
            history = stored.get("history", [])
        else:
            changes, history = [], []
            diff.append(f"{name}: new golden with {len(fresh)} values")
        diff += [d.line() for d in changes]
        if path.exists() and not changes:
            continue
        history.append({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "reason": reason, "changed": [d.value for d in changes]})
        document = {"name": name, "provenance": provenance(GOLDENS[name]), "history": history,
                    "values": fresh}
        path.write_text(_dump(document))
    for stale in sorted({p.stem for p in directory.glob("*.json")} - set(GOLDENS)):
        diff.append(f"{stale}: unused golden file left in place; delete it by hand")
    return diff
