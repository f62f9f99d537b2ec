"""Issue 38.1: what ``train_moco`` is handed looks like the course's own notebook run.

The images are LAB 07's kind of data (the digits' count, dtype and pixel range, compared with
scikit-learn's own digits), the ids range over the digits' index range, the model is a plain
class of the submission's module and ``views`` a plain function of it: no name a submission
can read off them says "probe", "recorder" or ``moco_ref``."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from moco_ref.observe.lab_probe import ProbeRecorder
from moco_ref.probe.cases import default_lab_probe
from moco_ref.probe.lab import ProbeNet, flat_parameters
from moco_ref.probe.options import probe_key_of

MODULE = "moco_submission"
PROBES = [default_lab_probe(0), default_lab_probe(0, probe_key_of("a course"))]


@pytest.fixture(scope="module", params=PROBES, ids=["default", "course"])
def recorder(request) -> ProbeRecorder:
    return ProbeRecorder(request.param, module=MODULE)


def _digits() -> torch.Tensor:
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    return torch.from_numpy(sklearn_datasets.load_digits().images).to(torch.float32)


def test_the_images_are_the_digits_kind(recorder):
    digits = _digits()  # [1797, 8, 8], integers 0..16
    x = recorder.images
    assert x.shape == (len(digits), 1, 8, 8) and x.dtype == torch.float32
    assert torch.equal(x, x.round()) and x.min() == 0 and x.max() == 16
    assert len(torch.unique(x.reshape(len(x), -1), dim=0)) == len(x)  # every image its own
    blank = float((x == 0).float().mean())
    assert abs(blank - float((digits == 0).float().mean())) < 0.08, blank
    assert abs(float(x.mean()) - float(digits.mean())) < 1.0, float(x.mean())


def test_training_ids_range_over_the_digits(recorder):
    train = recorder.train
    assert train.dtype == torch.int64 and len(set(train.tolist())) == len(train)
    assert int(train.min()) >= 0 and int(train.max()) < 1797
    assert int(train.max()) > 1500 and int(train.min()) < 300  # scattered, not a prefix


def _names(obj) -> str:
    return " ".join(str(getattr(obj, attribute, "")) for attribute in
                    ("__module__", "__qualname__", "__name__"))


def test_the_model_class_is_a_notebook_s_own(recorder):
    model = recorder.initial
    handed = type(model)
    assert handed.__module__ == MODULE and handed.__qualname__ == "Net"
    assert all(c.__module__.startswith(("torch", "builtins")) for c in handed.__mro__[1:])
    grader_words = ("probe", "recorder", "moco_ref", "observe", "grader")
    for name, value in vars(handed).items():
        assert not any(word in name.lower() for word in grader_words), name
        if isinstance(value, types.FunctionType):
            said = _names(value) + " " + value.__code__.co_filename
            assert not any(word in said.lower() for word in grader_words), said
    for attribute in ("recorder", "observer", "probe"):
        assert not hasattr(model, attribute)


def test_views_is_a_plain_function_of_the_submission_s_module(recorder):
    views = recorder.handed_views
    assert isinstance(views, types.FunctionType) and not hasattr(views, "__self__")
    assert (views.__module__, views.__qualname__, views.__name__) == (MODULE, "views", "views")
    assert "moco_ref" not in views.__code__.co_filename


def test_the_handed_model_computes_what_the_grader_recomputes(recorder):
    """The class handed over and the grader's ``ProbeNet`` build the same parameters under the
    same seed and give the same outputs; a deep copy of the handed one is still recorded."""
    with torch.random.fork_rng():
        torch.manual_seed(recorder.probe.seed + 5)
        reference = ProbeNet()
    assert torch.equal(flat_parameters(reference), recorder.initial_params)
    images = recorder.images[:5]
    before = len(recorder.instances)
    clone = copy.deepcopy(recorder.initial)
    assert len(recorder.instances) == before + 1
    got = clone(images)
    expected = reference(images)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
