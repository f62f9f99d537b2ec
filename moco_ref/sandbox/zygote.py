"""The warm process every graded submission is forked from:

    python -m moco_ref.sandbox.zygote --fd N

Importing torch costs ~2 s of CPU, and would be paid again by every submission. The zygote
pays it once: it imports torch,
the observer and the usual student imports, runs no submission code and no torch operation
(no thread pools; it checks it is single-threaded), and on request forks a fresh process per
job. Nothing a job does can reach the zygote's state — each job is its own copy-on-write
process, discarded at the end — so a submission still gets a fresh process.

With ``--sandboxed`` the zygote runs inside the bwrap sandbox (``bwrap``) as uid 0 of the
sandbox's user namespace — an unprivileged uid on the host (``launch``) — and first makes
the device nodes bwrap bound read-only (``jobspace.seal_devices``). Per job (``spawn`` on
the control socket, with the job's stdout, stderr and observation-channel pipe ends — and,
sandboxed, the submission as a tar stream — passed as file descriptors) the processes are::

    zygote ─ supervisor (own session, child subreaper, JobWatch)
               └ [init, pid 1 of the job's PID namespace, when sandboxed]
                    └ worker: rlimits, the submission unpacked into the scratch, confined,
                      then the submission and the observer

- The **supervisor** enters the job's namespaces (``jobspace.enter``: mount with a tmpfs
  scratch, a small /dev/shm and a devpts of its own, PID, network, IPC, UTS) when
  sandboxed, forks, and watches the job's memory (its processes', the memory files they
  hold and its tmpfs), its processes and threads and its CPU (``JobWatch``) until the
  worker ends, it is told to stop (SIGTERM, sent by the zygote on the grader's ``signal``
  request: the sandbox's pids mean nothing outside), or a limit is passed. It then kills
  everything left of the job (``procs``) and reports the worker's exit status and any limit
  on the channel (``EXIT`` frame).
- The **init** mounts a ``/proc`` of the job's own (``jobspace.fresh_proc``), reaps orphans
  and exits when the worker exits, which makes the kernel kill the rest of the namespace; it
  dies with the supervisor (``PR_SET_PDEATHSIG``).
- The **worker** unpacks the submission, confines itself (``confine``: its own user
  namespace as uid 65534, no capabilities, no_new_privs, seccomp), sets its limits and runs
  ``worker.run_job``. ``RLIMIT_NPROC`` is set once its user namespace exists: the kernel
  then counts the processes and threads of that namespace — of this job alone — against it
  (it would not for a job whose host uid is root), while the namespace's own ceiling, taken
  from the limit in force when it was made, stays the zygote's: one job's threads do not
  count against another's.

With ``--confined RULES`` (the confined rung, where no namespace can be made) the zygote runs
as the grader's user with a clean environment and a copied view of the observing side; a
job's supervisor makes its scratch folder (owned by the job's own uid when it has one),
watches as that uid (``setfsuid``: its ``/proc`` files need no ``CAP_SYS_PTRACE``), treats a
process of the job it cannot read twice in a row as over its limits, counts the job's files in
the container's ``/dev/shm`` (``shared_memory``), and at the end kills every process of the
job's uid and removes those files (the zygote again when it collects a killed supervisor);
the worker becomes that uid (or, a job that stays uid 0, takes a gid of its own), unpacks the
submission and takes ``confine.confine_in_place`` (Landlock over ``RULES`` and its scratch,
seccomp with System V IPC and POSIX message queues refused).

The zygote is a child subreaper too: a process whose supervisor was killed is re-parented to
it, and any child of the zygote that is not a live supervisor is killed with its descendants.
The control socket is a socketpair inherited from the grader (no path anyone else can open);
it is closed in every job right after the fork. When the grader closes it, the zygote kills
its jobs and exits.

Long on purpose: everything here runs inside the sandbox before and around each job (the
warm process, the supervisor and its job watch) and must be importable as one file the
sandbox's view binds, with no import of the grader's side.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import select
import signal
import socket
import stat
import sys
import time

from moco_ref.sandbox import procs

REQUIRED_PRELOAD = ("torch", "torch.nn", "torch.optim", "moco_ref.observe.worker")
# what LAB submissions and notebooks import, warmed while idle; not torchvision: LAB code does
# not use it and its import pulls in torch's compiler (1.4 s) — a submission that imports it
# pays that itself
OPTIONAL_PRELOAD = ("numpy", "nbformat", "hypothesis", "matplotlib.pyplot")
MAX_MESSAGE = 1 << 16
CHANNEL_FD = 3  # where the worker finds its observation channel
BUNDLE_FD = 4  # where a sandboxed job's worker finds its submission (a tar stream)
MAX_FILE_BYTES = 2**30
MESSAGE_QUEUE_BYTES = 819200  # RLIMIT_MSGQUEUE of a job (the kernel's default)
SCRATCH_MB = 1024  # the job's tmpfs (never more than its memory budget)
WATCH_SECONDS = 0.1  # how often the job's memory and CPU are added up
ADDRESS_SPACE_HEADROOM_MB = 4096  # torch alone maps ~3.4 GB of address space per process
MAX_PROCESSES = 256  # threads and processes of the job's user (one user namespace per job)
SANDBOXED = ("bwrap: user, PID, network, IPC, UTS and mount namespaces; uid 65534 with no "
             "capabilities, an unprivileged uid on the host too; no_new_privs; seccomp "
             "filter; read-only file system and device nodes but a private scratch")


# --------------------------------------------------------------------------- messages


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


# --------------------------------------------------------------------------- the zygote


def _preload() -> dict:
    """What every job needs, imported before the hello: torch and the observer (and optimizers
    made eager). The rest is warmed while the zygote is idle (``_idle_warm_ups``)."""
    loaded = []
    for name in REQUIRED_PRELOAD:
        importlib.import_module(name)
        loaded.append(name)
    eager = eager_optimizers()
    return {"loaded": loaded, "deferred": [*OPTIONAL_PRELOAD, "component cases"],
            "eager_optimizer_wrappers": eager,
            "compiler_imported": "torch._dynamo" in sys.modules}


def _draw_component_cases() -> None:
    """The default seed's cases, drawn once here instead of in every components job."""
    from moco_ref.probe.cases import component_cases

    for kind in ("queue", "ema", "logits", "loss"):
        component_cases(kind, 0)


def _idle_warm_ups() -> list:
    """Imports a submission may need and the component cases, one step at a time, for when no
    request is waiting: a job asked for meanwhile starts at once (it imports what it uses
    itself), and jobs started later find them ready. Each step is quick (≤ 0.5 s) and
    single-threaded, so forking stays safe between them."""
    steps = [lambda name=name: importlib.import_module(name) for name in OPTIONAL_PRELOAD]
    return [*steps, _draw_component_cases]


def eager_optimizers() -> int:
    """Let torch's optimizers run without importing ``torch._dynamo`` (1.4 s) on first use.

    torch marks optimizer code "do not compile" in two ways, each importing the compiler on
    the first call only to mark or to break a graph that eager code never builds:
    ``_disable_dynamo`` wrappers (``Optimizer.__init__``, ``zero_grad``, the functional
    updates) keep their mark on the wrapped function (``__dynamo_disable``), so setting it to
    that function skips the import; ``step`` methods wrapped by
    ``_use_grad_for_differentiable`` are rewrapped by ``_eager_step`` with the same grad-mode
    handling and no graph break. Only the warm process calls this, before any submission;
    a submission that compiles imports the compiler itself. Returns how many were changed."""
    import gc
    import types
    import warnings

    import torch._compile
    import torch.optim.optimizer as optimizer_module

    def code_of(outer, name: str):
        return next((c for c in outer.__code__.co_consts
                     if isinstance(c, types.CodeType) and c.co_name == name), None)

    marked = code_of(torch._compile._disable_dynamo, "inner")
    stepping = code_of(optimizer_module._use_grad_for_differentiable, "_use_grad")
    count = 0
    with warnings.catch_warnings():  # looking at every object touches deprecated aliases
        warnings.simplefilter("ignore")
        functions = [obj for obj in gc.get_objects() if isinstance(obj, types.FunctionType)]
    for function in functions:
        wrapped = getattr(function, "__wrapped__", None)
        if marked is not None and function.__code__ is marked and callable(wrapped) and \
                getattr(wrapped, "__dynamo_disable", None) is None:
            wrapped.__dynamo_disable = wrapped
            count += 1
    if stepping is not None:
        for cls in _optimizer_classes(torch.optim.Optimizer):
            step = cls.__dict__.get("step")
            if isinstance(step, types.FunctionType) and step.__code__ is stepping:
                cls.step = _eager_step(step.__wrapped__)
                count += 1
    return count


def _optimizer_classes(base: type) -> list[type]:
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _eager_step(step):
    """``step`` under the grad mode ``_use_grad_for_differentiable`` sets, without its
    compiler graph breaks."""
    import functools

    import torch

    @functools.wraps(step)
    def eager_step(self, *args, **kwargs):
        previous = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)

    return eager_step


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def serve(control_fd: int, sandboxed: bool = False, confined: bool = False) -> int:
    sock = socket.socket(fileno=control_fd)
    # Nothing from the folder the grader runs in is importable by a submission.
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.getcwd())]
    started = time.monotonic()
    preload = _preload()
    sealing = _seal_devices() if sandboxed else ""
    isolation, isolation_error = ("", sealing) if sealing else \
        _probe_confinement() if confined else _probe_isolation(sandboxed)
    subreaper = procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    send(sock, {"event": "hello", "pid": os.getpid(), "threads": _threads(),
                "seconds": time.monotonic() - started, "preload": preload,
                "isolation": isolation, "isolation_error": isolation_error,
                "subreaper": subreaper})
    jobs: dict[int, str] = {}  # supervisor pid -> job id
    owners: dict = {}  # supervisor pid -> a confined job's shared_memory.Owner
    warm_ups = _idle_warm_ups()
    try:
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [], 0.0 if warm_ups else 1.0)
            if not ready and warm_ups:
                try:
                    warm_ups.pop(0)()
                except Exception:  # noqa: BLE001 - optional: a job does without it
                    pass
                continue
            if sock in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
                except OSError:
                    data, fds = b"", []
                if not data:
                    break  # the grader is gone
                request = json.loads(data)
                if request.get("op") == "spawn":
                    pid, owner = _spawn(sock, request, fds, wake_r, wake_w)
                    jobs[pid] = request["job"]
                    if owner is not None:
                        owners[pid] = owner
                    send(sock, {"event": "started", "job": request["job"], "pid": pid})
                elif request.get("op") == "signal":  # pids here mean nothing to the grader
                    _signal_job(jobs, str(request.get("job")), int(request.get("signal", 0)))
                for fd in fds:
                    os.close(fd)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            ended = _reap(jobs)
            _kill_strays(jobs)  # before "exited" is sent: the job is over when it is read
            for pid, _, _ in ended:  # its supervisor did, unless it was killed first
                _sweep_shared_memory(owners.pop(pid, None))
            for pid, job, status in ended:
                send(sock, {"event": "exited", "job": job, "pid": pid, "status": status})
    finally:
        for pid in list(jobs):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        procs.kill_until_gone(lambda: procs.descendants([os.getpid()]), deadline_seconds=5)
        procs.reap_children()
        for owner in owners.values():
            _sweep_shared_memory(owner)
    return 0


def _seal_devices() -> str:
    """``""``, or why the device nodes could not be made read-only (no job may then run)."""
    from moco_ref.sandbox import jobspace

    try:
        jobspace.seal_devices()
    except OSError as exc:
        return f"the device nodes could not be made read-only ({exc})"
    return ""


def _signal_job(jobs: dict[int, str], job: str, number: int) -> None:
    """SIGTERM asks a job's supervisor to end the job; SIGKILL ends the supervisor and its
    process group (the job's init then dies with it, and with init the job's namespace)."""
    if number not in (signal.SIGTERM, signal.SIGKILL):
        return
    for pid, name in list(jobs.items()):
        if name == job:
            kills = (os.killpg, os.kill) if number == signal.SIGKILL else (os.kill,)
            for kill in kills:
                try:
                    kill(pid, number)
                except OSError:
                    pass


def _reap(jobs: dict[int, str]) -> list[tuple[int, str, int]]:
    """Collect exited children; returns the supervisors among them (pid, job, status)."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        job = jobs.pop(pid, None)
        if job is not None:
            ended.append((pid, job, status))


def _kill_strays(jobs: dict[int, str]) -> None:
    """Children of the zygote that are not live supervisors were re-parented here when their
    supervisor died: what is left of a finished job. They and their descendants are killed."""
    table = procs.all_processes()
    me = os.getpid()
    strays = [info.pid for info in table.values()
              if info.ppid == me and info.alive and info.pid not in jobs]
    if strays:
        procs.kill_until_gone(
            lambda: {pid for pid in procs.descendants(strays) | set(strays)
                     if procs.alive(pid)},
            deadline_seconds=5,
        )


def _spawn(sock, request: dict, fds: list[int], wake_r: int, wake_w: int):
    """The job's supervisor, forked; returns its pid and, for a confined job, the owner of
    its ``/dev/shm`` entries (``shared_memory.Owner``: told before the job starts)."""
    owner = None
    if request.get("confined"):
        from moco_ref.sandbox import shared_memory

        owner = shared_memory.Owner.of_job(request["confined"])
    pid = os.fork()
    if pid != 0:
        return pid, owner
    # ---- the supervisor (never returns)
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        code = _supervise(request, fds, owner)
    except BaseException:  # noqa: BLE001 - a supervisor must never go back to the zygote loop
        import traceback

        try:
            os.write(2, traceback.format_exc().encode()[-4000:])
        except OSError:
            pass
    os._exit(code)


# --------------------------------------------------------------------------- the supervisor


def _install_fds(fds: list[int]) -> None:
    """stdin from /dev/null, stdout/stderr to the job's pipes, the channel at CHANNEL_FD,
    every other descriptor closed."""
    stdout_w, stderr_w, channel_w, *bundle = fds
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.dup2(channel_w, CHANNEL_FD)
    os.set_inheritable(CHANNEL_FD, False)  # programs the submission execs do not get it
    last = CHANNEL_FD
    if bundle:
        os.dup2(bundle[0], BUNDLE_FD)
        os.set_inheritable(BUNDLE_FD, False)
        last = BUNDLE_FD
    os.closerange(last + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _supervise(request: dict, fds: list[int], owner=None) -> int:
    from moco_ref.observe.channel import EXIT, FrameWriter

    os.setsid()
    _install_fds(fds)
    writer = FrameWriter(CHANNEL_FD, bytes.fromhex(request["nonce"]))
    isolation, note = "processes", ""
    budget = request.get("memory_mb")
    budget = int(budget) if budget and int(budget) > 0 else None
    held = stored = None
    devices: frozenset = frozenset()
    if request.get("sandboxed"):
        from moco_ref.sandbox import jobspace

        try:
            jobspace.enter(scratch_mb=min(SCRATCH_MB, budget or SCRATCH_MB),
                           shared_memory_mb=min(jobspace.SHARED_MEMORY_MB,
                                                budget or jobspace.SHARED_MEMORY_MB))
            held = jobspace.held_bytes
            stored = lambda: (jobspace.segments(), "")  # noqa: E731
        except OSError as exc:  # the grader refuses a job without it: say why
            writer.send(EXIT, {"status": None, "isolation": "", "note": f"the job's "
                               f"namespaces could not be made ({exc})", "stopped": False,
                               "swept": 0})
            return 0
        isolation = SANDBOXED
    confined = request.get("confined")
    if confined:
        try:
            stored, devices = _confined_scratch(request["scratch"], confined, owner)
        except OSError as exc:
            writer.send(EXIT, {"status": None, "isolation": "", "note": f"the job's scratch "
                               f"could not be made ({exc})", "stopped": False, "swept": 0})
            return 0
        isolation = confined_words(confined)
    procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 1)
    for number in (signal.SIGTERM, signal.SIGCHLD):  # handled, not ignored: so that the
        signal.signal(number, lambda *_: None)  # sigtimedwait below sees them
    waited = {signal.SIGTERM, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # taken in the wait below
    alive_r, alive_w = os.pipe()  # init learns of the supervisor's death from its end
    status_r, status_w = os.pipe()  # init hands the worker's wait status back
    in_namespace = isolation == SANDBOXED
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(status_r)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
        if in_namespace:
            _namespace_init(request, alive_r, status_w)
        else:
            os.close(alive_r)
            os.close(status_w)
            _worker(request)
        os._exit(70)  # not reached
    os.close(alive_r)
    os.close(status_w)
    _close(BUNDLE_FD)  # the job's init has it for the worker
    status, stopped, raw = None, False, None
    watch = JobWatch(os.getpid(), request.get("memory_mb"), request.get("cpu_seconds"),
                     held=held, stored=stored, memory_devices=devices,
                     not_counted={child} if in_namespace else set(),
                     strict_uid=_job_user(confined))
    job_uid = (confined or {}).get("uid")
    watch_ids = _watch_ids(confined)
    if watch_ids:  # read the job's /proc files as its own user: no CAP_SYS_PTRACE needed
        _set_file_user(*watch_ids)
    while raw is None and not watch.exceeded:
        taken = signal.sigtimedwait(waited, WATCH_SECONDS)
        if taken is not None and taken.si_signo == signal.SIGTERM:
            stopped = True
            break
        done, wait_status = os.waitpid(child, os.WNOHANG)
        if done:
            raw = wait_status
        else:
            watch.check()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if raw is not None and not in_namespace:
        status = raw
    if in_namespace and raw is not None:
        reported = os.read(status_r, 16)
        status = int(reported) if reported.strip() else None
    if watch_ids:
        _set_file_user(0, 0)
    me = os.getpid()
    token = request["token"]
    swept = procs.kill_until_gone(
        lambda: procs.job_members(roots=[me], sessions=[me], token=token)
        | (procs.processes_of_user(int(job_uid)) if job_uid else set()), deadline_seconds=10
    )
    procs.reap_children()
    if confined:
        import shutil

        shutil.rmtree(request["scratch"], ignore_errors=True)
        _sweep_shared_memory(owner)  # the zygote again when it collects this supervisor
    try:
        writer.send(EXIT, {"status": status, "isolation": isolation, "note": note,
                           "stopped": stopped, "swept": swept, "limit": watch.exceeded,
                           "peak_rss_mb": round(watch.peak_rss / 2**20, 1),
                           "peak_tasks": watch.peak_tasks,
                           "cpu_seconds": round(watch.cpu, 2),
                           "run_queue_seconds": None if watch.run_queue is None
                           else round(watch.run_queue, 2)})
    except OSError:
        pass
    return 0


class JobWatch:
    """The job's limits across all its processes: their memory together, its processes and
    threads, and the CPU time they have used (their own and their reaped children's).
    ``check`` is called every ``WATCH_SECONDS``; when a limit is passed the job is over
    (``exceeded`` says why). Per-process rlimits (address space, CPU, processes) stand behind
    it between checks. (No cgroup: the machines this runs on give the grader none it may
    create.)

    Memory is what the job would free by ending: its processes' proportional set sizes (pages
    shared with the zygote or between forks count once); its memory files — the ``memfd``
    files its processes hold open, the files on ``memory_devices`` they hold open (unlinked
    or not: the confined rung's ``/dev/shm`` and scratch) and what ``stored()`` names (a
    sandboxed job's System V segments, ``jobspace.segments``; a confined job's scratch and
    its ``/dev/shm`` files, ``shared_memory``), each file once, by its allocated bytes less
    what its mappings in the job's processes add to their proportional set sizes (a file
    mapped by one page still counts whole); and ``held()`` — for a sandboxed job, its tmpfs
    and the kernel memory of its message queues and semaphores (``jobspace.held_bytes``).
    A file of the tmpfs also mapped is in both: the sum errs high, never low. ``stored()``
    may also say why the job is over its limits whatever its bytes (``shared_memory``).
    Processes and threads are counted over the job's processes but ``not_counted`` (the
    job's init).

    Beside its CPU time, the time its threads spent runnable but waiting for a CPU
    (``run_queue``, summed over every thread seen): the EXIT frame carries both, so the
    grader can tell a job starved by others from one that slept (``attempt.starvation``)."""

    def __init__(self, supervisor: int, memory_mb: int | None, cpu_seconds: float | None, *,
                 held=None, stored=None, memory_devices=frozenset(),
                 not_counted: set[int] = frozenset(),
                 max_tasks: int = MAX_PROCESSES, strict_uid: int | None = None):
        self.supervisor = supervisor
        self.memory = int(memory_mb) * 2**20 if memory_mb else None
        self.cpu_limit = float(cpu_seconds) if cpu_seconds else None
        self.held = held
        self.stored = stored  # () -> ({file key: bytes}, why the job is over its limits or "")
        self.memory_devices = frozenset(memory_devices)
        self.mapped: dict = {}  # file key -> bytes of it in the members' proportional sets
        self.not_counted = set(not_counted)
        self.max_tasks = max_tasks
        # the confined rung: a process of the job's user that the watch cannot read is over
        self.strict_uid = strict_uid
        self._hidden: set[int] = set()
        self.exceeded = ""
        self.peak_rss = 0
        self.peak_tasks = 0
        self.cpu = 0.0
        # seconds the job's threads were runnable but waiting for a CPU (None: the kernel
        # keeps no schedstat here); the grader tells starvation from sleep by it
        self.run_queue: float | None = None
        self._waits: dict[tuple[int, int], int] = {}  # (pid, tid) -> run-queue ns last read
        self._waits_ended = 0  # ns of threads whose tid came back as a new thread
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")

    def add_run_queue(self, members) -> None:
        """Add up the run-queue wait of every thread of ``members``
        (``/proc/PID/task/TID/schedstat``: time on the CPU, time waiting on a run queue, in
        ns). A thread's figure is kept after it ends, so the sum never shrinks."""
        for pid in members:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as handle:
                        waited = int(handle.read().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                key = (pid, int(tid))
                before = self._waits.get(key, 0)
                if waited < before:  # the tid was reused by a new thread
                    self._waits_ended += before
                self._waits[key] = waited
        if self._waits:
            self.run_queue = (self._waits_ended + sum(self._waits.values())) / 1e9

    def _proportional(self, pid: int, files=None) -> int:
        """The process's proportional set size (its resident set when that cannot be read);
        with ``files`` (a dict of memory files), the part of it each of them makes up is
        added to ``files``'s entry of ``mapped`` (``_proportional_by_file``)."""
        if files:
            found = _proportional_by_file(pid, files, self.mapped)
            if found is not None:
                return found
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
                for line in handle:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return self._resident(pid)

    def _resident(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm", "rb") as handle:
                return int(handle.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return 0

    @staticmethod
    def memory_files(members, *, devices=frozenset(), unreadable=None) -> dict:
        """The distinct memory files ``members`` hold open, ``(st_dev, st_ino)`` → allocated
        bytes: every ``memfd`` file, and every regular file on one of ``devices``."""
        files: dict[tuple[int, int], int] = {}
        unreadable = set() if unreadable is None else unreadable
        for pid in members:
            folder = f"/proc/{pid}/fd"
            try:
                names = os.listdir(folder)
            except PermissionError:
                unreadable.add(pid)
                continue
            except OSError:
                continue
            for name in names:
                try:
                    if devices:
                        info = os.stat(f"{folder}/{name}")
                        if info.st_dev in devices and stat.S_ISREG(info.st_mode):
                            files[(info.st_dev, info.st_ino)] = info.st_blocks * 512
                            continue
                    if not os.readlink(f"{folder}/{name}").startswith("/memfd:"):
                        continue
                    info = os.stat(f"{folder}/{name}")
                except PermissionError:  # its descriptors cannot be read: not counted
                    unreadable.add(pid)
                    break
                except OSError:
                    continue
                files[(info.st_dev, info.st_ino)] = info.st_blocks * 512
        return files

    def check(self) -> None:
        table = procs.all_processes()  # one read of every /proc/PID/stat per check
        members = procs.descendants([self.supervisor], table)
        cpu = sum(table[pid].cpu_ticks for pid in members) / self._tick
        tasks = sum(table[pid].threads for pid in members if pid not in self.not_counted)
        outside = self.held() if self.held is not None else 0
        # cheap, and never below the exact sum: resident sets, every memory file whole
        hidden: set[int] = set()
        files = self.memory_files(members, devices=self.memory_devices, unreadable=hidden)
        stored, problem = self.stored() if self.stored is not None else ({}, "")
        files.update(stored)
        memory = sum(self._resident(pid) for pid in members) + outside + sum(files.values())
        if self.memory and memory > self.memory:  # only then the exact, costlier sum
            self.mapped = {}
            memory = sum(self._proportional(pid, files) for pid in members) + outside + \
                sum(max(0, size - self.mapped.get(key, 0)) for key, size in files.items())
        self.peak_rss = max(self.peak_rss, memory)
        self.peak_tasks = max(self.peak_tasks, tasks)
        self.cpu = max(self.cpu, cpu)
        self.add_run_queue(members)
        # (an exec makes a process unreadable for an instant: twice in a row is no accident)
        hidden = {pid for pid in hidden
                  if procs.alive(pid) and procs.real_uid(pid) == self.strict_uid}
        hidden_before, self._hidden = self._hidden, hidden
        if self.strict_uid is not None and hidden & hidden_before:
            self.exceeded = ("watch: a process of the job made itself unreadable to its "
                             "supervisor (its memory could not be counted)")
        elif problem:
            self.exceeded = problem
        elif self.memory and memory > self.memory:
            # no measured figures in the words: the same submission, the same report
            self.exceeded = ("memory: the job's processes held more than its "
                             f"{self.memory / 2**20:.0f} MB together (--memory-mb; memory "
                             "files, its scratch, /dev/shm and System V IPC count)")
        elif tasks > self.max_tasks:
            self.exceeded = ("processes: the job ran more than its "
                             f"{self.max_tasks} processes and threads together")
        elif self.cpu_limit and cpu > self.cpu_limit:
            self.exceeded = ("CPU time: the job's processes used more than its "
                             f"{self.cpu_limit:.0f} s of CPU (twice --timeout)")


def _proportional_by_file(pid: int, files: dict, mapped: dict) -> int | None:
    """``pid``'s proportional set size from ``/proc/PID/smaps``, adding to ``mapped[key]``
    the part of it in mappings of each memory file of ``files`` (keyed as ``JobWatch``
    keys them: ``(st_dev, st_ino)``, or ``("sysv", shmid)`` for a System V segment, mapped as
    ``/SYSV…`` with its shmid as the inode). None when it cannot be read."""
    total, key, found = 0, None, {}
    try:
        with open(f"/proc/{pid}/smaps", "rb") as handle:
            for line in handle:
                head = line.split(None, 1)[0] if line.strip() else b""
                if not head.endswith(b":"):  # a mapping's first line
                    fields = line.split()
                    key = None
                    if len(fields) >= 5 and fields[4] != b"0":
                        inode = int(fields[4])
                        if len(fields) >= 6 and fields[5].startswith(b"/SYSV"):
                            key = ("sysv", inode)
                        else:
                            major, minor = (int(part, 16) for part in fields[3].split(b":"))
                            key = (os.makedev(major, minor), inode)
                        if key not in files:
                            key = None
                elif head == b"Pss:":
                    size = int(line.split()[1]) * 1024
                    total += size
                    if key is not None:
                        found[key] = found.get(key, 0) + size
    except (OSError, ValueError, IndexError):
        return None
    for key, size in found.items():
        mapped[key] = mapped.get(key, 0) + size
    return total


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _namespace_init(request: dict, alive_r: int, status_w: int) -> None:
    """pid 1 of the job's PID namespace: start the worker, reap orphans, and leave when the
    worker does (the kernel then kills whatever is left in the namespace)."""
    procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGKILL)
    ready, _, _ = select.select([alive_r], [], [], 0)
    if ready:  # the supervisor died before the death signal was armed
        os._exit(70)
    from moco_ref.sandbox import jobspace

    jobspace.fresh_proc()
    if request.get("memory_mb") and int(request["memory_mb"]) > 0:
        try:
            jobspace.limit_ipc(int(request["memory_mb"]))
        except OSError:
            pass  # a kernel that keeps them from a namespace's owner: the watch still counts
    worker = os.fork()
    if worker == 0:
        os.close(alive_r)
        os.close(status_w)
        _worker(request)
        os._exit(70)
    _close(BUNDLE_FD)  # the worker's now
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(70)
        if pid == worker:
            os.write(status_w, str(status).encode())
            os._exit(0)


def _worker(request: dict) -> None:
    """The submission's process: limits, its CPU share, a fresh working directory, then
    ``run_job``."""
    cpus = request.get("cpus")
    if cpus:  # a CPU of its own (attempt.CpuShares): its threads and children inherit it
        try:
            os.sched_setaffinity(0, {int(cpu) for cpu in cpus})
        except (OSError, ValueError):
            pass  # a CPU the sandbox cannot use: the scheduler shares them
    memory_mb = request.get("memory_mb")
    if memory_mb and memory_mb > 0:  # the job's watch holds the total; this, each process
        limit = (int(memory_mb) + ADDRESS_SPACE_HEADROOM_MB) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    _lower_limit(resource.RLIMIT_MSGQUEUE, MESSAGE_QUEUE_BYTES)
    os.environ[procs.TOKEN_VARIABLE] = request["token"]
    scratch = request["scratch"]  # the only writable folder when sandboxed
    confined = request.get("confined")
    if confined and confined.get("uid"):  # first: what it makes below is its own
        from moco_ref.sandbox import confine

        confine.become_job_user(int(confined["uid"]), int(confined["gid"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    elif confined and confined.get("gid") and os.geteuid() == 0:  # uid 0: a gid of its own
        from moco_ref.sandbox import confine

        confine.become_job_group(int(confined["gid"]))
    temporary = os.path.join(scratch, "tmp")
    os.makedirs(temporary, exist_ok=True)
    os.makedirs(os.path.join(scratch, "work"), exist_ok=True)
    if request.get("sandboxed"):
        _unpack(BUNDLE_FD, os.path.join(scratch, "submission"))
        cpu = request.get("cpu_seconds")
        if cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 5))
        from moco_ref.sandbox import confine

        confine.confine()  # uid 65534, no capabilities, no_new_privs, the seccomp filter
        # after: counted in the job's own user namespace, under the zygote's ceiling
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    elif confined:
        _unpack(BUNDLE_FD, os.path.join(scratch, "submission"))
        cpu = request.get("cpu_seconds")
        if cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 5))
        _confine_in_place(scratch, confined)
    os.environ["TMPDIR"] = temporary
    import tempfile

    tempfile.tempdir = temporary
    os.chdir(os.path.join(scratch, "work"))
    from moco_ref.observe.worker import run_job

    run_job(request, CHANNEL_FD)


# --------------------------------------------------------------------------- the confined rung

CONFINED_RULES: list = []  # [path, access] the confined zygote's jobs may use (--confined)
CONFINED_BASE = ("confined (no namespaces here): Landlock ABI {abi} (read-only system, "
                 "Python and observer; read-write only the job's scratch), {user}, "
                 "no_new_privs, seccomp filter (no System V IPC, no POSIX message queues), "
                 "rlimits, its own session; its /dev/shm files counted and removed at its end")


def confined_words(confined: dict) -> str:
    """The confined rung's isolation, in words, for a job's report."""
    from moco_ref.sandbox import landlock

    user = (f"uid {confined['uid']} of its own (unprivileged)" if confined.get("uid") else
            f"uid 0 without capabilities (gid {confined['gid']} of its own)"
            if os.geteuid() == 0 and confined.get("gid") else
            "uid 0 without capabilities" if os.geteuid() == 0 else
            f"the grader's uid {os.geteuid()}")
    return CONFINED_BASE.format(abi=landlock.abi(), user=user)


def _job_user(confined: dict | None) -> int | None:
    """The uid a confined job's processes run as (None: not confined)."""
    if not confined:
        return None
    return int(confined["uid"]) if confined.get("uid") else os.geteuid()


def _watch_ids(confined: dict | None) -> tuple[int, int] | None:
    """The file-system uid and gid a confined job's supervisor (root) watches it as: the job's
    own, so that the kernel lets it read the job's ``/proc`` files (file descriptors, maps)
    without ``CAP_SYS_PTRACE``, which a container does not give — a job that stays uid 0 has
    a gid of its own too. None: no change (not confined, or the grader is not root)."""
    if not confined or os.geteuid() != 0:
        return None
    if confined.get("uid"):
        return int(confined["uid"]), int(confined["gid"])
    return (0, int(confined["gid"])) if confined.get("gid") else None


def _confined_scratch(folder: str, confined: dict, owner):
    """The job's scratch (its only writable folder), its user's. Returns what its watch
    counts as stored outside its processes (``JobWatch.stored``: the scratch's files and the
    job's ``/dev/shm`` entries, ``shared_memory``; read as root when the job has a uid of its
    own, so that no folder it closes hides them) and the devices whose files its processes
    hold open are memory (``/dev/shm``'s, and the scratch's when it is a tmpfs)."""
    from moco_ref.sandbox import shared_memory

    os.mkdir(folder, 0o700)
    uid, gid = confined.get("uid"), confined.get("gid")
    if uid:
        os.chown(folder, int(uid), int(gid))
    watch_ids = _watch_ids(confined)

    def stored() -> tuple[dict, str]:
        if watch_ids:
            _set_file_user(0, 0)
        try:
            entries, _ = shared_memory.walk(folder, limit=MAX_WATCHED_FILES)
            held = shared_memory.holdings(owner) if owner is not None else \
                shared_memory.Holdings()
        finally:
            if watch_ids:
                _set_file_user(*watch_ids)
        files = {(info.st_dev, info.st_ino): info.st_blocks * 512 for _, info in entries}
        files.update(held.files)
        return files, held.problem()

    devices = {shared_memory.device(), _memory_device(folder)} - {None}
    return stored, frozenset(devices)


MAX_WATCHED_FILES = 20000  # entries of a confined job's scratch counted


def _memory_device(path: str) -> int | None:
    """``st_dev`` of ``path`` when its file system keeps files in memory (tmpfs, ramfs)."""
    try:
        wanted = os.stat(path).st_dev
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                major, minor = (int(part) for part in fields[2].split(":"))
                if os.makedev(major, minor) == wanted:
                    kind = fields[fields.index("-") + 1]
                    return wanted if kind in ("tmpfs", "ramfs") else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sweep_shared_memory(owner) -> int:
    """Remove a confined job's ``/dev/shm`` entries (``shared_memory.sweep``; ``owner``:
    its ``shared_memory.Owner``, None for no confined job) as their owner: the job's uid when
    it has one (no capability needed in the sticky folder), else this process's, sparing —
    for a job of the grader's uid — what a live process holds. Returns how many."""
    if owner is None:
        return 0
    from moco_ref.sandbox import shared_memory

    spare: frozenset = frozenset()
    if owner.shared:
        device = shared_memory.device()
        spare = shared_memory.held_open(owner.uid, device) if device is not None else spare
    switch = owner.uid is not None and not owner.shared and os.geteuid() == 0
    if switch:
        _set_file_user(owner.uid, 0)
    try:
        return shared_memory.sweep(owner, spare=spare)
    except OSError:
        return 0
    finally:
        if switch:
            _set_file_user(0, 0)


def _lower_limit(which: int, value: int) -> None:
    """``which`` no higher than ``value`` (lowered only)."""
    soft, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def _set_file_user(uid: int, gid: int) -> None:
    """The supervisor's file-system ids (its real and effective ids stay root's)."""
    from moco_ref.sandbox.clib import c_library

    library = c_library()
    library.setfsgid(gid)
    library.setfsuid(uid)


def _confine_in_place(scratch: str, confined: dict) -> None:
    from moco_ref.sandbox import confine, landlock

    rules = [landlock.Rule(path, int(access)) for path, access in CONFINED_RULES]
    rules.append(landlock.Rule(scratch, landlock.WRITE))
    confine.confine_in_place(rules, tcp=bool(confined.get("tcp")),
                             still_root=not confined.get("uid") and os.geteuid() == 0)


def _unpack(fd: int, folder: str) -> None:
    """The submission's files, sent by the grader as a tar archive on ``fd``."""
    import tarfile

    os.makedirs(folder, exist_ok=True)
    with os.fdopen(fd, "rb") as handle, tarfile.open(fileobj=handle, mode="r|") as archive:
        archive.extractall(folder, filter="data")


def _throwaway(body) -> str:
    """``body()``'s message (``"ok:"`` or ``"no:why"``), run in a forked child that is then
    discarded; an exception there is its ``"no:"`` message."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        try:
            message = body()
        except BaseException as exc:  # noqa: BLE001
            message = f"no:{type(exc).__name__}: {exc}"
        os.write(write_end, message.encode()[:500])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        message = handle.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return message or "no:the probe process died"


def _probe_isolation(sandboxed: bool) -> tuple[str, str]:
    """``(SANDBOXED, "")`` when a job's namespaces and confinement work here, tried in a
    throwaway job; ``("", reason)`` when they do not; ``("processes", "")`` outside bwrap."""
    if not sandboxed:
        return "processes", ""
    from moco_ref.sandbox import confine, jobspace

    def job() -> str:
        jobspace.enter(scratch_mb=16, shared_memory_mb=1)
        return _throwaway(inside)  # pid 1 of the new PID namespace's first child

    def inside() -> str:
        jobspace.fresh_proc()
        confine.confine()
        return _devices_refused().decode()

    message = _throwaway(job)
    return (SANDBOXED, "") if message.startswith("ok:") else ("", message.split(":", 1)[-1])


def _probe_confinement() -> tuple[str, str]:
    """``(words, "")`` when a throwaway process can take the confined rung's confinement here
    (Landlock, no_new_privs, seccomp) and then cannot list ``/``; ``("", reason)`` when not."""
    from moco_ref.sandbox import confine, landlock

    version = landlock.abi()
    if version <= 0:
        return "", ("no Landlock here (the kernel has none, or the container's seccomp "
                    "profile refuses its calls)")

    def confined() -> str:
        confine.confine_in_place([], tcp=False, still_root=os.geteuid() == 0)
        try:
            os.listdir("/")
        except PermissionError:
            return "ok:"
        return "no:Landlock did not hold (/ could still be listed)"

    message = _throwaway(confined)
    if message.startswith("ok:"):
        return CONFINED_BASE.format(abi=version, user="{user}"), ""
    return "", message.split(":", 1)[-1]


def _devices_refused() -> bytes:
    """``b"ok:"`` when a confined process cannot change a device node (a chmod to the mode it
    has already: a no-op where it is allowed)."""
    from moco_ref.sandbox import jobspace

    for name in jobspace.DEVICE_NODES:
        path = f"/dev/{name}"
        try:
            os.chmod(path, os.stat(path).st_mode & 0o7777)
        except OSError:
            continue  # refused, as it must be (or not there)
        return f"no:a job could change {path}".encode()
    return b"ok:"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moco_ref.sandbox.zygote")
    parser.add_argument("--fd", type=int, required=True, help="the control socket")
    parser.add_argument("--sandboxed", action="store_true",
                        help="running inside the bwrap sandbox: jobs get their own namespaces")
    parser.add_argument("--confined", metavar="RULES",
                        help="the confined rung: JSON [[path, access], ...] every job may use")
    args = parser.parse_args(argv)
    if args.confined:
        CONFINED_RULES[:] = json.loads(args.confined)
    return serve(args.fd, args.sandboxed, confined=bool(args.confined))


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: torch's takes seconds, and nothing is left to do
