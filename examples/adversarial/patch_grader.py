"""Adversarial: a buggy submission (no same-source mask: I4) that rewrites the grader's
code so that every later submission gets full marks: it opens for writing every ``.py`` file
of the moco_ref package it can find — the observer it was loaded with, and any ``judge`` or
``grade`` module on ``sys.path`` — and tries to drop a ``sitecustomize.py`` and a ``.pth``
file into every ``site-packages`` it sees. (It proves the access and writes nothing, so that
running the corpus with ``--isolation processes`` damages nothing.)

Expected: fails I4 exactly; nothing is changed (the grader's code is not in its file
system except the observer, read-only) and a classmate graded afterwards keeps full marks.
"""
import glob
import os
import sys

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
PAYLOAD = "\n# patched by a submission\nFULL_MARKS = True\n"


def views(batch):
    return batch


def attack():
    roots = {os.path.dirname(os.path.dirname(module.__file__))
             for name, module in list(sys.modules.items())
             if name.startswith("moco_ref") and getattr(module, "__file__", None)}
    for entry in sys.path:
        roots.update(glob.glob(os.path.join(entry or ".", "moco_ref")))
    changed, seen = [], 0
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
            seen += 1
            try:
                with open(path, "a"):  # would append PAYLOAD
                    pass
                changed.append(path)
            except OSError:
                pass
    for site in [p for p in sys.path if p.endswith("site-packages")]:
        for name, text in (("sitecustomize.py", PAYLOAD), ("zzz-moco.pth", "import os\n")):
            try:
                with open(os.path.join(site, name), "x") as handle:
                    handle.write(text)
                os.remove(os.path.join(site, name))
                changed.append(os.path.join(site, name))
            except OSError:
                pass
    judge = [name for name in sys.modules if name.startswith("moco_ref.judge")]
    print(f"ATTACK grader files seen: {seen}; writable: {len(changed)}; judge modules: "
          f"{len(judge)}")


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
