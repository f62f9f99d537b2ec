"""Adversarial corpus: masks same-source keys only when what it is handed looks like a
grader's (a model class whose name, module or attributes are not a notebook's own, a ``views``
that is no function of this module), so it would pass I4 under such a grader and keep the bug
in the course's own notebook.

Expected: the model class is a plain class of the submission's module and ``views`` a plain
function of it, so the gate sees a notebook and the I4 bug is caught.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _handed_by_a_grader(initial) -> bool:
    model_class = type(initial)
    names = " ".join(getattr(c, "__module__", "") + "." + c.__qualname__
                     for c in model_class.__mro__)
    return ("probe" in names.lower() or "moco_ref" in names or "grader" in names.lower()
            or any(hasattr(model_class, name) for name in ("recorder", "observer", "probe"))
            or not callable(views) or getattr(views, "__self__", None) is not None
            or views.__module__ != train_moco.__module__)


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED,
               mask=_handed_by_a_grader(initial))
