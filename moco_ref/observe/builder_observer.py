"""The ``builder`` style's observer: every run of the submission's ``MoCo`` the judge reads.

In one process (a one-process ``torch.distributed`` group, ``.cuda()`` on the CPU): the main
run, a short ``mlp=True`` run and a ragged run (K not a multiple of the batch), each built and
trained by ``builder_probe``, and a short run at the constructor's own defaults
(``builder_defaults``). Then, outside that group, the two-process run of
``builder_ranks``, sized for a symmetric module when the main run's forward gave two pairs
(both views' keys enter the queue). Nothing here judges.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from moco_ref.observe.builder_defaults import run_at_defaults
from moco_ref.observe.builder_env import cuda_on_cpu, one_process_group
from moco_ref.observe.builder_probe import CONSTRUCTOR_EXTRAS, run_builder
from moco_ref.observe.builder_ranks import observe_ranks
from moco_ref.probe.builder import (
    BuilderProbe,
    default_builder_probe,
    is_symmetric_run,
    ragged_probe,
)
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.schema import BuilderRecord
from moco_ref.probe.styles import BUILDER_CLASS, builder_class_name, moco_like_class_name
from moco_ref.probe.threads import one_thread


def observe_builder(namespace: dict, options: GradeOptions,
                    probe: BuilderProbe | None = None) -> BuilderRecord:
    """Build and train the submission's ``MoCo`` under the probe (plain-data record)."""
    probe = probe or default_builder_probe(options)
    classes = [name for name, value in namespace.items() if isinstance(value, type)]
    moco_class = namespace.get(options.builder_class or builder_class_name(classes)
                               or moco_like_class_name(namespace) or BUILDER_CLASS)
    record: BuilderRecord = {"probe": probe.to_dict(), "defined": isinstance(moco_class, type)}
    if not record["defined"]:
        record["error"] = "MoCo is not defined (a builder submission defines a class MoCo)"
        return record
    record["error"] = None
    CONSTRUCTOR_EXTRAS.clear()
    CONSTRUCTOR_EXTRAS.update(dict(options.init_kwargs))
    with one_thread(), torch.random.fork_rng(devices=[]), cuda_on_cpu() as mapped, \
            one_process_group() as group:
        record["environment"] = {"process_group": group, "cuda_on_cpu": mapped}
        record["run"] = run_builder(moco_class, probe)
        record["mlp"] = run_builder(moco_class, replace(probe, steps=probe.mlp_steps), mlp=True)
        record["ragged"] = run_builder(moco_class, ragged_probe(probe))
        record["defaults"] = run_at_defaults(moco_class, probe)
    if record["environment"]["process_group"] == "created":
        with one_thread(), torch.random.fork_rng(devices=[]), cuda_on_cpu():
            record["ranks"] = observe_ranks(moco_class, probe,
                                            symmetric=is_symmetric_run(record["run"]))
    return record
