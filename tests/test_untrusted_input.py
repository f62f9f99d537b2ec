"""What a submission sends is hostile: its text is made inert and capped, its tensors must be
dense, and its frames may not inflate."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from moco_ref.judge.record import MAX_PART_TENSOR_BYTES, Invalid, _dense
from moco_ref.judge.untrusted import clean_text
from moco_ref.observe import channel


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
    _dense(_round_trip({"t": base.T, "slice": base[2:], "empty": torch.empty(0, 3)}), "x", [0])


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda: torch.zeros(1, 24).expand(10**6, 24), "not dense"),
        (lambda: torch.zeros(1100).as_strided((1000, 24), (1, 1)), "not dense"),
        (lambda: [torch.zeros(MAX_PART_TENSOR_BYTES // 8 // 4 + 1, dtype=torch.float64)[None]
                  .expand(1, -1)] * 5, "more than"),
    ],
)
def test_expanded_or_amplified_tensors_are_refused_before_any_work(make, problem):
    with pytest.raises(Invalid, match=problem):
        _dense(_round_trip({"part": make()}), "the part", [0])


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
    from moco_ref.sandbox.observation import planned_parts

    forged = {"style": "lab", "parts": ["moco_warmup"], "notes": []}  # hides train_moco
    assert planned_parts(forged) == ["moco_warmup", "train_moco"]
    assert planned_parts({"style": "builder", "parts": []}) == ["all"]


def test_notes_from_the_submission_process_are_labelled_and_capped():
    from moco_ref.grade import SUBMISSION_LABEL, _cleaned, _report_shell
    from moco_ref.observe.options import GradeOptions
    from moco_ref.sandbox.attempt import Attempt
    from moco_ref.sandbox.observation import SandboxRun

    stage = {"style": "lab", "notes": ["TA override: \x1b[32mfull marks\x1b[0m", "x" * 10**6,
                                       {"not": "text"}]}
    run = SandboxRun([Attempt(stage=stage)], stage, {}, {}, failure="")
    report = _cleaned(_report_shell("sub.py", GradeOptions(), run))
    assert report.notes[0] == f"{SUBMISSION_LABEL} TA override: full marks"
    assert len(report.notes) == 2 and len(report.notes[1]) <= 2_000
