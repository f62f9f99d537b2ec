"""Grading a submission in isolation: the submission's process observes, this process judges.

Each submission runs in a process of its own, forked from a warm ``zygote`` (torch and the
observer already imported), under a supervisor that kills everything it started when it
ends. It has

- its own session, and — where the kernel allows unprivileged namespaces — its own user, PID,
  network, IPC and mount namespaces: no network, a read-only file system except a private
  ``/tmp`` (its working directory is there), and a PID namespace the kernel empties when the
  job ends (``namespaces``). Elsewhere: a child-subreaper supervisor, session and
  environment-token sweeps (``procs``) and a fresh temporary working directory;
- a wall-clock timeout for the whole job (``GradeOptions.timeout``) and one per observed part
  (``check_timeout``); an address-space limit (``RLIMIT_AS = memory_mb``; torch and the
  preloaded modules map ~3.6 GB of it), no core dumps, no file larger than 1 GiB;
- no standard input; stdout/stderr captured, keeping the first and last 10 kB of each;
- the reference-import guard (``guard``) unless ``allow_reference_import``.

Observations come back as frames on a pipe no file name leads to (``channel``), part by part
(``parts``). The grader validates them against the probe it asked for (``record``) and judges
them here, by recomputation. A part that ran out of time is reported ``timeout``; one whose
process died, or whose observations were inconsistent, makes the checks that need it report
``error``; the other parts are observed in a fresh process and judged as usual. A submission
that cannot be loaded gives a report with ``gradable=False`` and the traceback; nothing a
submission does raises out of ``grade_submission``. ``observe_sandboxed`` observes the same
way without judging (for ``moco-ref record``).

What the isolation does not stop: without namespaces, a submission runs as the grader's user
and can signal or ptrace the grader's processes, write anywhere the user can (other reports,
the cache, the grader's code) and use the network; a process that deliberately kills the
supervisor and the zygote, leaves its session and clears its environment can outlive the job.
With namespaces it can still read what the user can read, and there is no limit on the number
of processes or on CPU time beyond the wall-clock timeouts (no cgroup is used).
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import moco_ref
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.observe import parts as parts_module
from moco_ref.observe.channel import (
    EXIT,
    PART,
    PART_START,
    RESULT,
    STAGE,
    Frame,
    FrameReader,
    new_nonce,
)
from moco_ref.observe.loader import is_module_target
from moco_ref.observe.options import GradeOptions
from moco_ref.sandbox import procs
from moco_ref.sandbox.capture import StreamDrain

_PACKAGE_ROOT = str(Path(moco_ref.__file__).resolve().parent.parent)
# Validating and judging are quick; one at a time keeps hypothesis and torch's global RNG calm.
_JUDGE_LOCK = threading.Lock()
ISOLATION_VARIABLE = "MOCO_REF_ISOLATION"  # auto (default) | namespaces | processes
ISOLATION_MODES = ("auto", "namespaces", "processes")
ZYGOTE_START_SECONDS = 300.0  # importing torch on a busy machine can take a while
STOP_GRACE_SECONDS = 5.0
MIN_RETRY_SECONDS = 3.0  # observing the remaining parts anew needs at least this much time


def grade_submission(target: str, options: GradeOptions | None = None) -> SubmissionReport:
    """Observe ``target`` in a sandboxed process, judge the observations here, and report."""
    options = options or GradeOptions()
    started = time.monotonic()
    try:
        report = _grade(target, options)
    except Exception as exc:  # noqa: BLE001 - e.g. the zygote could not be started
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        report = SubmissionReport(
            target, options.style or "unknown", gradable=False,
            traceback=f"moco-ref internal error while running the submission:\n{trace}",
        )
    report.wall_seconds = time.monotonic() - started
    return report


def grade_many(
    targets: list[str], options: GradeOptions | None = None, *, jobs: int = 1, on_report=None
) -> list[SubmissionReport]:
    """Grade several submissions under the same options, ``jobs`` at a time; reports keep the
    order of ``targets``. ``on_report(report)`` is called as each one finishes."""
    options = options or GradeOptions()
    return grade_tasks([(target, options) for target in targets], jobs=jobs, on_report=on_report)


def grade_tasks(
    tasks: list[tuple[str, GradeOptions]], *, jobs: int = 1, on_report=None
) -> list[SubmissionReport]:
    """Like ``grade_many`` with options of its own for each submission."""

    def grade(task: tuple[str, GradeOptions]) -> SubmissionReport:
        report = grade_submission(*task)
        if on_report is not None:
            on_report(report)
        return report

    if jobs <= 1 or len(tasks) <= 1:
        return [grade(task) for task in tasks]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="moco-ref-grade") as pool:
        return list(pool.map(grade, tasks))


# --------------------------------------------------------------------------- the zygote


def isolation_mode() -> str:
    mode = os.environ.get(ISOLATION_VARIABLE, "auto").strip().lower() or "auto"
    if mode not in ISOLATION_MODES:
        raise ValueError(f"{ISOLATION_VARIABLE}={mode!r}: expected one of {ISOLATION_MODES}")
    return mode


def isolation_description() -> str:
    """How submissions are isolated here: ``namespaces`` (or ``processes``, and why)."""
    mode = isolation_mode()
    if mode == "processes":
        return "processes (namespaces turned off)"
    zygote = zygote_for(_child_environment())
    if zygote.namespaces:
        return zygote.namespaces
    return f"processes (namespaces unavailable: {zygote.hello.get('isolation_error')})"


class _JobHandle:
    def __init__(self, job: str, events: queue.Queue) -> None:
        self.job = job
        self.events = events
        self.started = threading.Event()
        self.pid: int | None = None
        self.exited = threading.Event()
        self.status: int | None = None
        self.zygote_died = False


class Zygote:
    """The grader's end of one zygote process (see ``zygote``)."""

    def __init__(self, env: dict) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._scratch = tempfile.mkdtemp(prefix="moco-ref-zygote-")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moco_ref.sandbox.zygote", "--fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                cwd=self._scratch,  # nothing importable from where the grader runs
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._stderr = StreamDrain(self.process.stderr)
        self.sock = ours
        self._send_lock = threading.Lock()
        self._jobs: dict[str, _JobHandle] = {}
        self._jobs_lock = threading.Lock()
        self.alive = True
        self.hello = self._hello()
        self._thread = threading.Thread(target=self._dispatch, daemon=True,
                                        name="moco-ref-zygote")
        self._thread.start()

    def _hello(self) -> dict:
        import json

        self.sock.settimeout(ZYGOTE_START_SECONDS)
        try:
            data = self.sock.recv(1 << 16)
        except (OSError, TimeoutError):
            data = b""
        self.sock.settimeout(None)
        if not data:
            self.close()
            tail = self._stderr.finish(timeout=1.0).strip()[-4000:]
            raise RuntimeError(f"the grading zygote did not start:\n{tail}")
        return json.loads(data)

    @property
    def namespaces(self) -> str:
        return self.hello.get("isolation", "")

    def spawn(self, request: dict, fds: list[int], events: queue.Queue) -> _JobHandle:
        from moco_ref.sandbox.zygote import send

        handle = _JobHandle(request["job"], events)
        with self._jobs_lock:
            if not self.alive:
                raise RuntimeError("the grading zygote is gone")
            self._jobs[handle.job] = handle
        with self._send_lock:
            send(self.sock, {"op": "spawn", **request}, fds)
        if not handle.started.wait(60.0) or handle.pid is None:
            raise RuntimeError("the grading zygote did not start the job"
                               + (" (it died)" if handle.zygote_died else ""))
        return handle

    def _dispatch(self) -> None:
        import json

        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._jobs_lock:
                handle = self._jobs.get(message.get("job"))
            if handle is None:
                continue
            if message["event"] == "started":
                handle.pid = int(message["pid"])
                handle.started.set()
            elif message["event"] == "exited":
                handle.status = int(message["status"])
                handle.exited.set()
                handle.events.put(("exited", handle.status))
                with self._jobs_lock:
                    self._jobs.pop(handle.job, None)
        with self._jobs_lock:
            self.alive = False
            orphans = list(self._jobs.values())
            self._jobs.clear()
        for handle in orphans:
            handle.zygote_died = True
            handle.started.set()
            handle.exited.set()
            handle.events.put(("zygote-died", None))

    def close(self) -> None:
        self.alive = False
        try:  # shutdown first: it also wakes the dispatcher blocked in recv()
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()  # the zygote kills its jobs and exits
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        if self.process.stderr is not None:
            self._stderr.finish(timeout=1.0)
            self.process.stderr.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


_ZYGOTES: dict[tuple, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()
MAX_ZYGOTES = 3  # e.g. the real harness, a test stand-in, a pytester run


def zygote_for(env: dict) -> Zygote:
    """The live zygote started with ``env`` (one is started if needed)."""
    key = tuple(sorted(env.items()))
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.pop(key, None)
        if zygote is not None and (not zygote.alive or zygote.process.poll() is not None):
            zygote.close()  # died (or was killed): a new one
            zygote = None
        if zygote is None:
            while len(_ZYGOTES) >= MAX_ZYGOTES:  # the least recently used goes
                _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
            zygote = Zygote(env)
        _ZYGOTES[key] = zygote  # most recently used last
        return zygote


def shutdown_zygotes() -> None:
    """Stop every zygote (and whatever job they still run)."""
    with _ZYGOTES_LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for zygote in zygotes:
        zygote.close()


atexit.register(shutdown_zygotes)


# Not given to submissions: the grader's own settings, and what changes from test to test
# (it would start a new zygote each time).
_NOT_PASSED_ON = (procs.TOKEN_VARIABLE, ISOLATION_VARIABLE, "PYTEST_CURRENT_TEST")


def _child_environment() -> dict:
    env = dict(os.environ)
    for name in _NOT_PASSED_ON:
        env.pop(name, None)
    if not _installed_in_site_packages():  # a source checkout: the child must find moco_ref
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if part
        )
    env.update(
        PYTHONUNBUFFERED="1",  # what was printed before a crash is not lost in a buffer
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        MPLBACKEND="Agg",  # plots in executed notebook cells draw nowhere
        OMP_NUM_THREADS="1",  # no thread pools in the zygote: it forks
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


def _installed_in_site_packages() -> bool:
    """Site-packages must not go on PYTHONPATH: it would come before the standard library."""
    paths = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    paths.update(getattr(site, "getsitepackages", list)())
    return any(Path(path).resolve() == Path(_PACKAGE_ROOT) for path in paths if path)


# --------------------------------------------------------------------------- one attempt


@dataclass
class Attempt:
    """What one process observing (some parts of) a submission left behind."""

    stage: dict | None = None
    parts: dict[str, dict] = field(default_factory=dict)  # PART payloads, by part
    started_part: str | None = None  # started, never finished
    result: dict | None = None
    exit: dict | None = None  # the supervisor's EXIT frame
    supervisor_status: int | None = None
    timed_out: bool = False  # the whole job's time ran out
    part_timed_out: bool = False  # started_part ran out of its own time
    corrupt: str = ""
    internal_error: str = ""
    stdout: str = ""
    stderr: str = ""
    isolation: str = ""
    asked: list[str] | None = None  # the parts this process was asked to observe (None: all)

    def exit_text(self) -> str:
        """How the submission's process ended, in words."""
        status = (self.exit or {}).get("status")
        if status is None:
            if self.supervisor_status is not None and self.exit is None:
                return "the grader's supervisor process was killed (by the submission?)"
            return "the submission's process ended"
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.Signals(number).name if number in signal.valid_signals() else number
            return f"the submission's process was killed by {name}"
        return f"the submission's process exited with code {os.WEXITSTATUS(status)}"

    def killed_by_sigkill(self) -> bool:
        status = (self.exit or {}).get("status")
        return status is not None and os.WIFSIGNALED(status) and \
            os.WTERMSIG(status) == signal.SIGKILL


def _attempt(zygote: Zygote, target: str, options: GradeOptions, deadline: float,
             only_parts: list[str] | None) -> Attempt:
    mode = isolation_mode()
    use_namespaces = mode != "processes" and bool(zygote.namespaces)
    if mode == "namespaces" and not zygote.namespaces:
        raise RuntimeError("namespaces were required (MOCO_REF_ISOLATION=namespaces) but are "
                           f"not available here: {zygote.hello.get('isolation_error')}")
    attempt = Attempt(asked=only_parts)
    token, nonce = secrets.token_hex(16), new_nonce()
    events: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="moco-ref-grade-",
                                     ignore_cleanup_errors=True) as scratch:
        workdir = Path(scratch) / "work"
        workdir.mkdir()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        channel_r, channel_w = os.pipe()
        stdout = StreamDrain(os.fdopen(out_r, "rb"))
        stderr = StreamDrain(os.fdopen(err_r, "rb"))
        reader = FrameReader(channel_r, nonce, on_frame=events.put)
        request = {
            "job": token,
            "token": token,
            "nonce": nonce.hex(),
            "target": target if is_module_target(target) else str(Path(target).resolve()),
            "options": options.to_dict(),
            "import_root": os.getcwd(),
            "scratch": os.path.realpath(scratch),
            "memory_mb": options.memory_mb,
            "namespaces": use_namespaces,
            "parts": only_parts,
        }
        handle = None
        try:
            handle = zygote.spawn(request, [out_w, err_w, channel_w], events)
        except Exception as exc:  # noqa: BLE001
            attempt.internal_error = f"{type(exc).__name__}: {exc}"
        finally:
            for fd in (out_w, err_w, channel_w):
                os.close(fd)
        if handle is not None:
            _follow(attempt, handle, events, options, deadline)
            _stop(handle, token)
        if not reader.join(STOP_GRACE_SECONDS).closed:
            reader.stop()  # an escaped process holds the pipe: stop listening
            reader.join(1.0)
        attempt.corrupt = reader.log.corrupt
        for frame in reader.frames():
            _take(attempt, frame)
        attempt.stdout, attempt.stderr = stdout.finish(), stderr.finish()
        if handle is not None and handle.zygote_died and not attempt.internal_error:
            attempt.internal_error = "the grading zygote died while the submission ran"
        if attempt.exit is not None:
            attempt.isolation = attempt.exit.get("isolation", "")
    return attempt


def _take(attempt: Attempt, frame: Frame) -> None:
    payload = frame.payload
    if frame.kind == STAGE and attempt.stage is None:
        attempt.stage = payload
    elif frame.kind == PART_START:
        attempt.started_part = str(payload.get("part"))
    elif frame.kind == PART and isinstance(payload, dict):
        name = str(payload.get("part"))
        attempt.parts[name] = payload
        if attempt.started_part == name:
            attempt.started_part = None
    elif frame.kind == RESULT and attempt.result is None:
        attempt.result = payload
    elif frame.kind == EXIT and attempt.exit is None:
        attempt.exit = payload


def _follow(attempt: Attempt, handle: _JobHandle, events: queue.Queue, options: GradeOptions,
            deadline: float) -> None:
    """Wait for the job to end, stopping it at the job's deadline or when the part being
    observed has run longer than ``check_timeout``."""
    current, current_since = None, 0.0
    channel_closed = exited = False
    exited_at = 0.0
    while not (channel_closed and exited):
        now = time.monotonic()
        limits = [deadline]
        if current is not None and options.check_timeout:
            limits.append(current_since + options.check_timeout)
        if exited:  # the supervisor is gone; only an escaped process could hold the channel
            limits.append(exited_at + STOP_GRACE_SECONDS)
        wait = min(limits) - now
        if wait <= 0:
            if exited:
                return
            if now >= deadline:
                attempt.timed_out = True
            else:
                attempt.part_timed_out = True
            return
        try:
            item = events.get(timeout=wait)
        except queue.Empty:
            continue
        if item is None:
            channel_closed = True
        elif isinstance(item, Frame):
            if item.kind == PART_START:
                current, current_since = item.payload.get("part"), item.at
            elif item.kind == PART:
                current = None
        else:
            exited, exited_at = True, time.monotonic()
            attempt.supervisor_status = handle.status


def _stop(handle: _JobHandle, token: str) -> None:
    """End the job: ask the supervisor (it kills the job's processes), then make sure."""
    pid = handle.pid
    if pid is None:
        return
    if not handle.exited.is_set():
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        if not handle.exited.wait(STOP_GRACE_SECONDS):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            handle.exited.wait(STOP_GRACE_SECONDS)
    procs.kill_until_gone(
        lambda: procs.job_members(roots=[pid] if procs.alive(pid) else [], sessions=[pid],
                                  token=token),
        deadline_seconds=5.0,
    )


# --------------------------------------------------------------------------- the job


@dataclass
class _Missing:
    reason: str
    timed_out: bool


@dataclass
class _Run:
    """Everything observing one submission gave, over one or more processes."""

    attempts: list[Attempt]
    stage: dict | None  # the STAGE frame: style, notes, parts, which entry points exist
    done: dict[str, dict]  # PART payloads of the parts observed, by part
    missing: dict[str, _Missing]  # parts not observed, and why
    failure: str  # why the submission is not gradable ("" when it is)


def _grade(target: str, options: GradeOptions) -> SubmissionReport:
    return _report(target, options, _observe(target, options))


def _observe(target: str, options: GradeOptions) -> _Run:
    zygote = zygote_for(_child_environment())
    deadline = time.monotonic() + options.timeout  # the zygote's start-up is not the job's
    attempts: list[Attempt] = []
    stage: dict | None = None
    done: dict[str, dict] = {}
    missing: dict[str, _Missing] = {}
    only: list[str] | None = None
    failure = ""  # why the submission is not gradable, if it is not
    while True:
        attempt = _attempt(zygote, target, options, deadline, only)
        attempts.append(attempt)
        if attempt.internal_error:
            failure = f"moco-ref internal error: {attempt.internal_error}"
            break
        if attempt.stage is None or (stage is not None and attempt.stage != stage):
            if stage is None:
                failure = _not_loaded(attempt, options)
                break
            for name in _remaining(stage, done, missing):
                missing[name] = _Missing("the submission loaded differently in a fresh process "
                                         "and could not be observed again", False)
            break
        stage = attempt.stage
        progress = False
        for name, payload in attempt.parts.items():
            if name in stage.get("parts", []) and name not in done and name not in missing:
                done[name] = payload
                progress = True
        if attempt.corrupt:
            for name in _remaining(stage, done, missing):
                missing[name] = _Missing(f"the observation channel was tampered with "
                                         f"({attempt.corrupt})", False)
            break
        running = attempt.started_part
        if running is not None and running not in done and running not in missing:
            missing[running] = _Missing(*_why_unfinished(attempt, options))
            progress = True
        remaining = _remaining(stage, done, missing)
        if not remaining or attempt.result is not None:
            for name in remaining:  # finished, yet not observed: not the worker's doing
                missing[name] = _Missing("no observation was sent for it", False)
            break
        if attempt.timed_out or deadline - time.monotonic() < MIN_RETRY_SECONDS:
            for name in remaining:
                missing[name] = _Missing(
                    f"not observed: the submission's {options.timeout:g} s ran out", True)
            break
        if not progress:
            for name in remaining:
                missing[name] = _Missing(f"{attempt.exit_text()} before observing it", False)
            break
        only = remaining  # the rest, in a fresh process
    return _Run(attempts, stage, done, missing, failure)


def _remaining(stage: dict, done: dict, missing: dict) -> list[str]:
    return [name for name in stage.get("parts", []) if name not in done and name not in missing]


def _why_unfinished(attempt: Attempt, options: GradeOptions) -> tuple[str, bool]:
    if attempt.part_timed_out:
        return (f"it did not finish within its {options.check_timeout:g} s "
                "(--check-timeout): an endless loop, or far more work than the probe needs?",
                True)
    if attempt.timed_out:
        return (f"the submission did not finish within {options.timeout:g} s of wall-clock "
                "time and was stopped: an endless loop, or far more work than the probe needs?",
                True)
    text = attempt.exit_text() + " while it was being observed"
    if attempt.killed_by_sigkill():
        text += f" (out of memory? the limit is {options.memory_mb} MB of address space)"
    tail = attempt.stderr.strip()[-2000:]
    if tail:
        text += f"\n--- end of its stderr ---\n{tail}"
    return text, False


def _not_loaded(attempt: Attempt, options: GradeOptions) -> str:
    """Why a submission that never reached observation is not gradable."""
    if attempt.result is not None and not attempt.result.get("gradable"):
        trace = attempt.result.get("traceback")
        return str(trace or f"failed while: {attempt.result.get('stage')}")
    if attempt.corrupt:
        return f"the observation channel was tampered with: {attempt.corrupt}"
    if attempt.timed_out:
        return (
            f"timed out after {options.timeout:g} s while loading the submission (before any "
            "observation): top-level work such as a training run? Notebooks skip it unless "
            "--execute-all-cells is given."
        )
    cause = attempt.exit_text()
    if attempt.killed_by_sigkill():
        cause += f" (out of memory? the limit is {options.memory_mb} MB of address space)"
    tail = attempt.stderr.strip()[-4000:]
    return f"{cause} before any observation was recorded" + (
        f"\n--- end of its stderr ---\n{tail}" if tail else ""
    )


def _joined(attempts: list[Attempt], stream: str) -> str:
    if len(attempts) == 1:
        return getattr(attempts[0], stream)
    pieces = []
    for number, attempt in enumerate(attempts, start=1):
        label = "all parts" if attempt.asked is None else "parts " + ", ".join(attempt.asked)
        pieces.append(f"--- process {number} ({label}) ---\n{getattr(attempt, stream)}")
    return "\n".join(pieces)


def _report(target: str, options: GradeOptions, run: _Run) -> SubmissionReport:
    report = _report_shell(target, options, run)
    if report.traceback:
        return report
    return _judged(report, options, run.stage, run.done, run.missing)


def _report_shell(target: str, options: GradeOptions, run: _Run) -> SubmissionReport:
    """The report before judging: style, notes, output; ``traceback`` set when the submission
    is not gradable."""
    attempts, done, missing = run.attempts, run.done, run.missing
    stage = run.stage
    result = next((a.result for a in attempts if a.result is not None), None) or {}
    style = (stage or {}).get("style") or result.get("style") or options.style or "unknown"
    notes = list((stage or result).get("notes") or [])
    refused = sorted({name for a in attempts
                      for name in (a.result or {}).get("refused_imports", [])})
    if refused:
        notes.append("the submission tried to import the reference implementation ("
                     + ", ".join(refused) + "); the import was refused")
    report = SubmissionReport(
        submission=target,
        style=style,
        gradable=False,
        notes=notes,
        stdout=_joined(attempts, "stdout"),
        stderr=_joined(attempts, "stderr"),
    )
    if run.failure:
        report.traceback = run.failure
        return report
    if options.style is not None and style != options.style:
        report.traceback = (f"the submission's process reported style {style!r} where "
                            f"{options.style!r} was asked for: the record was tampered with")
        return report
    observed_any = any("data" in payload or "failed" in payload for payload in done.values())
    if not observed_any and not any(gap.timed_out for gap in missing.values()):
        # crashed before any observation: not gradable, as at load time
        report.traceback = "\n".join(f"{name}: {gap.reason}" for name, gap in missing.items())
    return report


# --------------------------------------------------------------------------- the verdict


def _assembled(report: SubmissionReport, options: GradeOptions, stage: dict, done: dict,
               missing: dict[str, _Missing]) -> tuple[dict, dict[str, _Missing], dict]:
    """The observation record to judge: the validated parts, and a placeholder for each part
    that is missing, failed or invalid. Returns ``(observations, missing, markers)``."""
    from moco_ref.judge.record import validate_part

    style = report.style
    missing = dict(missing)
    entries: dict[str, object] = {}
    meta: list[dict] = []
    for name, payload in done.items():
        if "failed" in payload:
            missing[name] = _Missing("observing it raised:\n" + str(payload["failed"]), False)
            continue
        with _JUDGE_LOCK:  # the probe is rebuilt with torch's global RNG: one at a time
            problem = validate_part(style, name, payload.get("data"), payload.get("meta"),
                                    options)
        if problem:
            missing[name] = _Missing(
                "its observations are inconsistent with the probe the grader ran, so they were "
                f"discarded: {problem}", False)
            continue
        entries[name] = payload["data"]
        meta.append(payload.get("meta") or {})
        if isinstance(payload["data"], dict) and payload["data"].get(parts_module.INPUT_MUTATED):
            report.notes.append(
                "train_moco modified its input x (the probe's images) in place; its recorded "
                "forwards could not be cross-checked against the probe's own images")
    markers = {}
    for name in missing:
        marker = f"{parts_module.MISSING_MARKER} [{name}]"
        markers[name] = marker
        entries[name] = parts_module.placeholder(style, name, marker, options)
    observations = parts_module.assemble(style, meta, entries)
    if style == "components":
        parts_module.fill_components_meta(observations, stage.get("defined") or {}, options)
    if style == "lab" and "probe" not in observations:
        from moco_ref.observe.strategies import default_lab_probe

        observations["probe"] = default_lab_probe(options.seed).to_dict()
    observations.setdefault("style", style)
    return observations, missing, markers


def _judged(report: SubmissionReport, options: GradeOptions, stage: dict, done: dict,
            missing: dict[str, _Missing]) -> SubmissionReport:
    observations, missing, markers = _assembled(report, options, stage, done, missing)
    try:
        from moco_ref.judge.judge import judge

        with _JUDGE_LOCK:
            results, inferred = judge(observations, report.style, options)
    except Exception as exc:  # noqa: BLE001 - a grader bug must not end the whole run
        report.traceback = "moco-ref internal error while judging (please report it):\n" + (
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        )
        return report
    report.gradable = True
    report.results = [_unobserved(result, missing, markers) for result in results]
    report.inferred = dict(inferred)
    return report


def _unobserved(result: CheckResult, missing: dict[str, _Missing],
                markers: dict[str, str]) -> CheckResult:
    """A check that could not be judged because a part it needs was not observed reports why:
    ``timeout`` when that part ran out of time, ``error`` otherwise — never ``passed``."""
    if result.status in (Status.PASSED, Status.NOT_APPLICABLE):
        return result
    gaps = [(name, missing[name]) for name, marker in markers.items()
            if marker in result.message]
    if not gaps:
        return result
    status = Status.TIMEOUT if any(gap.timed_out for _, gap in gaps) else Status.ERROR
    message = "\n".join(f"not judged: {name} was not observed: {gap.reason}"
                        for name, gap in gaps)
    return replace(result, status=status, message=message, details={})


# --------------------------------------------------------------------------- observe only


def observe_sandboxed(target: str, options: GradeOptions | None = None) -> dict:
    """Observe ``target`` in the sandbox, exactly as grading does, without judging:
    ``{"gradable", "style", "notes", "traceback", "observations", "missing"}``. The
    observations are validated part by part; a missing or invalid part is replaced by the
    placeholder the judge would see, and named with its reason in ``missing``."""
    options = options or GradeOptions()
    try:
        run = _observe(target, options)
    except Exception as exc:  # noqa: BLE001
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return {"gradable": False, "style": options.style, "notes": [], "observations": {},
                "missing": {}, "traceback": f"moco-ref internal error:\n{trace}"}
    report = _report_shell(target, options, run)
    record = {"gradable": False, "style": report.style, "notes": report.notes,
              "observations": {}, "missing": {}, "traceback": report.traceback}
    if report.traceback:
        return record
    observations, missing, _ = _assembled(report, options, run.stage, run.done, run.missing)
    record.update(gradable=True, observations=observations, notes=report.notes,
                  missing={name: gap.reason for name, gap in missing.items()})
    return record
