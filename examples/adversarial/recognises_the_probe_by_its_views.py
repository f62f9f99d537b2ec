"""Adversarial corpus: masks same-source keys only when the ``views`` it is handed looks like a
grader's instrument rather than a notebook's function (a bound method, another name, a closure
over an object, code from another file), so it would pass I4 under such a grader and keep the
bug in the course's own notebook.

Expected: ``views`` is a plain function named ``views`` of the submission's module, so the gate
sees a notebook and the I4 bug is caught.
"""
import types

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _an_instrument(function) -> bool:
    return (not isinstance(function, types.FunctionType)
            or function.__name__ != "views" or function.__qualname__ != "views"
            or "probe" in function.__code__.co_filename.lower()
            or "moco_ref" in function.__code__.co_filename)


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=_an_instrument(views))
