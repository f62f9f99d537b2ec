"""The grader's end of the warm ``zygote``: start one per environment, spawn jobs in it,
and hear when they start and end.

Isolation (``MOCO_REF_ISOLATION``, or ``moco-ref grade --isolation``) is a ladder of rungs:

- ``sandbox`` (the default): the strongest rung that starts here — ``bwrap``, else
  ``confined`` — and grading is refused (``IsolationUnavailable``, saying why for each rung)
  only when neither can start; never silently weakened below them;
- ``bwrap``: the zygote lives in a bubblewrap sandbox (``bwrap``) that holds the Python
  installation and the observing side of moco_ref only; each job gets namespaces of its own
  (``jobspace``) and its process is confined before the submission loads (``confine``);
- ``confined``: for a container that allows no namespace (Docker's default profile, as on
  Gradescope and PrairieLearn): the zygote runs as the grader's user with a clean
  environment and only the observing side importable (a copied view); each job runs in a
  scratch folder of its own as an unprivileged uid of its own when the grader is root
  (``JOB_IDS``; a gid of its own when it must stay uid 0), restricted by Landlock to
  read-only system, Python and view and read-write scratch, under the seccomp filter and
  rlimits, in a session of its own (``confine.confine_in_place``); ``NOT_PROTECTED`` says
  what that leaves open;
- ``processes``: for trusted code only — the submission runs as the grader's user, with the
  grader's file system; a supervisor and ``/proc`` sweeps (``procs``) still stop everything
  it starts.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import moco_ref
from moco_ref.sandbox import bwrap, procs
from moco_ref.sandbox.capture import StreamDrain

_PACKAGE_ROOT = str(Path(moco_ref.__file__).resolve().parent.parent)
ISOLATION_VARIABLE = "MOCO_REF_ISOLATION"  # sandbox (default) | bwrap | confined | processes
ISOLATION_MODES = ("sandbox", "bwrap", "confined", "processes")
RUNGS = ("bwrap", "confined")  # the ladder, strongest first
JOB_IDS = range(61100, 61200)  # the confined rung's job uids (and gids) when the grader is root
PROCESSES_ONLY = ("processes: for trusted code only (the submission runs as the grader's "
                  "user and can read and write what it can)")
NOT_PROTECTED = {
    "bwrap": ("not protected: the host kernel's own bugs; CPU caches shared between jobs; "
              "memory parked in a socket's queue (a memory file sent and closed: no cgroup "
              "counts it)"),
    "confined": ("not protected: the container's network for builder-style jobs (the "
                 "two-process probe needs loopback TCP; LAB jobs get no socket but UNIX), "
                 "the container's process list and command lines in /proc (pass secrets by "
                 "environment or file, never on the command line), /dev/shm shared between "
                 "jobs (what a job keeps there counts against its memory and is removed at its "
                 "end{shared}), memory parked in a socket's queue (no cgroup counts "
                 "it){root}{abi}"),
    "processes": "not protected: everything (the submission runs as the grader)",
}
ZYGOTE_START_SECONDS = 300.0  # importing torch on a busy machine can take a while


class IsolationUnavailable(RuntimeError):
    """The sandbox cannot run here; the message says why, in one line."""


def isolation_mode(isolation: str | None = None) -> str:
    """The isolation asked for (``--isolation``), else the environment's default
    (``MOCO_REF_ISOLATION``), else ``sandbox`` (the ladder)."""
    mode = isolation or os.environ.get(ISOLATION_VARIABLE, "sandbox").strip().lower() or \
        "sandbox"
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation {mode!r}: expected one of {ISOLATION_MODES}")
    return mode


def sandboxed(isolation: str | None = None) -> bool:
    """Whether ``isolation`` isolates untrusted code (any rung of the ladder)."""
    return isolation_mode(isolation) != "processes"


def current_zygote(*, reference: bool = False, wait: bool = True,
                   isolation: str | None = None) -> Zygote:
    """The zygote for ``isolation`` (see ``isolation_mode``); ``IsolationUnavailable`` when
    no rung asked for can run here. ``reference``: the submission may import the reference
    (``--allow-reference-import``), so a sandbox whose view holds it. ``wait=False``: only
    started (``warm_up``). A rung that cannot start is tried again next time (where
    namespaces are refused, bwrap fails at once): a passing refusal never weakens the rest
    of a run."""
    mode = isolation_mode(isolation)
    env = child_environment()
    if mode == "processes":
        return zygote_for(env, rung="processes", wait=wait)
    rungs = RUNGS if mode == "sandbox" else (mode,)
    reasons = []
    for rung in rungs:
        try:
            return zygote_for(env, rung=rung, reference=reference, wait=wait)
        except IsolationUnavailable as exc:
            reasons.append(f"{rung}: {exc}")
    if len(reasons) == 1:
        raise IsolationUnavailable(reasons[0].split(": ", 1)[1])
    raise IsolationUnavailable("no rung of the isolation ladder can start here (" +
                               "; ".join(reasons) + ")")


def isolation_description(isolation: str | None = None) -> str:
    """The isolation in force here, in words (raises ``IsolationUnavailable``)."""
    if not sandboxed(isolation):
        return PROCESSES_ONLY
    return current_zygote(isolation=isolation).namespaces


def not_protected(isolation: str | None = None) -> str:
    """What the rung in force does not protect, in one line (raises like the start)."""
    if not sandboxed(isolation):
        return NOT_PROTECTED["processes"]
    zygote = current_zygote(isolation=isolation)
    if zygote.rung != "confined":
        return NOT_PROTECTED[zygote.rung]
    from moco_ref.sandbox import landlock

    root = ("; jobs run as uid 0 without capabilities (the Python installation is not "
            "readable by other users), so root's process limit is not enforced (the job's "
            "watch counts every 0.1 s)" if zygote.jobs_as_root else "")
    gaps = landlock.missing(landlock.abi())
    shared = ("; jobs of uid 0 may open each other's files there" if zygote.jobs_as_root else
              "" if zygote.job_ids else
              "; jobs of the grader's uid are told apart by when their files appear, so a "
              "file made there while two jobs run counts against both and the first to end "
              "removes it unless a process holds it")
    return NOT_PROTECTED["confined"].format(
        root=root, abi=("; " + ", ".join(gaps)) if gaps else "", shared=shared)


class JobHandle:
    def __init__(self, job: str, events: queue.Queue) -> None:
        self.job = job
        self.events = events
        self.started = threading.Event()
        self.pid: int | None = None
        self.exited = threading.Event()
        self.status: int | None = None
        self.zygote_died = False


class Zygote:
    """The grader's end of one zygote process (see ``zygote``), on one rung: ``bwrap``,
    ``confined`` or ``processes``."""

    def __init__(self, env: dict, *, rung: str = "processes", reference: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._scratch = tempfile.mkdtemp(prefix="moco-ref-zygote-")
        self.rung = rung
        self.sandboxed = rung == "bwrap"  # the job lives in namespaces of its own
        self.host_ids: tuple[int, int] | None = None  # (uid, gid) it runs as, the grader root
        self.job_ids = False  # confined: each job gets a uid of its own (JOB_IDS)
        self.jobs_root = ""  # confined: the folder holding each job's scratch
        self._job_ids_taken: set[int] = set()
        argv = [sys.executable, "-m", "moco_ref.sandbox.zygote", "--fd", str(theirs.fileno())]
        cwd = self._scratch
        try:
            if rung == "bwrap":
                argv = bwrap.command(theirs.fileno(), os.path.join(self._scratch, "etc"),
                                     hidden=_grader_paths(), reference=reference)
                argv.append("--sandboxed")
                with _HOST_IDS_LOCK:  # an unprivileged host user of its own, when root
                    self.host_ids = bwrap.host_ids(set(_HOST_IDS_TAKEN))
                    if self.host_ids is not None:
                        _HOST_IDS_TAKEN.add(self.host_ids[0])
                if self.host_ids is not None:
                    argv = bwrap.launch_command(argv, *self.host_ids)
            elif rung == "confined":
                argv, env, cwd = self._confined_start(theirs.fileno(), reference)
        except OSError as exc:  # no bwrap, or no unprivileged host user to run it as
            theirs.close()
            ours.close()
            self._release_host_ids()
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise IsolationUnavailable(str(exc)) from None
        try:
            self.process = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                cwd=cwd,  # nothing importable from where the grader runs
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
        self._jobs: dict[str, JobHandle] = {}
        self._jobs_lock = threading.Lock()
        self.alive = True
        self._hello_lock = threading.Lock()
        self._hello_message: dict | None = None

    def _confined_start(self, control_fd: int, reference: bool) -> tuple[list, dict, str]:
        """The confined rung's zygote: its command, a clean environment whose only moco_ref
        is a copy of the observing side (``bwrap.VIEW_FILES``), the folder it starts in and
        the one each job's scratch goes in (passable, not listable, by the job uids)."""
        from moco_ref.sandbox import confined_view

        view = os.path.join(self._scratch, "view")
        self.jobs_root = os.path.join(self._scratch, "jobs")
        for folder in (view, self.jobs_root):
            os.mkdir(folder)
        os.chmod(self._scratch, 0o711)
        os.chmod(self.jobs_root, 0o711)
        confined_view.copy_view(view, reference=reference)
        rules = confined_view.rules(view, hidden=_grader_paths() + (self._scratch,))
        if os.geteuid() == 0:
            self.job_ids = confined_view.readable_by_others(
                [path for path, access in rules])
        env = dict(bwrap.ENVIRONMENT, PYTHONPATH=bwrap.sandbox_pythonpath(
            view, relocated=False))
        argv = [sys.executable, "-m", "moco_ref.sandbox.zygote", "--fd", str(control_fd),
                "--confined", json.dumps(rules)]
        return argv, env, view

    def take_job_ids(self) -> tuple[int, int] | None:
        """A uid and gid for one confined job (``None``: the job keeps the grader's); a job
        that stays uid 0 (``jobs_as_root``) takes the gid only (``confine.become_job_group``:
        its ``/dev/shm`` files are told apart by it)."""
        if not self.job_ids and not self.jobs_as_root:
            return None
        with _HOST_IDS_LOCK:
            ids = bwrap.host_ids(self._job_ids_taken | _HOST_IDS_TAKEN, among=JOB_IDS)
            if ids is not None:
                self._job_ids_taken.add(ids[0])
            return ids

    def give_back_job_ids(self, ids: tuple[int, int] | None) -> None:
        if ids is not None:
            with _HOST_IDS_LOCK:
                self._job_ids_taken.discard(ids[0])

    @property
    def hello(self) -> dict:
        """The zygote's first message, waited for on first use (the process starts at once, so
        its imports overlap whatever the grader does meanwhile); raises like the start."""
        with self._hello_lock:
            if self._hello_message is None:
                self._hello_message = self._hello()
                self._thread = threading.Thread(target=self._dispatch, daemon=True,
                                                name="moco-ref-zygote")
                self._thread.start()
            return self._hello_message

    def _hello(self) -> dict:
        self.sock.settimeout(ZYGOTE_START_SECONDS)
        try:
            data = self.sock.recv(1 << 16)
        except (OSError, TimeoutError):
            data = b""
        self.sock.settimeout(None)
        if not data:
            self.close()
            tail = self._stderr.finish(timeout=1.0).strip()[-4000:]
            if self.rung != "processes":
                last = tail.splitlines()[-1] if tail else "it exited without a word"
                raise IsolationUnavailable(f"{self.rung} cannot run here ({last})")
            raise RuntimeError(f"the grading zygote did not start:\n{tail}")
        hello = json.loads(data)
        if self.rung != "processes" and not hello.get("isolation"):
            self.close()
            where = "inside bwrap " if self.rung == "bwrap" else ""
            raise IsolationUnavailable(f"a job cannot be confined {where}here ("
                                       f"{hello.get('isolation_error')})")
        return hello

    @property
    def namespaces(self) -> str:
        """The isolation its jobs get, in words (from the hello, before any job ran)."""
        if self.rung == "processes":
            return PROCESSES_ONLY
        words = self.hello.get("isolation", "")
        if self.rung == "confined":
            uid = ("an unprivileged uid of its own per job" if self.job_ids else
                   "uid 0 without capabilities (a gid of its own per job)"
                   if self.jobs_as_root else f"the grader's uid {os.geteuid()}")
            words = words.replace("{user}", uid)
        return words

    @property
    def jobs_as_root(self) -> bool:
        """A confined rung whose jobs stay uid 0 without capabilities: the grader is root but
        its Python installation is not readable by other users, so no job uid can run it."""
        return self.rung == "confined" and os.geteuid() == 0 and not self.job_ids

    def spawn(self, request: dict, fds: list[int], events: queue.Queue) -> JobHandle:
        from moco_ref.sandbox.zygote import send

        self.hello  # noqa: B018 - started (or raising why not) before any job

        handle = JobHandle(request["job"], events)
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

    def signal(self, handle: JobHandle, number: int) -> None:
        """Signal the job's supervisor through the zygote (a sandboxed job's pids are the
        sandbox's, not the grader's)."""
        from moco_ref.sandbox.zygote import send

        try:
            with self._send_lock:
                send(self.sock, {"op": "signal", "job": handle.job, "signal": int(number)})
        except OSError:
            pass

    def _dispatch(self) -> None:
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
        self._release_host_ids()
        shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def host_uid(self) -> int:
        """The host uid its jobs run as (the grader's own when the grader is not root)."""
        return self.host_ids[0] if self.host_ids else os.getuid()

    def host_user(self) -> str:
        """The host user its jobs run as, in words, as the host sees the sandbox's processes
        (their uids and their user namespace's mapping)."""
        if self.rung == "confined":
            return (f"{JOB_IDS.start}-{JOB_IDS.stop - 1}, one per job (unprivileged, named by "
                    "no account)" if self.job_ids else
                    f"{os.getuid()} (the grader's own, without capabilities: the Python "
                    "installation is not readable by other users)" if self.jobs_as_root else
                    f"{os.getuid()} (the grader's own, which is not root)")
        if not self.sandboxed:
            return f"{os.getuid()} (the grader's own: no sandbox)"
        self.hello  # noqa: B018 - the sandbox is up
        seen = procs.host_identity(self.process.pid)
        if seen is None:
            return f"{self.host_uid} (the sandbox's processes could not be read)"
        uids, mapping = seen
        owner = ("an unprivileged uid of its own, named by no account" if self.host_ids else
                 "the grader's own, which is not root and cannot choose another")
        return (f"{'/'.join(map(str, sorted(set(uids))))} ({owner}; the sandbox's user "
                f"namespace maps {mapping})")

    def _release_host_ids(self) -> None:
        with _HOST_IDS_LOCK:
            if self.host_ids is not None:
                _HOST_IDS_TAKEN.discard(self.host_ids[0])


_ZYGOTES: dict[tuple, Zygote] = {}
_HOST_IDS_TAKEN: set[int] = set()  # host uids of this process's live sandboxes
_HOST_IDS_LOCK = threading.Lock()
_ZYGOTES_LOCK = threading.Lock()
_STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moco-ref-zygote-starter")
MAX_ZYGOTES = 3  # e.g. the real harness, a test stand-in, a pytester run


def zygote_for(env: dict, *, rung: str = "processes", reference: bool = False,
               wait: bool = True) -> Zygote:
    """The live zygote of ``rung`` started with ``env`` (one is started if needed), with the
    reference in its view when ``reference``; with ``wait`` its hello has arrived
    (``IsolationUnavailable`` when the rung cannot run). It is started by one thread that
    lives as long as the grader (``_STARTER``), whichever thread first needs it: bwrap's
    ``--die-with-parent`` follows the thread that forked it, and a grading pool's thread
    ends with its pool, which would take the zygote with it."""
    key = (rung, reference, *sorted(env.items()))
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.pop(key, None)
        if zygote is not None and (not zygote.alive or zygote.process.poll() is not None):
            zygote.close()  # died (or was killed): a new one
            zygote = None
        if zygote is None:
            while len(_ZYGOTES) >= MAX_ZYGOTES:  # the least recently used goes
                _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
            zygote = _STARTER.submit(Zygote, env, rung=rung, reference=reference).result()
        _ZYGOTES[key] = zygote  # most recently used last
    if wait:
        zygote.hello  # noqa: B018
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


def _grader_paths() -> tuple[str, ...]:
    """Folders of the grader's that must never be visible inside the sandbox, even when a
    bound folder holds them: where it runs, the home folder, the project checkout."""
    return tuple(path for path in (os.getcwd(), os.path.expanduser("~"), bwrap.grader_root())
                 if path and path != "/")


def child_environment() -> dict:
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

