"""The class report: what a batch of graded submissions says about the class.

``class_report(out)`` reads a batch output folder (``OUT/summary.json`` and each submission's
``OUT/<stem>.json`` report, format ``moco-ref-grade/1``) and gives, as one JSON-ready dict:

- ``scores``: every submission's score (from ``summary.json``), their mean and median, and a
  histogram of the gradable ones in tenths of the maximum;
- ``families``: per invariant family, how many students *broke* it (a failed check in it:
  a student counts once per family however many of its checks failed) and how many did not
  pass it (failed, error, timeout or not judged: ``summary.json``'s ``failed_families``);
- ``misconceptions``: the diagnosed misconceptions of failed checks
  (``details.misconception``), most common first, each with how many students, the checks
  that diagnosed it and one example student;
- ``not_gradable`` and ``timeouts``: the submissions of those statuses.

``class_report_html`` renders it as a self-contained page (figures inlined, see
``moco_ref.report.figures``). The class report is for the course's staff: it names
submissions by their names in the batch (never a path of the grading machine).
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path

from moco_ref.judge.registry import FAMILIES
from moco_ref.report import figures
from moco_ref.report.scoring import points_str

CLASS_REPORT_FORMAT = "moco-ref-class-report/1"
BINS = [(10.0 * i, 10.0 * (i + 1)) for i in range(10)]


class ClassReportError(ValueError):
    """An output folder the class report cannot read, said in one line."""


def _report_file(out: Path, submission: str) -> Path:
    return out / (submission.replace("/", "__").replace("\\", "__") + ".json")


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ClassReportError(f"{path.name}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ClassReportError(f"{path.name}: not JSON ({exc})") from None


def _percent(row: dict) -> float:
    maximum = float(row.get("max_score") or 0.0)
    return 100.0 * float(row.get("score") or 0.0) / maximum if maximum else 0.0


def _in_bin(value: float, index: int) -> bool:
    low, high = BINS[index]
    return low <= value < high or (index == len(BINS) - 1 and value == high)


def class_report(out) -> dict:
    """The class report of the batch output folder ``out`` (see the module docstring)."""
    out = Path(out)
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        raise ClassReportError(f"{out} has no summary.json: give the --out folder of "
                               "`moco-ref grade`")
    summary = _load(summary_path)
    rows = summary.get("submissions")
    if not isinstance(rows, list):
        raise ClassReportError("summary.json has no list of submissions")
    names = [str(row.get("submission", "")) for row in rows]
    statuses = {name: row.get("status", "graded" if row.get("gradable") else "not gradable")
                for name, row in zip(names, rows)}
    gradable = [row for row in rows if row.get("gradable")]
    percents = [_percent(row) for row in gradable]
    scores = [float(row.get("score") or 0.0) for row in rows]

    broken: dict[str, set[str]] = {}
    not_passed: dict[str, set[str]] = {}
    misconceptions: dict[str, dict] = {}
    missing: list[str] = []
    for name, row in zip(names, rows):
        for family in row.get("failed_families", []):
            not_passed.setdefault(family, set()).add(name)
        path = _report_file(out, name)
        if not path.is_file():
            missing.append(name)
            continue
        data = _load(path)
        reports = data.get("reports") or [{}]
        for result in reports[0].get("results", []):
            if result.get("status") != "failed":
                continue
            broken.setdefault(result.get("family", "?"), set()).add(name)
            details = result.get("details") or {}
            sentence = details.get("misconception") or result.get("message", "").split(
                ":", 1)[0].strip()
            if not sentence:
                continue
            entry = misconceptions.setdefault(sentence, {
                "misconception": sentence, "students": [], "checks": [],
                "family": result.get("family", "?")})
            if name not in entry["students"]:
                entry["students"].append(name)
            if result.get("check_id") not in entry["checks"]:
                entry["checks"].append(result.get("check_id"))
    order = {family: i for i, family in enumerate(FAMILIES)}
    families = sorted(set(broken) | set(not_passed), key=lambda f: (order.get(f, 99), f))
    common = sorted(misconceptions.values(), key=lambda m: (-len(m["students"]),
                                                            m["misconception"]))
    return {
        "format": CLASS_REPORT_FORMAT,
        "summary_format": summary.get("format"),
        "grader": summary.get("grader"),
        "submissions": len(rows),
        "gradable": len(gradable),
        "scores": {
            "by_submission": [
                {"submission": name, "score": float(row.get("score") or 0.0),
                 "max_score": float(row.get("max_score") or 0.0), "status": statuses[name]}
                for name, row in zip(names, rows)],
            "mean": statistics.fmean(scores) if scores else None,
            "median": statistics.median(scores) if scores else None,
            "full_marks": sum(1 for row in gradable
                              if float(row.get("score") or 0) + 1e-9 >= float(
                                  row.get("max_score") or 0) and not row.get("failed_checks")),
            "histogram": [{"from_percent": low, "to_percent": high,
                           "count": sum(1 for p in percents if _in_bin(p, i))}
                          for i, (low, high) in enumerate(BINS)],
        },
        "families": [{"family": family, "broken": len(broken.get(family, ())),
                      "not_passed": len(not_passed.get(family, ())),
                      "students": sorted(broken.get(family, ()))} for family in families],
        "misconceptions": [{**entry, "count": len(entry["students"]),
                            "example": entry["students"][0]} for entry in common],
        "not_gradable": [name for name in names if statuses[name] == "not gradable"],
        "timeouts": [name for name in names if statuses[name] == "timeout"],
        "missing_reports": missing,
    }


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}"></figure>'


_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111;
       max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1rem; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #ddd;
         vertical-align: top; }
td.n { text-align: right; white-space: nowrap; }
figure img { max-width: 100%; border: 1px solid #ddd; } .note { color: #555; }
"""


def class_report_html(data: dict, *, draw: bool = True) -> str:
    """The class report as a self-contained HTML page."""
    e = html.escape
    draw = draw and figures.available()
    scores = data["scores"]
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>moco-ref class report</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
           "<h1>Class report</h1>",
           f'<p id="counts" data-submissions="{data["submissions"]}" '
           f'data-gradable="{data["gradable"]}">{data["submissions"]} submission(s), '
           f'{data["gradable"]} gradable, {scores["full_marks"]} with full marks'
           + (f'; mean score {points_str(scores["mean"])}, median '
              f'{points_str(scores["median"])}' if scores["mean"] is not None else "")
           + ".</p>"]
    if not draw:
        out.append('<p class="note">Figures are not drawn: matplotlib is not installed.</p>')
    out.append("<h2>Scores</h2>")
    if draw:
        out.append(_img(figures.score_histogram(
            [_percent(s) for s in scores["by_submission"] if s["status"] != "not gradable"],
            BINS), "histogram of the scores"))
    out += ["<table><tr><th>score (% of the maximum)</th><th>submissions</th></tr>"]
    for bin_ in scores["histogram"]:
        out.append(f"<tr><td>{bin_['from_percent']:g}–{bin_['to_percent']:g}</td>"
                   f'<td class="n">{bin_["count"]}</td></tr>')
    out.append("</table>")
    out.append("<h2>Invariant families</h2>")
    if draw and data["families"]:
        out.append(_img(figures.family_figure(
            {f["family"]: f["broken"] for f in data["families"]}, data["submissions"]),
            "students who broke each family"))
    out.append("<table><tr><th>family</th><th>students who broke it</th>"
               "<th>not passed (incl. errors, timeouts)</th><th>who</th></tr>")
    for family in data["families"]:
        out.append(f'<tr data-family="{e(family["family"])}"><td>{e(family["family"])}</td>'
                   f'<td class="n">{family["broken"]}</td>'
                   f'<td class="n">{family["not_passed"]}</td>'
                   f'<td>{e(", ".join(family["students"]))}</td></tr>')
    out.append("</table>")
    out.append("<h2>Most common misconceptions</h2>")
    if data["misconceptions"]:
        out.append("<table><tr><th>students</th><th>misconception</th><th>checks</th>"
                   "<th>for example</th></tr>")
        for entry in data["misconceptions"]:
            out.append(f'<tr><td class="n">{entry["count"]}</td>'
                       f'<td>{e(entry["misconception"])}</td>'
                       f'<td>{e(", ".join(entry["checks"]))}</td>'
                       f"<td>{e(entry['example'])}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p>No failed check diagnosed a misconception.</p>")
    for title, key in (("Not gradable", "not_gradable"), ("Timed out", "timeouts"),
                       ("Reports missing from the folder", "missing_reports")):
        names = data.get(key) or []
        if key == "missing_reports" and not names:
            continue
        out.append(f'<h2>{title} ({len(names)})</h2>')
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in names) + "</ul>"
                   if names else "<p>None.</p>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
