"""The warm process every graded submission is forked from:

    python -m moco_ref.sandbox.zygote --fd N

Importing torch (with ``torch._dynamo``, which the first optimizer pulls in) costs ~4 s of
CPU, and would be paid again by every submission. The zygote pays it once: it imports torch,
the observer and the usual student imports, runs no submission code and no torch operation
(no thread pools; it checks it is single-threaded), and on request forks a fresh process per
job. Nothing a job does can reach the zygote's state — each job is its own copy-on-write
process, discarded at the end — so a submission still gets a fresh process.

Per job (``spawn`` on the control socket, with the job's stdout, stderr and observation-channel
pipe ends passed as file descriptors) the processes are::

    zygote ─ supervisor (own session, child subreaper)
               └ [init, pid 1 of a new PID namespace, when namespaces are available]
                    └ worker: rlimits, fresh working directory, the submission, the observer

- The **supervisor** enters namespaces (``namespaces.enter``) when asked and available, forks,
  waits, and when the worker ends (or on SIGTERM from the grader) kills everything left of the
  job (``procs``), then reports the worker's exit status on the channel (``EXIT`` frame).
- The **init** reaps orphans and exits when the worker exits, which makes the kernel kill the
  rest of the namespace; it dies with the supervisor (``PR_SET_PDEATHSIG``).
- The **worker** runs ``worker.run_job``.

The zygote is a child subreaper too: a process whose supervisor was killed is re-parented to
it, and any child of the zygote that is not a live supervisor is killed with its descendants.
The control socket is a socketpair inherited from the grader (no path anyone else can open);
it is closed in every job right after the fork. When the grader closes it, the zygote kills
its jobs and exits.
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
import sys
import time

from moco_ref.sandbox import procs

REQUIRED_PRELOAD = ("torch", "torch.nn", "torch.optim", "torch._dynamo", "moco_ref.observe.worker")
OPTIONAL_PRELOAD = ("numpy", "nbformat", "hypothesis", "matplotlib.pyplot", "torchvision")
MAX_MESSAGE = 1 << 16
CHANNEL_FD = 3  # where the worker finds its observation channel
MAX_FILE_BYTES = 2**30


# --------------------------------------------------------------------------- messages


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


# --------------------------------------------------------------------------- the zygote


def _preload() -> dict:
    loaded, missing = [], {}
    for name in REQUIRED_PRELOAD:
        importlib.import_module(name)
        loaded.append(name)
    for name in OPTIONAL_PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - optional: a submission imports it itself
            missing[name] = f"{type(exc).__name__}: {exc}"
    try:  # the default seed's cases, drawn once here instead of in every job
        from moco_ref.observe.strategies import component_cases

        for kind in ("queue", "ema", "logits", "loss"):
            component_cases(kind, 0)
    except Exception as exc:  # noqa: BLE001
        missing["component cases"] = f"{type(exc).__name__}: {exc}"
    return {"loaded": loaded, "missing": missing}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def serve(control_fd: int) -> int:
    sock = socket.socket(fileno=control_fd)
    # Nothing from the folder the grader runs in is importable by a submission.
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.getcwd())]
    started = time.monotonic()
    preload = _preload()
    from moco_ref.sandbox import namespaces

    isolation, isolation_error = namespaces.probe()
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
    try:
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [], 1.0)
            if sock in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
                except OSError:
                    data, fds = b"", []
                if not data:
                    break  # the grader is gone
                request = json.loads(data)
                if request.get("op") == "spawn":
                    pid = _spawn(sock, request, fds, wake_r, wake_w)
                    jobs[pid] = request["job"]
                    send(sock, {"event": "started", "job": request["job"], "pid": pid})
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
    return 0


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


def _spawn(sock, request: dict, fds: list[int], wake_r: int, wake_w: int) -> int:
    pid = os.fork()
    if pid != 0:
        return pid
    # ---- the supervisor (never returns)
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        code = _supervise(request, fds)
    except BaseException:  # noqa: BLE001 - a supervisor must never go back to the zygote loop
        import traceback

        try:
            os.write(2, traceback.format_exc().encode()[-4000:])
        except OSError:
            pass
    os._exit(code)


# --------------------------------------------------------------------------- the supervisor


class _Stop(Exception):
    pass


def _on_term(*_) -> None:
    raise _Stop


def _install_fds(fds: list[int]) -> None:
    """stdin from /dev/null, stdout/stderr to the job's pipes, the channel at CHANNEL_FD,
    every other descriptor closed."""
    stdout_w, stderr_w, channel_w = fds
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.dup2(channel_w, CHANNEL_FD)
    os.set_inheritable(CHANNEL_FD, False)  # programs the submission execs do not get it
    os.closerange(CHANNEL_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _supervise(request: dict, fds: list[int]) -> int:
    from moco_ref.observe.channel import EXIT, FrameWriter

    os.setsid()
    _install_fds(fds)
    writer = FrameWriter(CHANNEL_FD, bytes.fromhex(request["nonce"]))
    isolation, note = "processes", ""
    if request.get("namespaces"):
        from moco_ref.sandbox import namespaces

        try:
            isolation = namespaces.enter(writable=(request["scratch"],))
        except OSError as exc:
            note = f"namespaces unavailable ({exc}); isolated by processes only"
    procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _on_term)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered in the wait below
    alive_r, alive_w = os.pipe()  # init learns of the supervisor's death from its end
    status_r, status_w = os.pipe()  # init hands the worker's wait status back
    in_namespace = isolation.startswith("namespaces")
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(status_r)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if in_namespace:
            _namespace_init(request, alive_r, status_w)
        else:
            os.close(alive_r)
            os.close(status_w)
            _worker(request)
        os._exit(70)  # not reached
    os.close(alive_r)
    os.close(status_w)
    status, stopped = None, False
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        _, raw = os.waitpid(child, 0)
        status = raw if not in_namespace else None
    except _Stop:
        stopped = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if in_namespace and not stopped:
        reported = os.read(status_r, 16)
        status = int(reported) if reported.strip() else None
    me = os.getpid()
    token = request["token"]
    swept = procs.kill_until_gone(
        lambda: procs.job_members(roots=[me], sessions=[me], token=token), deadline_seconds=10
    )
    procs.reap_children()
    try:
        writer.send(EXIT, {"status": status, "isolation": isolation, "note": note,
                           "stopped": stopped, "swept": swept})
    except OSError:
        pass
    return 0


def _namespace_init(request: dict, alive_r: int, status_w: int) -> None:
    """pid 1 of the job's PID namespace: start the worker, reap orphans, and leave when the
    worker does (the kernel then kills whatever is left in the namespace)."""
    procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGKILL)
    ready, _, _ = select.select([alive_r], [], [], 0)
    if ready:  # the supervisor died before the death signal was armed
        os._exit(70)
    worker = os.fork()
    if worker == 0:
        os.close(alive_r)
        os.close(status_w)
        _worker(request)
        os._exit(70)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(70)
        if pid == worker:
            os.write(status_w, str(status).encode())
            os._exit(0)


def _worker(request: dict) -> None:
    """The submission's process: limits, a fresh working directory, then ``run_job``."""
    memory_mb = request.get("memory_mb")
    if memory_mb and memory_mb > 0:
        limit = int(memory_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    os.environ[procs.TOKEN_VARIABLE] = request["token"]
    scratch = request["scratch"]  # the only writable folder when in namespaces
    temporary = os.path.join(scratch, "tmp")
    os.makedirs(temporary, exist_ok=True)
    os.environ["TMPDIR"] = temporary
    import tempfile

    tempfile.tempdir = temporary
    os.chdir(os.path.join(scratch, "work"))
    from moco_ref.observe.worker import run_job

    run_job(request, CHANNEL_FD)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moco_ref.sandbox.zygote")
    parser.add_argument("--fd", type=int, required=True, help="the control socket")
    args = parser.parse_args(argv)
    return serve(args.fd)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: torch's takes seconds, and nothing is left to do
