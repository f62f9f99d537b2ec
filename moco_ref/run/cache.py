"""The signed cache of a batch's reports: an unchanged submission is not graded again.

``OUT/.cache/<key>.json``, ``key = sha256(name, content of the file and of its helper modules,
grader fingerprint, options, isolation)`` (the name too: a report quotes its file in
tracebacks), each entry authenticated by an HMAC-SHA256 under ``OUT/.cache/.secret``
(owner-only): an entry without a valid MAC, or whose report was changed, is ignored and the
submission graded anew. The grader fingerprint is the version plus a hash of the grader's own
source, so any change of the grader invalidates the cache. Module targets are never cached
(no file to hash); which reports may be kept is ``report_is_cacheable``'s decision alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from functools import lru_cache
from pathlib import Path

import moco_ref
from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.source import is_module_target
from moco_ref.report.text import dumps_strict
from moco_ref.run.output import write_atomic
from moco_ref.run.targets import Target

CACHE_FOLDER = ".cache"
PROBE_SECRET_FILE = ".probe-secret"
SECRET_FILE = ".secret"


@lru_cache(maxsize=1)
def grader_fingerprint() -> str:
    """The version and a hash of every source file of the grader (moco_ref)."""
    root = Path(moco_ref.__file__).resolve().parent
    digest = hashlib.sha256(moco_ref.__version__.encode())
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return f"{moco_ref.__version__}+{digest.hexdigest()[:16]}"


def cache_key(target: Target, options: GradeOptions,
              isolation: str | None = None) -> str | None:
    """None when the target cannot be hashed (a module path)."""
    if is_module_target(target.path):
        return None
    from moco_ref.sandbox.attempt import helper_files
    from moco_ref.sandbox.client import isolation_mode

    content = hashlib.sha256(Path(target.path).read_bytes()).hexdigest()
    helpers = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
               for path in helper_files(target.path, target.helpers)}
    material = json.dumps({"name": target.name, "content": content, "helpers": helpers,
                           "grader": grader_fingerprint(), "options": options.to_dict(),
                           "isolation": isolation_mode(isolation)}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _cache_file(out: Path, key: str) -> Path:
    return out / CACHE_FOLDER / f"{key}.json"


def _secret(out: Path) -> bytes:
    """The cache's signing key, ``OUT/.cache/.secret`` (created on first use, owner-only): a
    cache entry is trusted only if it carries this key's MAC, so an entry written by anyone
    who cannot read the key (a submission) is never believed."""
    return _kept_secret(out / CACHE_FOLDER / SECRET_FILE)


def course_probe_secret(out: Path) -> bytes:
    """The course's probe secret, kept beside the cache's (``OUT/.cache/.probe-secret``,
    created on first use, owner-only): the probe's sizes, ids and seeds are drawn from it, so
    every submission of the course meets the same probe and none can know it in advance.
    ``--probe-secret`` (or ``MOCO_REF_PROBE_SECRET``) sets it instead, to reproduce a run."""
    return _kept_secret(out / CACHE_FOLDER / PROBE_SECRET_FILE)


def _kept_secret(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = secrets.token_bytes(32)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another grading run made it first
            return path.read_bytes()
        with os.fdopen(descriptor, "wb") as file:
            file.write(fresh)
        return fresh


def _mac(secret: bytes, key: str, report: dict) -> str:
    body = json.dumps({"key": key, "report": report}, sort_keys=True).encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def load_cached(out: Path, key: str | None, target: Target) -> SubmissionReport | None:
    """The cached report of ``key`` if there is one whose MAC this grader wrote."""
    if key is None:
        return None
    try:
        data = json.loads(_cache_file(out, key).read_text(encoding="utf-8"))
        if data.get("key") != key or not isinstance(data.get("mac"), str):
            return None
        if not hmac.compare_digest(data["mac"], _mac(_secret(out), key, data["report"])):
            return None
        report = SubmissionReport.from_dict(data["report"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    report.submission = target.path
    return report


def store_cached(out: Path, key: str | None, report: SubmissionReport) -> None:
    """Keep ``report`` under ``key``, signed, when it may be cached."""
    if key is None or not report_is_cacheable(report):
        return
    data = json.loads(dumps_strict(report.to_dict()))  # the report exactly as it will be read back
    write_atomic(_cache_file(out, key),
                 dumps_strict({"key": key, "report": data, "mac": _mac(_secret(out), key, data)}))


def report_is_cacheable(report: SubmissionReport) -> bool:
    """The one place that decides what may be cached: a report made under the grader's own
    trouble (``grader_trouble``) never is, nor one where time ran out (a timeout may not happen
    again on a quieter machine)."""
    from moco_ref.sandbox.observation import LOAD_TIMED_OUT

    if report.grader_trouble:
        return False
    return not any(result.status is Status.TIMEOUT for result in report.results) and \
        not report.traceback.startswith(LOAD_TIMED_OUT)
