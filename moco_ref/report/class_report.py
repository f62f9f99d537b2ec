"""The class report: what a batch of graded submissions says about the class.

``class_report(out)`` reads a batch output folder (``OUT/summary.json`` and each submission's
``OUT/<stem>.json`` report, format ``moco-ref-grade/1``) and gives, as one JSON-ready dict:

- ``scores``: every submission's score (from ``summary.json``); the mean and median of the
  *gradable* submissions (``mean``, ``median``: a submission that is not gradable has no
  score and is left out, ``averaged_over`` says so in words) and of all of them, a not
  gradable one counted as 0 (``mean_all``, ``median_all``); a histogram of every gradable
  submission in tenths of its maximum (the rubric's total, whatever it is: each bin also in
  points, ``from_points``–``to_points``), the last bin closed (full marks are in it);
- ``families``: per invariant family, how many students *broke* it (a failed check in it:
  a student counts once per family however many of its checks failed) and how many did not
  pass it (failed, error, timeout or not judged: ``summary.json``'s ``failed_families``);
- ``misconceptions``: the diagnosed misconceptions of failed checks
  (``details.misconception``), most common first, each with how many students, the checks
  that diagnosed it and one example student;
- ``not_gradable`` and ``timeouts``: the submissions of those statuses.

``class_report_html`` renders it as a self-contained page (figures inlined, see
``moco_ref.report.figures``). The class report is for the course's staff: it names
submissions by their students' names, with their ids (the submission's name in the batch when
the export named no one; never a path of the grading machine).
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path

from moco_ref.judge.registry import FAMILIES
from moco_ref.report import figures
from moco_ref.report.gradebook_csv import row_label
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
    """The score as a percentage of the row's maximum, in [0, 100] (no float noise past full
    marks: 100 × 33.33 / 33.33 is 100)."""
    maximum = float(row.get("max_score") or 0.0)
    if maximum <= 0:
        return 0.0
    return min(100.0, max(0.0, round(100.0 * float(row.get("score") or 0.0) / maximum, 6)))


def _bin_of(percent: float) -> int:
    """The histogram bin of a percentage: ``[low, high)``, the last one closed at 100."""
    return min(len(BINS) - 1, max(0, int(percent // 10.0)))


def _total(summary: dict, rows: list[dict]) -> float:
    """The rubric's total: summary.json's, else the largest maximum of its rows."""
    total = summary.get("total")
    if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
        return float(total)
    return max((float(row.get("max_score") or 0.0) for row in rows), default=0.0)


def averaged_over(gradable: int, submissions: int) -> str:
    """What the mean and median count, in words."""
    left_out = submissions - gradable
    if not left_out:
        return f"over all {submissions} submission(s), every one gradable"
    return (f"over the {gradable} gradable submission(s); the {left_out} not gradable "
            "left out (counted as 0: see mean_all, median_all)")


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
    labels = {name: row_label(row) for name, row in zip(names, rows)}
    gradable = [row for row in rows if row.get("gradable")]
    percents = [_percent(row) for row in gradable]
    scores = [float(row.get("score") or 0.0) for row in gradable]
    every = [float(row.get("score") or 0.0) if row.get("gradable") else 0.0 for row in rows]
    total = _total(summary, rows)
    counts = [0] * len(BINS)
    for percent in percents:
        counts[_bin_of(percent)] += 1

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
            broken.setdefault(result.get("family", "?"), set()).add(labels[name])
            details = result.get("details") or {}
            sentence = details.get("misconception") or result.get("message", "").split(
                ":", 1)[0].strip()
            if not sentence:
                continue
            entry = misconceptions.setdefault(sentence, {
                "misconception": sentence, "students": [], "checks": [],
                "family": result.get("family", "?")})
            if labels[name] not in entry["students"]:
                entry["students"].append(labels[name])
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
        "total": total,
        "scores": {
            "by_submission": [
                {"submission": name, "who": labels[name], "gradable": bool(row.get("gradable")),
                 "score": float(row.get("score") or 0.0),
                 "max_score": float(row.get("max_score") or 0.0), "status": statuses[name]}
                for name, row in zip(names, rows)],
            "mean": _cents(statistics.fmean(scores)) if scores else None,
            "median": _cents(statistics.median(scores)) if scores else None,
            "averaged_over": averaged_over(len(gradable), len(rows)),
            "mean_all": _cents(statistics.fmean(every)) if every else None,
            "median_all": _cents(statistics.median(every)) if every else None,
            "full_marks": sum(1 for row in gradable
                              if float(row.get("score") or 0) + 1e-9 >= float(
                                  row.get("max_score") or 0) and not row.get("failed_checks")),
            "histogram": [{"from_percent": low, "to_percent": high,
                           "from_points": _cents(total * low / 100),
                           "to_points": _cents(total * high / 100), "count": counts[i]}
                          for i, (low, high) in enumerate(BINS)],
        },
        "families": [{"family": family, "broken": len(broken.get(family, ())),
                      "not_passed": len(not_passed.get(family, ())),
                      "students": sorted(broken.get(family, ()))} for family in families],
        "misconceptions": [{**entry, "count": len(entry["students"]),
                            "example": entry["students"][0]} for entry in common],
        "not_gradable": [labels[name] for name in names if statuses[name] == "not gradable"],
        "timeouts": [labels[name] for name in names if statuses[name] == "timeout"],
        "missing_reports": missing,
    }


def _cents(value: float) -> float:
    return round(value + 0.0, 2)


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
              f'{points_str(scores["median"])} {e(scores["averaged_over"])}'
              if scores["mean"] is not None else "")
           + (f'; counting the not gradable as 0: mean {points_str(scores["mean_all"])}, '
              f'median {points_str(scores["median_all"])}'
              if scores["mean"] is not None and data["gradable"] < data["submissions"]
              else "")
           + ".</p>"]
    if not draw:
        out.append('<p class="note">Figures are not drawn: matplotlib is not installed.</p>')
    out.append("<h2>Scores</h2>")
    if draw:
        out.append(_img(figures.score_histogram(
            [_percent(s) for s in scores["by_submission"]
             if s.get("gradable", s["status"] != "not gradable")],
            BINS), "histogram of the scores"))
    out += ["<table><tr><th>score (% of the maximum)</th><th>points</th><th>gradable "
            "submissions</th></tr>"]
    last = len(scores["histogram"]) - 1
    for number, bin_ in enumerate(scores["histogram"]):
        close = "]" if number == last else ")"
        points = (f"{points_str(bin_['from_points'])}–{points_str(bin_['to_points'])}"
                  if "from_points" in bin_ else "")
        out.append(f"<tr><td>{bin_['from_percent']:g}–{bin_['to_percent']:g}{close}</td>"
                   f"<td>{points}</td>"
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
