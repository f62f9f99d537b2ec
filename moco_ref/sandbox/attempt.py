"""One process observing (some parts of) a submission: spawn it in the zygote with its
pipes, follow its frames against the job's and the part's deadlines, stop it, and keep what
it left behind (an ``Attempt``)."""

from __future__ import annotations

import fcntl
import functools
import importlib.metadata
import math
import os
import pkgutil
import queue
import secrets
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

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
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import ObservedPart, Stage
from moco_ref.probe.source import imported_helper, is_module_target, may_be_helper
from moco_ref.sandbox import procs
from moco_ref.sandbox.capture import StreamDrain
from moco_ref.sandbox.client import JobHandle, Zygote
from moco_ref.sandbox.jobspace import SCRATCH

STOP_GRACE_SECONDS = 5.0
MAX_HELPER_BYTES = 4 * 2**20  # a helper module beside the submission larger than this stays


def copy_submission(target: str, folder: Path, *, helpers: bool = True) -> str:
    """A copy of the submission for its process to load: the file, and (when ``helpers``:
    the folder is the student's own) its helper modules beside it (``helper_files``). A
    sibling that is not one (a classmate, a link, a file that cannot be parsed, one named
    like an installed module) is not copied, so the submission can neither import it nor
    read it through its own folder."""
    source = Path(target).resolve()
    folder.mkdir(parents=True)
    shutil.copy2(source, folder / source.name)
    for sibling in helper_files(source, helpers):
        shutil.copy2(sibling, folder / sibling.name)
    return str(folder / source.name)


def helper_files(target: str | Path, helpers: bool = True) -> list[Path]:
    """The helper modules beside a submission that its process gets (see
    ``copy_submission``), sorted: the candidates (``_helper_candidates``) that shadow no
    installed module. Without ``helpers`` (classmates side by side) only the modules the
    submission imports that are no submission of its style (``imported_helper``)."""
    return [sibling for sibling in _helper_candidates(target, helpers)
            if not shadowed_module(sibling.stem)]


def refused_helpers(target: str | Path, helpers: bool = True) -> list[str]:
    """Why each helper module beside a submission that would shadow an installed module is
    not given to it, one sentence each naming the file and the module (the report's note)."""
    return [f"{sibling.name} beside the submission was not given to it as a helper module: "
            f"it is named like {shadowed_module(sibling.stem)} and would shadow it; rename it"
            for sibling in _helper_candidates(target, helpers) if shadowed_module(sibling.stem)]


def _helper_candidates(target: str | Path, helpers: bool = True) -> list[Path]:
    """The ``.py`` files beside a submission that may be its helpers, sorted: regular files
    (a link is never followed, wherever it points), not too large, that the submission
    imports whatever they define (``imported_helper``) or — when ``helpers``: the folder is
    the student's own — that bind no MoCo entry point of their own
    (``moco_ref.probe.source.may_be_helper``: a file that does is graded on its own, or is a
    classmate's)."""
    source = Path(target).resolve()
    return [sibling for sibling in sorted(source.parent.glob("*.py"))
            if sibling != source and not sibling.is_symlink() and sibling.is_file()
            and sibling.stat().st_size <= MAX_HELPER_BYTES
            and (imported_helper(sibling, source) or helpers and may_be_helper(sibling))]


def shadowed_module(name: str) -> str:
    """What a top-level module named ``name`` would shadow, in words (``"the standard
    library's random"``, ``"the installed module numpy"``), or ``""``
    (``installed_top_level_names``)."""
    stdlib, installed = installed_top_level_names()
    if name in stdlib:
        return f"the standard library's {name}"
    return f"the installed module {name}" if name in installed else ""


@functools.cache
def installed_top_level_names() -> tuple[frozenset[str], frozenset[str]]:
    """``(standard library, installed)``: the top-level module names of Python's standard
    library (``sys.stdlib_module_names``, the built-in modules) and of what is installed —
    the modules and packages in the ``sys.path`` entries that are site-packages or the
    virtual environment (``pkgutil.iter_modules``, which lists without importing) and the
    top-level names the installed distributions declare
    (``importlib.metadata.packages_distributions``). Read on the grader's side, importing
    nothing; the working folder is never among them."""
    stdlib = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)
    roots = [entry for entry in sys.path if _is_installed_root(entry)]
    installed = {module.name for module in pkgutil.iter_modules(roots)}
    try:
        installed |= {name.split("/", 1)[0]
                      for name in importlib.metadata.packages_distributions()}
    except Exception:  # noqa: BLE001 - broken metadata: the listing above still holds
        pass
    return stdlib, frozenset(installed) - stdlib


def _is_installed_root(entry: str) -> bool:
    """Whether the ``sys.path`` entry holds installed packages: a site-packages (or
    dist-packages) folder, or a folder of the active virtual environment."""
    if not entry or not os.path.isdir(entry):
        return False
    path = Path(entry).resolve()
    if path == Path.cwd().resolve():
        return False
    if path.name in ("site-packages", "dist-packages"):
        return True
    prefix = Path(sys.prefix).resolve()
    return sys.prefix != sys.base_prefix and prefix in path.parents


def copy_module(name: str, folder: Path) -> None:
    """The top-level package (or module) of the dotted ``name``, found where the grader would
    import it from (its working folder first, then ``sys.path``) without importing it,
    copied into ``folder``. Nothing is copied when it is not found: loading it then fails
    inside the sandbox, with Python's own message."""
    folder.mkdir(parents=True, exist_ok=True)
    top = name.split(".", 1)[0]
    for root in [os.getcwd(), *(entry for entry in sys.path if entry)]:
        package, module = Path(root) / top, Path(root) / f"{top}.py"
        if package.is_dir():
            shutil.copytree(package, folder / top, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".*"), symlinks=False)
            return
        if module.is_file():
            shutil.copy2(module, folder / module.name)
            return


def _bundle(folder: Path) -> int:
    """A read end holding ``folder`` as a tar stream (a sealed memory file: no path leads to
    it, and the job cannot change what it reads)."""
    fd = os.memfd_create("moco-ref-submission", os.MFD_CLOEXEC | getattr(
        os, "MFD_ALLOW_SEALING", 2))
    with os.fdopen(os.dup(fd), "wb") as handle:
        with tarfile.open(fileobj=handle, mode="w|") as archive:
            archive.add(folder, arcname=".", recursive=True)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        fcntl.fcntl(fd, 1033, 0x1 | 0x2 | 0x4 | 0x8)  # F_ADD_SEALS: seal, shrink, grow, write
    except OSError:
        pass
    return fd


@dataclass
class Attempt:
    """What one process observing (some parts of) a submission left behind."""

    stage: Stage | None = None
    parts: dict[str, ObservedPart] = field(default_factory=dict)  # by part
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
    original_folder: str = ""  # where the submission lies
    copy_folder: str = ""  # where its process loaded the copy from (shown as original_folder)
    refused_helpers: list[str] = field(default_factory=list)  # why, for each one not given
    wall_seconds: float = 0.0  # from the job's start until it ended or its time ran out

    def starved(self) -> str:
        """Why a job whose time ran out was starved of CPU by other processes (the grader's
        trouble, not the submission's timeout), or ``""`` (``starvation``, from the EXIT
        frame's figures)."""
        if not (self.timed_out or self.part_timed_out):
            return ""
        exit = self.exit or {}
        return starvation(self.wall_seconds, exit.get("cpu_seconds"),
                          exit.get("run_queue_seconds"))

    def exit_text(self) -> str:
        """How the submission's process ended, in words."""
        limit = (self.exit or {}).get("limit")
        if isinstance(limit, str) and limit:
            return f"the job went over a limit ({limit[:300]}), so it was stopped"
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


STARVED_CPU_SHARE = 1 / 3  # a job that got less of its wall time on a CPU may be starved


def starvation(wall_seconds: float, cpu_seconds, run_queue_seconds) -> str:
    """Whether a job that ran out of wall-clock time was starved: it used less than a third
    of that time on a CPU (``cpu_seconds``, all its processes and threads) and spent most of
    the rest runnable, waiting for a CPU (``run_queue_seconds``, summed over its threads),
    not sleeping. Returns why, in words (for staff), or ``""`` — the timeout is then the
    submission's own: a job that slept or waited on itself until its time ran out. A job
    whose many threads queue behind each other on its own CPU still gets its wall time of
    CPU, so its own waiting never counts as starvation. Unknown figures (no EXIT frame, a
    kernel without schedstat) are never starvation."""
    if not isinstance(cpu_seconds, (int, float)) or not isinstance(run_queue_seconds,
                                                                     (int, float)):
        return ""
    if wall_seconds <= 0 or cpu_seconds >= STARVED_CPU_SHARE * wall_seconds:
        return ""
    if run_queue_seconds < (wall_seconds - cpu_seconds) / 2:
        return ""
    return (f"the job was starved of CPU by other processes: in {wall_seconds:.1f} s of "
            f"wall-clock time it ran {cpu_seconds:.1f} s and waited {run_queue_seconds:.1f} s "
            "for a CPU")


class CpuShares:
    """A fair CPU share for concurrent jobs: while no more jobs run than there are CPUs, each job
    (and every process and thread it starts, which inherit it) runs on a CPU of its own, so
    a job that spawns threads slows only itself, never a classmate graded beside it.

    Beyond that many jobs (``-j`` above the CPU count) a job is not pinned, and its weight
    comes from the scheduler's autogroups: every job's supervisor starts a session of its
    own (``os.setsid``), and with ``/proc/sys/kernel/sched_autogroup_enabled`` = 1 (the
    default of most distributions' kernels) each session is one scheduling group, and the
    groups share a CPU equally whatever their thread counts — a job of 8 busy threads and
    one of 1 get half each, not 8/9 and 1/9. With autogroup off, or the grader inside a CPU
    cgroup (as in most containers, where the kernel ignores autogroups), nothing weighs jobs
    beyond this affinity: the scheduler then shares by thread, and ``nice`` cannot make up
    for it (threads inherit their creator's nice value, so a job's weight still grows with
    its thread count), nor can a cgroup, which the grader may not create. What remains is
    ``starvation``: a job starved that way until its time ran out is the grader's trouble,
    graded again alone, never charged to the student."""

    def __init__(self, cpus=None) -> None:
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self._taken: set[int] = set()
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            free = [cpu for cpu in self.cpus if cpu not in self._taken]
            if not free:
                return None
            self._taken.add(free[0])
            return free[0]

    def give_back(self, cpu: int | None) -> None:
        with self._lock:
            self._taken.discard(cpu)


CPU_SHARES = CpuShares()


def run_attempt(zygote: Zygote, target: str, options: GradeOptions, deadline: float,
                only_parts: list[str] | None, *, helpers: bool = True) -> Attempt:
    """One process observing ``target`` (``only_parts`` of it). ``helpers``: whether the
    ``.py`` files beside it may be its helper modules (never in a folder shared by several
    students). The job gets a CPU of its own while one is free (``CpuShares``)."""
    cpu = CPU_SHARES.take()
    try:
        return _run_attempt(zygote, target, options, deadline, only_parts, helpers, cpu)
    finally:
        CPU_SHARES.give_back(cpu)


def _run_attempt(zygote: Zygote, target: str, options: GradeOptions, deadline: float,
                 only_parts: list[str] | None, helpers: bool, cpu: int | None) -> Attempt:
    confined = zygote.rung == "confined"
    attempt = Attempt(asked=only_parts)
    token, nonce = secrets.token_hex(16), new_nonce()
    job_ids = zygote.take_job_ids() if confined else None
    try:
        return _attempt_in(zygote, attempt, token, nonce, target, options, deadline,
                           only_parts, cpu, helpers, job_ids)
    finally:
        zygote.give_back_job_ids(job_ids)


def _attempt_in(zygote: Zygote, attempt: Attempt, token: str, nonce: bytes, target: str,
                options: GradeOptions, deadline: float, only_parts: list[str] | None,
                cpu: int | None, helpers: bool, job_ids: tuple[int, int] | None) -> Attempt:
    sandboxed = zygote.sandboxed
    confined = zygote.rung == "confined"
    events: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="moco-ref-grade-",
                                     ignore_cleanup_errors=True) as scratch:
        workdir = Path(scratch) / "work"
        workdir.mkdir()
        copy = Path(scratch) / "submission"
        import_root = os.getcwd()
        if not is_module_target(target):
            attempt.original_folder = str(Path(target).resolve().parent)
            attempt.refused_helpers = refused_helpers(target, helpers)
            target = copy_submission(target, copy, helpers=helpers)
        elif sandboxed or confined:  # the module (its top-level package) is sent
            copy_module(target, copy)
        job_scratch = SCRATCH if sandboxed else os.path.join(zygote.jobs_root, token) \
            if confined else os.path.realpath(scratch)
        if sandboxed or confined:  # the job sees its own scratch only; files come as a tar
            inside = f"{job_scratch}/submission"
            if not is_module_target(target):
                target = f"{inside}/{Path(target).name}"
            import_root = inside
            attempt.copy_folder = inside if attempt.original_folder else ""
            bundle = _bundle(copy)
        else:
            attempt.copy_folder = os.path.realpath(copy) if attempt.original_folder else ""
            bundle = None
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
            "target": target,
            "options": options.for_the_probe().to_dict(),
            "import_root": import_root,
            "scratch": job_scratch,
            "memory_mb": options.memory_mb,
            # twice the wall time: one busy thread meets the wall-clock limit first, work
            # spread over threads and processes meets this one
            "cpu_seconds": max(1, math.ceil(2 * options.timeout)) if options.timeout else None,
            "sandboxed": sandboxed,
            "parts": only_parts,
            "cpus": None if cpu is None else [cpu],
        }
        job_uid = job_ids[0] if job_ids and zygote.job_ids else None  # else: a gid only
        if confined:  # the two-process builder probe needs loopback TCP; LAB code none
            request["confined"] = {"uid": job_uid,
                                   "gid": job_ids[1] if job_ids else None,
                                   "tcp": options.style not in ("lab", "components")}
        fds = [out_w, err_w, channel_w] + ([bundle] if bundle is not None else [])
        handle = None
        try:
            handle = zygote.spawn(request, fds, events)
        except Exception as exc:  # noqa: BLE001
            attempt.internal_error = f"{type(exc).__name__}: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        if handle is not None:
            started = time.monotonic()  # the job exists (spawn waits for the zygote's word)
            _follow(attempt, handle, events, options, deadline)
            attempt.wall_seconds = time.monotonic() - started
            _stop(zygote, handle, token, job_uid)
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
        attempt.stage = Stage.from_frame(payload)
    elif frame.kind == PART_START:
        attempt.started_part = str(payload.get("part"))
    elif frame.kind == PART:
        part = ObservedPart.from_frame(payload)
        if part is not None:
            attempt.parts[part.name] = part
            if attempt.started_part == part.name:
                attempt.started_part = None
    elif frame.kind == RESULT and attempt.result is None:
        attempt.result = payload
    elif frame.kind == EXIT and attempt.exit is None:
        attempt.exit = payload


def _follow(attempt: Attempt, handle: JobHandle, events: queue.Queue, options: GradeOptions,
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


def _stop(zygote: Zygote, handle: JobHandle, token: str, job_uid: int | None = None) -> None:
    """End the job: ask the supervisor (it kills the job's processes), then make sure (a
    confined job with a uid of its own: every process of that uid)."""
    pid = handle.pid
    if pid is None:
        return
    if zygote.sandboxed:  # the sandbox's pids: only the zygote can name them
        def send(number: int) -> None:
            zygote.signal(handle, number)
    else:
        def send(number: int) -> None:
            for kill in (os.killpg, os.kill) if number == signal.SIGKILL else (os.kill,):
                try:
                    kill(pid, number)
                except OSError:
                    pass
    if not handle.exited.is_set():
        send(signal.SIGTERM)
        if not handle.exited.wait(STOP_GRACE_SECONDS):
            send(signal.SIGKILL)
            handle.exited.wait(STOP_GRACE_SECONDS)
    if not zygote.sandboxed:  # a PID namespace ends the sandboxed job's processes with it
        procs.kill_until_gone(
            lambda: procs.job_members(roots=[pid] if procs.alive(pid) else [], sessions=[pid],
                                      token=token)
            | (procs.processes_of_user(job_uid) if job_uid else set()),
            deadline_seconds=5.0,
        )
