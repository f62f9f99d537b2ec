"""The feedback pages and the class report, checked as a person would see them: a small class
of bundled examples graded with ``--feedback html``, each page parsed as HTML."""

from __future__ import annotations

import base64
import binascii
import json
import re
import shutil
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import rubric_from_mapping
from moco_ref.report import feedback, figures

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
CLASS = ("correct_lab_order.py", "bug_no_mask.py", "bug_queue_keeps_oldest.py",
         "bug_loss_summed.py")
WITH_FIGURE = ("bug_no_mask.py", "bug_queue_keeps_oldest.py", "bug_loss_summed.py")
GRADER_PATHS = re.compile(r"(?<![\w.])/(?:tmp|work|opt)(?:/|\b)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """What a reader meets on the page: its images, SVGs, score and text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[str] = []
        self.svgs = 0
        self.scripts = 0
        self.score: dict[str, str] | None = None
        self.attributes: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.attributes += [value or "" for value in attrs.values()]
        if tag == "img":
            self.images.append(attrs.get("src") or "")
        elif tag == "svg":
            self.svgs += 1
        elif tag == "script":
            self.scripts += 1
        elif tag == "link" or (tag == "a" and not (attrs.get("href") or "").startswith("#")):
            self.attributes.append("external-reference")
        if "score" in (attrs.get("class") or "").split():
            self.score = attrs


def png_of(src: str) -> bytes:
    assert src.startswith("data:image/png;base64,"), src[:60]
    try:
        return base64.b64decode(src.split(",", 1)[1], validate=True)
    except binascii.Error as exc:  # pragma: no cover - the assertion message
        raise AssertionError(f"an image that does not decode: {exc}") from exc


def assert_self_contained(text: str) -> Page:
    page = Page(text)
    assert "http://" not in text and "https://" not in text
    assert not GRADER_PATHS.search(text), GRADER_PATHS.search(text).group(0)
    assert page.scripts == 0
    assert "external-reference" not in page.attributes
    for src in page.images:
        assert png_of(src).startswith(PNG_MAGIC)
    return page


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback")
    folder, out = root / "class", root / "out"
    folder.mkdir()
    for name in CLASS:
        shutil.copy(EXAMPLES / name, folder / name)
    code = main(["grade", str(folder), "--out", str(out), "--feedback", "html", "-j", "2"])
    assert code == 1  # three of the four are below full marks
    return folder, out


def report_of(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text(encoding="utf-8"))["reports"][0]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_each_student_gets_a_self_contained_page_with_the_report_s_score(graded):
    _, out = graded
    for name in CLASS:
        path = out / f"{name}.feedback.html"
        text = path.read_text(encoding="utf-8")
        page = assert_self_contained(text)
        report = report_of(out, name)
        assert page.score is not None
        # the numbers read back from the page, not formatted by the code under test
        assert float(page.score["data-score"]) == pytest.approx(report["score"], abs=0.005)
        assert float(page.score["data-max-score"]) == pytest.approx(report["max_score"],
                                                                    abs=0.005)
        shown = re.search(r"Score: ([\d.]+) / ([\d.]+)", text)
        assert shown and [float(v) for v in shown.groups()] == pytest.approx(
            [report["score"], report["max_score"]], abs=0.005)
        assert f"<code>{name}</code>" in text  # the submission's file name, nothing more
        for result in report["results"]:
            if result["status"] == "failed":  # each failed check's verdict, with evidence
                assert result["check_id"] in text
                assert result["details"]["misconception"] in text
        if name in WITH_FIGURE:
            assert page.images or page.svgs or not figures.available(), name
            if not figures.available():
                assert feedback.NO_FIGURES in text
    assert not Page((out / "correct_lab_order.py.feedback.html").read_text()).images


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_loss_figure_comes_from_per_step_numbers(graded):
    _, out = graded
    failed = [r for r in report_of(out, "bug_loss_summed.py")["results"]
              if r["status"] == "failed"]
    details = failed[0]["details"]
    assert len(details["loss_reference"]) == len(details["loss_submission"]) > 1
    # summed, not averaged: each step's loss is its batch size (≥ 10 in any probe) times more
    assert all(s > 5 * r for r, s in zip(details["loss_reference"],
                                         details["loss_submission"]))
    mask = next(r for r in report_of(out, "bug_no_mask.py")["results"]
                if r["check_id"] == "I4-same-source-masked")["details"]
    assert mask["mask_rows"] and len(mask["mask_rows"]) == len(mask["mask_expected"]) <= 8


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_class_report_counts_what_summary_json_says(graded, tmp_path):
    _, out = graded
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    assert main(["class-report", str(out), "--html", str(html_path),
                 "--json", str(json_path)]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    data = json.loads(json_path.read_text(encoding="utf-8"))
    rows = summary["submissions"]
    assert data["submissions"] == len(rows) == len(CLASS)
    assert data["gradable"] == sum(row["gradable"] for row in rows)
    assert sum(b["count"] for b in data["scores"]["histogram"]) == data["gradable"]
    by_name = {s["submission"]: s["score"] for s in data["scores"]["by_submission"]}
    assert by_name == {row["submission"]: row["score"] for row in rows}
    for family in data["families"]:
        assert family["not_passed"] == sum(family["family"] in row["failed_families"]
                                           for row in rows)
    families = {f["family"]: f for f in data["families"]}
    assert families["I4"]["broken"] == 1 and families["I4"]["students"] == ["bug_no_mask.py"]
    sentences = {m["misconception"]: m for m in data["misconceptions"]}
    no_mask = sentences["same-source negatives were not masked"]
    assert no_mask["count"] == 1 and no_mask["example"] == "bug_no_mask.py"
    assert data["not_gradable"] == [] and data["timeouts"] == []
    text = html_path.read_text(encoding="utf-8")
    page = assert_self_contained(text)
    assert f'data-submissions="{len(rows)}"' in text
    assert len(page.images) == (2 if figures.available() else 0)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_single_file_gets_its_page_here_or_where_feedback_out_says(tmp_path, monkeypatch):
    shutil.copy(EXAMPLES / "bug_no_mask.py", tmp_path / "bug_no_mask.py")
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "pages" / "mine.md"
    assert main(["grade", "bug_no_mask.py", "--feedback", "md", "--feedback-out",
                 str(target)]) == 1
    text = target.read_text(encoding="utf-8")
    assert text.startswith("# Feedback on `bug_no_mask.py`")
    assert "same-source negatives were not masked" in text
    assert "http://" not in text and not GRADER_PATHS.search(text)
    for uri in re.findall(r"\]\((data:[^)]+)\)", text):
        assert png_of(uri).startswith(PNG_MAGIC)
    assert main(["grade", str(tmp_path), "--out", str(tmp_path / "o"), "--feedback", "html",
                 "--feedback-out", "x.html"]) == 2  # batch pages go into --out


def _report() -> SubmissionReport:
    loss = {"misconception": "the loss is summed over the batch instead of averaged",
            "steps": [0, 1], "loss_reference": [3.6, 3.5], "loss_submission": [216.0, 210.0]}
    return SubmissionReport(
        submission="/work/secret/place/alice.py", style="lab", gradable=True,
        results=[
            CheckResult("I8-loss-matches-recomputation", "the loss", "I8", 5.0, Status.FAILED,
                        "the loss is summed: /tmp/grader/x.py said so", loss),
            CheckResult("I3-fifo-keeps-newest", "fifo", "I3", 5.0, Status.PASSED, "ok"),
            CheckResult("I1-key-grads-none", "no key grads", "I1", 5.0, Status.FAILED,
                        "a secret check's message"),
        ])


def test_the_rubric_s_visibility_and_no_matplotlib(monkeypatch):
    rubric = rubric_from_mapping({"visibility": {"I1": "hidden",
                                                 "I8-loss-matches-recomputation":
                                                     "after_due_date"}})
    text = feedback.feedback_html(_report(), rubric)
    page = assert_self_contained(text)
    assert "a secret check's message" not in text and "I1-key-grads-none" not in text
    assert "1 check(s) the course keeps hidden" in text
    assert "(shown after the due date)" in text
    # before the release: the after-due-date check's evidence and figure are held back, and
    # the score counts only the checks shown (test_visibility has the whole rule)
    assert "the loss is summed" not in text and not page.images
    assert page.score["data-score"] == "5" and page.score["data-max-score"] == "5"
    released = replace(rubric, released=True)
    text = feedback.feedback_html(_report(), released)
    page = assert_self_contained(text)
    assert "a secret check's message" not in text and "I1-key-grads-none" not in text
    assert page.score["data-score"] == "5" and page.score["data-max-score"] == "15"
    assert "alice.py" in text and "the loss is summed" in text
    assert len(page.images) == (1 if figures.available() else 0)
    # a check that owns a choice of the loss (I4's mask) still hidden: the loss per step,
    # which would show its departures too, is drawn for nobody
    mask_hidden = replace(rubric_from_mapping({"visibility": {"I4": "hidden"}}), released=True)
    with_mask = _report()
    with_mask.results.append(CheckResult("I4-same-source-masked", "mask", "I4", 5.0,
                                         Status.PASSED, "ok"))
    assert not assert_self_contained(feedback.feedback_html(with_mask, mask_hidden)).images
    monkeypatch.setattr(figures, "available", lambda: False)
    text = feedback.feedback_html(_report(), released)
    assert not Page(text).images and feedback.NO_FIGURES in text
    markdown = feedback.feedback_markdown(_report(), released)
    assert feedback.NO_FIGURES in markdown and "/work" not in markdown


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_page_from_a_stored_report(graded):
    _, out = graded
    data = json.loads((out / "bug_queue_keeps_oldest.py.json").read_text(encoding="utf-8"))
    report = SubmissionReport.from_dict(data["reports"][0])
    page = assert_self_contained(feedback.render_feedback(report, "html"))
    assert len(page.images) == (1 if figures.available() else 0)
