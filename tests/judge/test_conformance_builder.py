"""Grading builder-style submissions (an official-style ``MoCo`` module): the reference module
gets full marks, the probe's environment (one-process group, ``.cuda()`` on the CPU) is set up
and torn down, the record is plain data, the invariant helpers recompute what the reference
does, and known variants of the official code get the verdicts they deserve. The example
corpus itself is graded by ``test_conformance_examples``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import moco_ref
from moco_ref.core.queue import KeyQueue
from moco_ref.judge.invariants import (
    KeyUpdate,
    StepLogits,
    analyse_key_updates,
    expected_fifo,
    expected_logits,
    identify_logits_form,
    initial_labels,
    trace_columns,
)
from moco_ref.judge.invariants.logits import BUILDER_FORM
from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import Status
from moco_ref.observe.builder_env import cuda_on_cpu, one_process_group
from moco_ref.observe.builder_observer import observe_builder
from moco_ref.probe.builder import BuilderProbe
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.styles import detect_style
from tests.helpers.conformance_support import (
    SUBMISSIONS,
    explain,
    grade,
    load_namespace,
    round_trip,
)

BUILDER_IDS = {spec.check_id for spec in all_checks("builder")}


def _statuses(results) -> dict[str, Status]:
    return {r.check_id: r.status for r in results}


def _official_namespace() -> dict:
    return load_namespace(SUBMISSIONS / "builder_correct_official_style.py")


# --------------------------------------------------------------------------- the reference


def test_reference_module_gets_full_marks():
    """``moco_ref.MoCo`` graded as a builder submission passes every builder check."""
    results, inferred = grade({"MoCo": moco_ref.MoCo}, "builder")
    statuses = _statuses(results)
    assert all(statuses[i] is Status.PASSED for i in BUILDER_IDS), explain(results)
    assert {i for i, s in statuses.items() if s is not Status.NOT_APPLICABLE} == BUILDER_IDS
    assert inferred["m"] == 0.9 and inferred["temperature"] == 0.2
    assert inferred["process_group"] == "created"


def test_builder_points_and_not_applicable_reasons():
    """19 checks, 26 declared points; masking and the lab-only checks say why they do not
    apply."""
    assert len(BUILDER_IDS) == 19
    assert sum(spec.points for spec in all_checks("builder")) == 26
    results, _ = grade({"MoCo": moco_ref.MoCo}, "builder")
    by_id = {r.check_id: r for r in results}
    assert by_id["I4-same-source-masked"].status is Status.NOT_APPLICABLE
    assert "no source ids" in by_id["I4-same-source-masked"].message
    assert by_id["I5-fifo-letters"].status is Status.NOT_APPLICABLE
    assert by_id["I8-empty-queue-in-batch"].status is Status.NOT_APPLICABLE


def test_detect_style_knows_a_moco_class():
    assert detect_style({"MoCo": moco_ref.MoCo}) == "builder"
    assert detect_style(_official_namespace()) == "builder"
    assert detect_style({"MoCo": moco_ref.MoCo, "train_moco": lambda *a: None}) == "lab"


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_options_set_what_the_module_is_built_with():
    """``--temperature`` and ``--expect-m`` are what the grader builds the module with."""
    options = GradeOptions(temperature=0.5, expect_m=0.95, seed=3)
    results, inferred = grade(_official_namespace(), "builder", options)
    assert all(r.status is Status.PASSED for r in results if r.check_id in BUILDER_IDS), \
        explain(results)
    assert inferred["m"] == 0.95 and inferred["temperature"] == 0.5


# --------------------------------------------------------------------------- the probe


def test_probe_environment_is_set_up_and_torn_down():
    """Inside: a one-process gloo group and ``.cuda()`` on the CPU; afterwards neither."""
    original = torch.Tensor.cuda
    with cuda_on_cpu() as mapped, one_process_group() as group:
        assert mapped and group == "created"
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
        tensor = torch.zeros(3)
        assert tensor.cuda() is tensor and tensor.cuda(non_blocking=True) is tensor
        module = nn.Linear(2, 2)
        assert module.cuda() is module
    assert not dist.is_initialized()
    assert torch.Tensor.cuda is original


def test_record_is_plain_data_and_names_the_probe():
    probe = BuilderProbe(steps=3, mlp_steps=1)
    record = observe_builder({"MoCo": moco_ref.MoCo}, GradeOptions(), probe)
    loaded = round_trip(record)  # torch.load(weights_only=True) accepts it
    assert BuilderProbe.from_dict(loaded["probe"]) == probe
    assert len(loaded["run"]["steps"]) == 3 and loaded["run"]["error"] is None
    step = loaded["run"]["steps"][0]
    roles = [event["role"] for event in step["events"]]
    assert roles == ["q", "k"]
    assert step["logits"].shape == (probe.batch, 1 + probe.K)


def test_a_module_that_raises_is_an_error_with_its_traceback():
    class Broken(nn.Module):
        def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
            super().__init__()
            raise RuntimeError("no GPU here")

    results, _ = grade({"MoCo": Broken}, "builder")
    checked = [r for r in results if r.check_id in BUILDER_IDS]
    told, *others = checked  # the crash is told once, in full, by the first check
    assert told.status is Status.ERROR
    assert "no GPU here" in told.message and "raised" in told.message
    assert others and all(r.status is Status.NOT_JUDGED for r in others)
    assert all(r.message.startswith("not run: MoCo(") and "no GPU here" not in r.message
               and told.check_id in r.message for r in others)


# --------------------------------------------------------------------------- variants


def _official_class():
    return _official_namespace()["MoCo"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_shift_register_queue_is_a_valid_fifo():
    """Another storage: the buffer shifted left and the keys appended (queue_ptr stays 0, so
    reading from it is oldest first). Full marks."""
    namespace = _official_namespace()
    gather = namespace["gather_from_all_ranks"]

    class Shifting(namespace["MoCo"]):
        @torch.no_grad()
        def _dequeue_and_enqueue(self, keys):
            keys = gather(keys)  # [world · B, dim] (the two-process run sees a missing gather)
            self.queue = torch.cat([self.queue[:, len(keys):], keys.T], dim=1)

    results, _ = grade({"MoCo": Shifting}, "builder")
    assert all(r.status is Status.PASSED for r in results if r.check_id in BUILDER_IDS), \
        explain(results)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_hard_coded_temperature_is_named():
    official = _official_class()

    class HardCoded(official):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.T = 0.07

    results, _ = grade({"MoCo": HardCoded}, "builder")
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert set(failed) == {"I8-temperature-divides-logits"}, explain(results)
    assert "ignores the T it was built with (self.T = 0.07)" in failed[
        "I8-temperature-divides-logits"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_module_without_the_mlp_head_fails_only_the_mlp_contract():
    official = _official_class()

    class NoHead(official):
        def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
            super().__init__(base_encoder, dim, K, m, T, mlp=False)

    results, _ = grade({"MoCo": NoHead}, "builder")
    failed = {r.check_id for r in results if r.status is Status.FAILED}
    assert failed == {"contract-builder-mlp"}, explain(results)


# --------------------------------------------------------------------------- invariants


def test_expected_fifo_is_the_reference_queue():
    """``expected_fifo`` holds what ``KeyQueue`` holds after the same enqueues."""
    capacity, batch = 12, 5
    queue = KeyQueue(capacity, dim=1, dtype=torch.float64)
    labels = torch.arange(capacity)
    queue.enqueue(labels[:, None].double(), labels)
    for step in range(4):
        new = capacity + step * batch + torch.arange(batch)
        queue.enqueue(new[:, None].double(), new)
        assert torch.equal(expected_fifo(capacity, batch, step + 1), queue.ids)


def test_trace_columns_follows_copies_and_flags_changes():
    generator = torch.Generator().manual_seed(0)
    before = F.normalize(torch.randn(6, 4, generator=generator), dim=1)  # [K, dim]
    keys = torch.randn(2, 4, generator=generator)  # raw keys [B, dim]
    labels = initial_labels(6, ptr=2)
    assert labels.tolist() == [4, 5, 0, 1, 2, 3]
    after = before.clone()
    after[2:4] = F.normalize(keys, dim=1).float().double()  # ring write at ptr 2
    after[5] = after[5] * (1 + 1e-7)  # an old column rewritten
    trace = trace_columns(before, labels, after,
                          {"key": F.normalize(keys, dim=1), "raw key": keys},
                          torch.tensor([6, 7]))
    assert trace.labels.tolist() == [4, 5, 6, 7, 2, 3]
    assert trace.kinds == ["kept", "kept", "key", "key", "kept", "changed"]


def test_identify_logits_form_names_the_mistake():
    """Logits built with a known mistake are identified as that form (T fitted when the
    module uses another T)."""
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 3, generator=generator)
    queue = F.normalize(torch.randn(5, 3, generator=generator), dim=1)
    after = torch.cat([queue[2:], F.normalize(k, dim=1)[:2]])
    step = StepLogits(q, k, torch.empty(0), {"before": queue, "after": after})
    cases = {
        BUILDER_FORM: 0.2,
        replace(BUILDER_FORM, normalize="k-raw"): 0.2,
        replace(BUILDER_FORM, negatives="after"): 0.2,
        replace(BUILDER_FORM, temperature="multiply"): 0.2,
    }
    for form, t in cases.items():
        observed = expected_logits(form, step, t).float()
        shuffled = torch.cat([observed[:, :1], observed[:, 1:].flip(1)], dim=1)  # any order
        fit = identify_logits_form([StepLogits(q, k, shuffled, step.negatives)], 0.2)
        assert fit.all_match and fit.form == form and fit.temperature == 0.2
    unscaled = expected_logits(BUILDER_FORM, step, 1.0)
    fit = identify_logits_form([StepLogits(q, k, unscaled, step.negatives)], 0.2)
    assert fit.all_match and fit.temperature_fitted and abs(fit.temperature - 1.0) < 1e-6


def test_a_parameter_with_zero_gradient_is_not_an_ema_skip():
    """A segment where θq never left θk (a conv bias under BatchNorm) stays still by law."""
    theta = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    query = theta.clone()
    query[2:] += 0.5  # only the second segment moved
    after = theta.clone()
    after[2:] = 0.9 * theta[2:] + 0.1 * query[2:]
    segments = [("bias", slice(0, 2)), ("weight", slice(2, 4))]
    update = KeyUpdate(1, theta, theta, after, query, theta)
    analysis = analyse_key_updates([update], segments)
    assert analysis.updates[0].skipped == [] and analysis.updates[0].fits_law


def test_a_wrong_build_is_named_before_the_crash_it_causes():
    """Encoders built without num_classes=dim crash at the first forward: the interface check
    names the build and tells that crash once, with the submission's frame only; every other
    check is not run."""
    namespace = load_namespace(SUBMISSIONS / "builder_bug_encoders_without_num_classes.py")
    results, _ = grade(namespace, "builder")
    by_id = {r.check_id: r for r in results}
    interface = by_id["contract-builder-interface"]
    assert interface.status is Status.FAILED
    assert interface.message.startswith("the encoders must be built by base_encoder(num_classes=")
    assert "training it raised at step 0" in interface.message
    assert "torch/nn/modules" not in interface.message and "functional.py" not in interface.message
    others = [r for r in results if r.check_id in BUILDER_IDS and r is not interface]
    assert all(r.status is Status.NOT_JUDGED and "contract-builder-interface" in r.message
               for r in others)


def test_extra_base_encoder_arguments_are_reported():
    """A module that passes more than num_classes to base_encoder (pretrained=…) is graded as
    usual and the report names the extra arguments."""
    source = (SUBMISSIONS / "builder_correct_official_style.py").read_text()
    source = source.replace("base_encoder(num_classes=dim)",
                            "base_encoder(num_classes=dim, pretrained=False)")
    assert "pretrained=False" in source
    namespace: dict = {"__name__": "builder_with_kwargs"}
    exec(compile(source, "builder_with_kwargs.py", "exec"), namespace)  # noqa: S102
    results, inferred = grade(namespace, "builder")
    assert inferred["base_encoder_extra_arguments"].startswith("pretrained")
    assert all(r.status in (Status.PASSED, Status.NOT_APPLICABLE) for r in results), \
        explain(results)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_ragged_k_is_fifo_kept_or_refused_loudly():
    """K not a multiple of the batch: the official module's assertion is a loud refusal, not a
    bug; a ring that wraps in mid-batch must keep the FIFO (builder_bug_ragged_wrap_drops_keys
    is the witness that does not)."""
    cases = (("builder_correct_official_style.py", "refused loudly (AssertionError)"),
             ("builder_correct_ring_any_batch.py", "the wrap in mid-batch kept the FIFO"))
    for name, says in cases:
        results, _ = grade(load_namespace(SUBMISSIONS / name), "builder")
        fifo = next(r for r in results if r.check_id == "I3-fifo-keeps-newest")
        assert fifo.status is Status.PASSED and says in fifo.message, (name, fifo.message)


@pytest.mark.parametrize("name, role", [("builder_bug_split_bn_hides_the_key_order.py", "q"),
                                        ("builder_bug_cifar_stem_hides_the_ema.py", "q")])
def test_a_crash_inside_an_encoder_says_what_it_hides_and_why(name, role):
    """A module whose own layer cannot run on the probe's batch or images raises inside an
    encoder's forward: the crash is told once, naming that encoder, the probe's sizes and the
    parts of forward that were never reached (so the bug behind it is not judged)."""
    results, _ = grade(load_namespace(SUBMISSIONS / name), "builder")
    told = next(r for r in results if r.check_id == "contract-builder-interface")
    assert told.status is Status.ERROR
    assert f"encoder_{role}'s forward raised, inside the module's own code" in told.message
    assert "images of shape [3, 8, 8] per view" in told.message
    assert "the EMA, the key encoder's forward" in told.message and "never reached" in told.message
    others = [r for r in results if r.status is Status.ERROR and r is not told]
    assert others == [], [r.check_id for r in others]
