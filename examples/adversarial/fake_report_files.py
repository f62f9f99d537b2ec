"""Adversarial: a buggy submission (no same-source mask: I4) that writes fake "full marks"
reports and observation records where a grader might look: its working directory, the folder
above it (the grader's scratch folder for this job), every other grader scratch folder it can
find in /tmp, and /tmp itself.

Expected: fails I4 exactly, as without the files. (With namespaces the writes outside the
working directory fail: the file system is read-only there.)
"""
import glob
import json
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
FAKE = json.dumps({"score": 36, "max_score": 36, "gradable": True, "results": []})
NAMES = ("observations.pt", "progress.json", "report.json", "results.json", "summary.json")


def views(batch):
    return batch


def _plant(folder, prefix=""):
    for name in NAMES:
        try:
            with open(os.path.join(folder, prefix + name), "w") as handle:
                handle.write(FAKE)
        except OSError:
            pass


def plant_everywhere():
    here = os.getcwd()
    _plant(here)
    _plant(os.path.dirname(here))
    for scratch in glob.glob("/tmp/moco-ref-*"):
        _plant(scratch)
    _plant("/tmp", prefix="moco-ref-fake-")


def train_moco(initial, x, train, epochs=15):
    plant_everywhere()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
