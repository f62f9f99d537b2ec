"""Text every renderer shares, safe to show a student: strict JSON, the inferred settings in
words, a submission named without the grading machine's paths, text with no local path or
command, and Markdown that shows what a submission or a check wrote exactly as written
(fenced code, inline code, escaped prose).

And what makes a name a student chose inert wherever it is shown (the threat model's "outputs
are inert"): ``shown_name`` for a terminal (the submission's own output's sanitiser,
``untrusted.clean_text``, on one line), ``csv_cell`` for a spreadsheet (formula prefixes
neutralised, OWASP's rule), ``code_span``/``fence`` for Markdown (no way out of the span).

One definition of each, used by the terminal and JSON reports (``formats``), the platforms'
results (``lms``), the feedback pages (``feedback``), the CSVs (``gradebook_csv``) and the
commands' own lines.
"""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from pathlib import Path

from moco_ref.judge.results import SubmissionReport
from moco_ref.judge.untrusted import clean_text
from moco_ref.probe.source import SUBMISSION_SUFFIXES

_INFERRED_ORDER = ("m", "capacity", "batch_size", "order", "temperature")
# An absolute POSIX path of at least two components, not glued to a word (so ``1/2``,
# ``query/key`` and ``a / b`` stay as they are).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~/\\-])(?:/[\w.+@%~=-]+){2,}/?")
# A sentence that tells the reader to run a moco-ref command: meant for staff, not students.
_LOCAL_COMMAND = re.compile(r"[^.\n]*`moco-ref [^`\n]*`[^.\n]*\.?")
_RERUN_LINE = re.compile(r"^\s*\(?rerun:.*$\n?", re.MULTILINE | re.IGNORECASE)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&!])")
# where a GFM autolink would start: a scheme's ``:``, ``www``'s first ``.``, an e-mail's ``@``
_AUTOLINK = re.compile(r"(?i)(\w)(:(?=//)|\.(?<=\bwww\.)|@)")
MAX_NAME_CHARS = 512  # a name on a terminal line; longer keeps its head and tail
CSV_CELL_CHARS = 32_000  # a spreadsheet cell holds at most 32 767 characters
_NOT_A_SPACE = re.compile(r"[^\S ]")  # line breaks, tabs, U+2028…: every whitespace but " "
# A spreadsheet reads a cell that begins with one of these as a formula (OWASP, "CSV
# Injection"; tab and carriage return are gone after cleaning, but a cell is checked after
# any leading spaces too); full-width forms as well, which some spreadsheets fold.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
# ... and inside a cell after a separator or a quote, where a spreadsheet that splits cells
# another way (``;`` in many locales) would begin a cell.
_FORMULA_INSIDE = re.compile("([,;\"'] *)(?=[=+\\-@\uff1d\uff0b\uff0d\uff20])")


# --------------------------------------------------------------------------- JSON


def dumps_strict(payload) -> str:
    """Strict JSON: NaN and infinities (a diverged loss as evidence) become strings."""
    return json.dumps(_finite(payload), indent=2, default=_json_default, allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, Enum):
        return _finite(value.tolist())
    return value


def _json_default(value):
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # tensors, numpy arrays and scalars
        return value.tolist()
    return repr(value)


# --------------------------------------------------------------------------- wording


def inferred_text(inferred: dict) -> str:
    """``m=0.95, capacity=240, batch size=60, order=lab`` — known keys first."""
    keys = [key for key in _INFERRED_ORDER if key in inferred]
    keys += sorted(key for key in inferred if key not in _INFERRED_ORDER)
    return ", ".join(f"{key.replace('_', ' ')}={_value_text(inferred[key])}" for key in keys)


# The families whose outcome an inferred value can give away (the loss form names a broken
# mask, negatives or temperature; m and the order an EMA bug). A value not listed here could
# say anything: it is shown only when no family is withheld.
_LOSS_FAMILIES = ("I2", "I4", "I5", "I8", "I9")
INFERRED_FAMILIES: dict[str, tuple[str, ...]] = {
    "style": (),
    "steps": ("contract",), "epochs": ("contract",), "batch_size": ("contract",),
    "dim": ("contract",), "cases": ("contract",), "base_encoder_extra_arguments": ("contract",),
    "K": ("contract", "I3"), "capacity": ("I2", "I3"), "queue_layout": ("I2", "I3"),
    "m": ("I5", "I6", "I7"), "order": ("I6", "I7"),
    "temperature": _LOSS_FAMILIES, "module_T": _LOSS_FAMILIES,
    "loss_form": _LOSS_FAMILIES, "logits_form": _LOSS_FAMILIES,
    "process_group": ("contract", "I3", "I8"), "variant": ("contract", "I3", "I8"),
}


def student_inferred(inferred: dict, withheld_families) -> dict:
    """The inferred values a student may see while the checks of ``withheld_families`` are not
    shown: none that could tell such a check's outcome (``INFERRED_FAMILIES``; a value of no
    known family goes whenever any family is withheld)."""
    withheld = set(withheld_families)
    if not withheld:
        return dict(inferred)
    return {key: value for key, value in inferred.items()
            if key in INFERRED_FAMILIES and not withheld & set(INFERRED_FAMILIES[key])}


def _value_text(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def one_line_reason(text: str) -> str:
    """A traceback's last line (the exception), otherwise the text's first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


# --------------------------------------------------------------------------- student-safe


def submission_folder(report: SubmissionReport) -> Path | None:
    """The folder the submission's file is in (its files are named relative to it)."""
    if not report.submission.endswith(SUBMISSION_SUFFIXES):
        return None
    return Path(report.submission).absolute().parent


def submission_name(report: SubmissionReport, root: Path | None = None) -> str:
    """The submission's file name (relative to ``root`` when it is inside it)."""
    path = Path(report.submission)
    if root is not None:
        try:
            return Path(path.absolute()).relative_to(root).as_posix()
        except ValueError:
            pass
    return path.name


def student_text(text: str, submission_root: Path | str | None = None) -> str:
    """``text`` with no path of the grading machine and no local command: a path inside
    ``submission_root`` becomes relative to it, any other absolute path its last component;
    rerun lines and sentences that show a ``moco-ref`` command are left out."""
    text = str(text)
    if submission_root is not None:
        root = Path(submission_root)
        for form in {str(root), str(root.absolute()), str(_resolved(root))}:
            if form not in ("", "/", "."):
                text = text.replace(form.rstrip("/") + "/", "")
    text = _RERUN_LINE.sub("", text)
    text = _LOCAL_COMMAND.sub("", text)
    return _ABSOLUTE_PATH.sub(_last_component, text)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def _last_component(match: re.Match) -> str:
    name = match.group(0).rstrip("/").rsplit("/", 1)[-1]
    return name or "…"


# --------------------------------------------------------------------------- names shown


def shown_name(text: object, cap: int = MAX_NAME_CHARS) -> str:
    """A name a student chose (a file, a submission, a student's name or id, a note or line
    made of them) safe to print on one line of a terminal: through the submission output's
    sanitiser (``untrusted.clean_text``: no escape sequence, no control character, capped to
    ``cap``), every line break and tab a space, so it can neither change the terminal nor
    start a line of its own."""
    return _NOT_A_SPACE.sub(" ", clean_text(text, cap))


def csv_cell(value):
    """A cell of a CSV a spreadsheet will open: a number (``int``, ``float``, ``bool``) as it
    is; anything else as text, cleaned like ``shown_name`` and — when it begins (after any
    spaces) with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return — prefixed with ``'``,
    so the spreadsheet shows it instead of evaluating it (OWASP's rule). The same ``'`` goes
    before such a character after a ``,``, ``;`` or quote inside the text (where a spreadsheet
    splitting on another separator would begin a cell), and the writer quotes every text cell
    (``csv.QUOTE_NONNUMERIC``)."""
    if isinstance(value, bool | int | float):
        return value
    if value is None:
        return ""
    raw = str(value)
    text = _FORMULA_INSIDE.sub(r"\1'", shown_name(raw, CSV_CELL_CHARS))
    if any(form.lstrip(" ").startswith(_FORMULA_START) for form in (raw, text)):
        return "'" + text
    return text


# --------------------------------------------------------------------------- Markdown


def fence(text: str, info: str = "text") -> str:
    """``text`` in a fenced code block longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}"


def code_span(text: str) -> str:
    """``text`` as an inline code span (one line), delimited by a run of backticks longer
    than any inside it (CommonMark), so no text can close the span early."""
    text = " ".join(str(text).split()) or " "
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_escape(text: str) -> str:
    """``text`` as Markdown prose that reads literally (no emphasis, links, HTML or tables,
    and no autolink: GitHub-flavoured renderers such as Gradescope's turn a bare
    ``https://…``, ``www.…`` or e-mail address into a live link, so its ``:``, ``.`` or ``@``
    is escaped)."""
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return _AUTOLINK.sub(lambda m: m.group(1) + "\\" + m.group(2), text)
