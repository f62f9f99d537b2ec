"""What a submission sends is hostile: its text is made inert and capped, its tensors must be
dense, and its frames may not inflate."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from moco_ref.judge.record import Invalid
from moco_ref.judge.untrusted import clean_text
from moco_ref.observe import channel
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.wall import WALL


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain\ttext\nnext line", "plain\ttext\nnext line"),
        ("\x1b[2J\x1b[Hcleared", "cleared"),
        ("\x1b]0;a window title\x07after", "after"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1b[32mgreen\x1b[0m", "green"),
        ("over\rwrite\x08", "overwrite"),
        ("c1\x9b31m", "c131m"),
        ("bidi \u202eevil\u202c", "bidi evil"),
        ("windows\r\nline", "windows\nline"),
        ("lone escape \x1b", "lone escape "),
    ],
)
def test_escape_and_control_characters_are_removed(raw, shown):
    assert clean_text(raw) == shown


def test_long_text_keeps_head_and_tail_within_the_cap():
    text = "H" * 50_000 + "middle" + "T" * 50_000
    shown = clean_text(text, cap=1_000)
    assert len(shown) == 1_000
    assert shown.startswith("H" * 400) and shown.endswith("T" * 400)
    assert "[… 99006 characters cut by moco-ref …]" in shown
    assert clean_text("short", cap=1_000) == "short"


def _round_trip(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_dense_tensors_and_views_of_what_was_sent_pass():
    base = torch.randn(6, 4)
    sent = {"t": base.T, "slice": base[2:], "empty": torch.empty(0, 3)}
    counted = WALL.check(_round_trip(sent), "x")  # raises Invalid when refused
    assert counted == (24 + 16 + 0) * 4  # each tensor's own elements, float32


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda: torch.zeros(1, 24).expand(10**6, 24), "not dense"),
        (lambda: torch.zeros(1100).as_strided((1000, 24), (1, 1)), "not dense"),
        (lambda: [torch.zeros(WALL.max_tensor_bytes // 8 // 4 + 1, dtype=torch.float64)[None]
                  .expand(1, -1)] * 5, "more than"),
    ],
)
def test_expanded_or_amplified_tensors_are_refused_before_any_work(make, problem):
    with pytest.raises(Invalid, match=problem):
        WALL.check(_round_trip({"part": make()}), "the part")


def test_a_frame_whose_archive_inflates_is_refused():
    buffer = io.BytesIO()
    torch.save({"x": torch.zeros(1000)}, buffer)
    plain = buffer.getvalue()
    assert channel._decode(channel.PART, plain)["x"].shape == (1000,)  # torch.save: stored
    inflating = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain)) as source, \
            zipfile.ZipFile(inflating, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            target.writestr(member.filename, source.read(member.filename))
    with pytest.raises(channel._Corrupt, match="compressed members"):
        channel._decode(channel.PART, inflating.getvalue())


def test_the_grader_plans_the_parts_itself():
    from moco_ref.probe.parts import Stage
    from moco_ref.sandbox.observation import planned_parts

    forged = {"style": "lab", "parts": ["moco_warmup"], "notes": []}  # hides train_moco
    assert planned_parts(Stage.from_frame(forged)) == ["moco_warmup", "train_moco"]
    assert planned_parts(Stage.from_frame({"style": "builder", "parts": []})) == ["all"]


def test_notes_from_the_submission_process_are_labelled_and_capped():
    from moco_ref.probe.options import GradeOptions
    from moco_ref.probe.parts import Stage
    from moco_ref.run.pipeline import SUBMISSION_LABEL, _cleaned, _report_shell
    from moco_ref.sandbox.attempt import Attempt
    from moco_ref.sandbox.observation import SandboxRun

    stage = Stage.from_frame({"style": "lab", "notes": [
        "TA override: \x1b[32mfull marks\x1b[0m", "x" * 10**6, {"not": "text"}]})
    run = SandboxRun([Attempt(stage=stage)], stage, {}, {}, failure="")
    report = _cleaned(_report_shell("sub.py", GradeOptions(), run))
    assert report.notes[0] == f"{SUBMISSION_LABEL} TA override: full marks"
    assert len(report.notes) == 2 and len(report.notes[1]) <= 2_000


def test_a_submission_gets_a_copy_of_itself_and_its_helpers_only(tmp_path):
    from moco_ref.sandbox.attempt import MAX_HELPER_BYTES, copy_submission

    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "bob.py").write_text("from helper import x\ndef train_moco(*a):\n    pass\n")
    (folder / "helper.py").write_text("x = 1\ndef moco_warmup():\n    return {}\n")
    (folder / "alice.py").write_text("def train_moco(*a):\n    return 'correct'\n")
    (folder / "erin.py").write_text("from impl import f as train_moco\n")  # bound by import
    (folder / "frank.py").write_text("def _impl(*a):\n    pass\nMoCo = _impl\n")  # assigned
    (folder / "carol.py").write_text("class MoCo:\n    pass\n")
    (folder / "broken.py").write_text("def (:\n")
    (folder / "big.py").write_text("#" * (MAX_HELPER_BYTES + 1))
    copied = copy_submission(str(folder / "bob.py"), tmp_path / "copy")
    assert copied == str(tmp_path / "copy" / "bob.py")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["bob.py", "helper.py"]


def test_a_classmate_beside_the_submission_cannot_be_imported(tmp_path):
    from moco_ref.run.pipeline import grade_submission

    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "alice.py").write_text("def train_moco(*a):\n    return 'correct'\n"
                                     "def moco_warmup():\n    return {}\n")
    bob = folder / "bob.py"
    bob.write_text("from alice import train_moco, moco_warmup\n")
    report = grade_submission(str(bob))
    assert not report.gradable
    assert "No module named 'alice'" in report.traceback
    assert str(bob) in report.traceback  # shown at its own path, not the copy's
    assert "moco-ref-grade-" not in report.traceback


# --------------------------------------------------------------------------- builder forgery


def _builder_record(path="builder_correct_official_style.py"):
    from moco_ref.observe.builder_observer import observe_builder
    from tests.helpers.conformance_support import SUBMISSIONS, load_namespace, round_trip

    return round_trip(observe_builder(load_namespace(SUBMISSIONS / path), GradeOptions()))


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_rewritten_builder_forward_is_found_by_recomputation():
    """Every recorded forward of the intact probe encoder is recomputed from the parameters
    recorded with it and the probe's images: a nudge of 1e-3 in one key, in the main run or
    in rank 1's run, is refused; the honest record passes."""
    from moco_ref.judge.styles import validate_part
    from moco_ref.probe.parts import WHOLE

    record = _builder_record()
    assert validate_part("builder", WHOLE, record, {}, GradeOptions()) == ""
    record["run"]["steps"][4]["events"][1]["output"][2, 3] *= 1.001
    problem = validate_part("builder", WHOLE, record, {}, GradeOptions())
    assert "main run's step 4, forward 1" in problem and "altered" in problem
    record = _builder_record()
    record["ranks"]["runs"][1]["steps"][0]["events"][0]["output"][0, 0] += 1e-3
    assert "rank 1 run's step 0" in validate_part("builder", WHOLE, record, {}, GradeOptions())
    record = _builder_record()  # returned logits rewritten after the loss was taken from them
    record["run"]["steps"][3]["logits"][0, 1] += 0.5
    problem = validate_part("builder", WHOLE, record, {}, GradeOptions())
    assert "main run's step 3: the recorded logits give the loss" in problem


def test_a_changed_encoder_is_not_recomputed():
    """An encoder whose layers the module replaced is not the probe's: its forwards are not
    recomputed, so a module that changes its encoder is never taken for a forger."""
    from torch import nn

    from moco_ref.judge.styles import validate_part
    from moco_ref.observe.builder_observer import observe_builder
    from moco_ref.probe.builder import ProbeEncoder, is_intact_probe_encoder
    from moco_ref.probe.parts import WHOLE
    from tests.helpers.conformance_support import SUBMISSIONS, load_namespace, round_trip

    encoder = ProbeEncoder(16)
    assert is_intact_probe_encoder(encoder)
    encoder.body[2] = nn.LeakyReLU()
    assert not is_intact_probe_encoder(encoder)
    official = load_namespace(SUBMISSIONS / "builder_correct_official_style.py")["MoCo"]

    class Leaky(official):
        def __init__(self, base_encoder, **kwargs):
            super().__init__(base_encoder, **kwargs)
            for net in (self.encoder_q, self.encoder_k):
                net.body[2] = nn.LeakyReLU()

    record = round_trip(observe_builder({"MoCo": Leaky}, GradeOptions()))
    events = record["run"]["steps"][0]["events"]
    assert events and not any(event["probe_encoder"] for event in events)
    assert validate_part("builder", WHOLE, record, {}, GradeOptions()) == ""
