"""The sandbox's user is unprivileged on the host too (issue 26): when the grader is root, a
job runs as an unprivileged host uid, so it cannot change the host's device nodes bound into
the sandbox, the kernel's process limit holds for it, and what it keeps in memory files,
tmpfs and shared memory counts against its memory budget."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from moco_ref.probe.options import GradeOptions
from moco_ref.sandbox import bwrap, client, procs, zygote
from moco_ref.sandbox.attempt import Attempt, run_attempt

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

DEVICES = ("/dev/null", "/dev/full", "/dev/zero", "/dev/urandom")


@pytest.fixture(scope="module")
def sandbox() -> client.Zygote:
    return client.current_zygote(isolation="bwrap")


def _run(sandbox, tmp_path: Path, body: str, *, memory_mb: int = 2048,
         timeout: float = 60) -> Attempt:
    """``body`` (the text of a function) run as ``moco_warmup`` of a submission in the
    sandbox; what it prints starting with ``ATTACK`` is its verdict."""
    path = tmp_path / f"attack_{time.monotonic_ns()}.py"
    path.write_text("import os, sys, time, threading\n\n" + textwrap.dedent(body) +
                    "\n\ndef train_moco(initial, x, train, epochs=15):\n    return None\n")
    options = GradeOptions(style="lab", memory_mb=memory_mb, timeout=timeout)
    return run_attempt(sandbox, str(path), options, time.monotonic() + timeout,
                       ["moco_warmup"], helpers=False)


def _attack(attempt: Attempt) -> dict[str, str]:
    found = {}
    for line in attempt.stdout.splitlines():
        if line.startswith("ATTACK "):
            key, _, value = line[len("ATTACK "):].partition(": ")
            found[key] = value
    return found


def _stats() -> dict[str, tuple]:
    stats = {}
    for path in DEVICES:
        info = os.stat(path)
        stats[path] = (info.st_mode, info.st_uid, info.st_gid, info.st_atime_ns,
                       info.st_mtime_ns)
    return stats


CHANGE_DEVICES = '''
def moco_warmup():
    import errno
    attempts = {
        "chmod /dev/null": lambda: os.chmod("/dev/null", 0o600),
        "chown /dev/null": lambda: os.chown("/dev/null", os.getuid(), os.getgid()),
        "chmod /dev/full": lambda: os.chmod("/dev/full", 0o777),
        "utime /dev/zero": lambda: os.utime("/dev/zero", (0, 0)),
        "chmod /dev/urandom": lambda: os.chmod("/dev/urandom", 0o666),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            print(f"ATTACK {name}: done", flush=True)
        except OSError as error:
            print(f"ATTACK {name}: refused ({errno.errorcode.get(error.errno)})", flush=True)
    with open("/dev/null", "w") as null:  # the devices still work
        null.write("x")
    try:
        with open("/dev/full", "w") as full:
            full.write("x")
            full.flush()
    except OSError as error:
        print(f"ATTACK write /dev/full: {errno.errorcode.get(error.errno)}", flush=True)
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''


def test_a_job_cannot_change_the_host_s_device_nodes(sandbox, tmp_path):
    before = _stats()
    try:
        attack = _run(sandbox, tmp_path, CHANGE_DEVICES)
        after = _stats()
    finally:  # had it worked, the host's nodes are put back as they were
        for path, (mode, uid, gid, atime, mtime) in before.items():
            info = os.stat(path)
            if (info.st_mode, info.st_uid, info.st_gid) != (mode, uid, gid):
                os.chown(path, uid, gid)
                os.chmod(path, mode & 0o7777)
            if info.st_mtime_ns != mtime:
                os.utime(path, ns=(atime, mtime))
    found = _attack(attack)
    changes = [name for name in found if name.split()[0] in ("chmod", "chown", "utime")]
    assert len(changes) == 5, attack.stdout + attack.stderr
    assert all(found[name].startswith("refused") for name in changes), found
    assert found["write /dev/full"] == "ENOSPC"  # a device, not a read-only file
    unchanged = {path: (mode, uid, gid, mtime) for path, (mode, uid, gid, _, mtime)
                 in before.items()}  # the access time moves with any reader on the host
    assert {path: (mode, uid, gid, mtime) for path, (mode, uid, gid, _, mtime)
            in after.items()} == unchanged


THREADS = '''
def moco_warmup():
    threading.stack_size(256 * 1024)  # 300 stacks fit the address space easily
    stop = threading.Event()
    started = 0
    try:
        for _ in range(300):
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
        print("ATTACK threads: all 300 started", flush=True)
    except RuntimeError as error:
        print(f"ATTACK threads: {started} started, then {error}", flush=True)
    stop.set()
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''


def test_threads_beyond_the_process_limit_do_not_start(sandbox, tmp_path):
    found = _attack(_run(sandbox, tmp_path, THREADS))
    started = found.get("threads", "")
    assert "can't start new thread" in started, found
    # the process limit, not memory: close to it (the worker has a few threads of its own)
    assert zygote.MAX_PROCESSES - 20 <= int(started.split()[0]) < zygote.MAX_PROCESSES


HOLD_THREADS_AND_A_TERMINAL = '''
def moco_warmup():
    import pty
    threading.stack_size(256 * 1024)
    stop = threading.Event()
    started = 0
    try:
        for _ in range(COUNT):
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    leader, follower = pty.openpty()
    threading.stack_size(0)
    time.sleep(HOLD)
    print(f"ATTACK threads: {started}", flush=True)
    print(f"ATTACK terminals: {sorted(os.listdir('/dev/pts'))}", flush=True)
    stop.set()
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''


def test_a_job_s_processes_and_terminals_are_its_own(sandbox, tmp_path):
    """Two jobs at once, each with 200 threads (1.6 times the limit together) and a
    terminal: both start all their threads (the limit is per job, not shared through the
    sandbox's user), and each sees only its own terminal."""
    body = HOLD_THREADS_AND_A_TERMINAL.replace("COUNT", "200").replace("HOLD", "6")
    results: list[dict] = []
    attempts: list[Attempt] = []
    jobs = [threading.Thread(target=lambda: attempts.append(_run(sandbox, tmp_path, body)))
            for _ in range(2)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    results = [_attack(attempt) for attempt in attempts]
    assert [found.get("threads") for found in results] == ["200", "200"], results
    assert [found.get("terminals") for found in results] == ["['0', 'ptmx']"] * 2, results
    # and the job's watch counted them
    assert all(attempt.exit["peak_tasks"] > 200 for attempt in attempts), attempts


MEMORY_FILES = '''
def moco_warmup():
    held = []
    for index in range(6):  # 6 x 256 MB, each under the 1 GiB file size limit
        fd = os.memfd_create(f"hoard-{index}")
        os.posix_fallocate(fd, 0, 256 * 2**20)  # real pages, never mapped
        held.append(fd)
        print(f"ATTACK memory files: {len(held) * 256} MB", flush=True)
    time.sleep(30)
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''

SHARED_MEMORY = '''
def moco_warmup():
    block, written = b"x" * 2**20, 0
    try:
        with open("/dev/shm/hoard", "wb") as handle:
            while written < 1536:
                handle.write(block)
                handle.flush()
                written += 1
    except OSError as error:
        print(f"ATTACK /dev/shm: {written} MB, then {error.strerror}", flush=True)
    written = 0
    with open("/tmp/hoard", "wb") as handle:  # the scratch
        while written < 1536:
            handle.write(block)
            handle.flush()
            written += 1
    print(f"ATTACK /tmp: {written} MB", flush=True)
    time.sleep(30)
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''

SYSTEM_V = '''
def moco_warmup():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    for index in range(6):  # 6 x 256 MB, written, then detached: kept by the IPC namespace
        size = 256 * 2**20
        segment = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE | IPC_CREAT
        address = libc.shmat(segment, None, 0)
        ctypes.memset(address, 1, size)
        libc.shmdt(ctypes.c_void_p(address))
        print(f"ATTACK shared memory segments: {(index + 1) * 256} MB", flush=True)
    time.sleep(30)
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
'''


@pytest.mark.parametrize("body", [MEMORY_FILES, SHARED_MEMORY, SYSTEM_V],
                         ids=["memfd", "tmpfs", "sysv"])
def test_memory_kept_outside_the_processes_counts_against_the_budget(sandbox, tmp_path,
                                                                     body):
    attempt = _run(sandbox, tmp_path, body, memory_mb=512)
    limit = (attempt.exit or {}).get("limit", "")
    assert limit.startswith("memory:") and "512 MB" in limit, (attempt.exit, attempt.stdout,
                                                                attempt.stderr[-2000:])
    found = _attack(attempt)
    if body is SHARED_MEMORY:  # /dev/shm is small, the scratch no larger than the budget
        written = int(found["/dev/shm"].split()[0])
        assert written <= 64 and "No space left" in found["/dev/shm"], found
        assert "/tmp" not in found or int(found["/tmp"].split()[0]) <= 512, found
    else:
        assert found, attempt.stdout


def test_a_job_within_its_budget_is_not_stopped(sandbox, tmp_path):
    """Memory files, /dev/shm and the scratch used a little, well within the budget."""
    body = '''
    def moco_warmup():
        fd = os.memfd_create("small")
        os.posix_fallocate(fd, 0, 16 * 2**20)
        with open("/dev/shm/small", "wb") as handle:
            handle.write(b"x" * 2**20 * 8)
        with open("/tmp/small", "wb") as handle:
            handle.write(b"x" * 2**20 * 32)
        time.sleep(1)
        print("ATTACK done: yes", flush=True)
        return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
    '''
    attempt = _run(sandbox, tmp_path, body, memory_mb=1024)
    assert not (attempt.exit or {}).get("limit"), attempt.exit
    assert _attack(attempt) == {"done": "yes"}


def _host_view(root: int) -> list[tuple[int, list[int], str]]:
    """``(pid, [real, effective, saved, file system uid], uid_map)`` of ``root`` and every
    host process below it."""
    found = []
    for pid in sorted(procs.descendants([root]) | {root}):
        try:
            with open(f"/proc/{pid}/status") as handle:
                uids = next(line for line in handle if line.startswith("Uid:"))
            with open(f"/proc/{pid}/uid_map") as handle:
                mapping = " ".join(handle.read().split())
        except OSError:
            continue
        found.append((pid, [int(field) for field in uids.split()[1:]], mapping))
    return found


def test_the_job_runs_as_an_unprivileged_host_uid(sandbox, tmp_path):
    body = '''
    def moco_warmup():
        print(f"ATTACK uid: {os.getuid()} {os.geteuid()}", flush=True)
        time.sleep(4)
        return {"temperature_probabilities": {}, "FIFO": [], "EMA": []}
    '''
    seen: list = []
    job = threading.Thread(target=lambda: seen.append(_run(sandbox, tmp_path, body)))
    job.start()
    views = []
    deadline = time.monotonic() + 60
    while job.is_alive() and time.monotonic() < deadline:
        views.append(_host_view(sandbox.process.pid))
        time.sleep(0.5)
    job.join()
    assert _attack(seen[0])["uid"] == "65534 65534"
    host = sandbox.host_uid
    assert host != 0
    if os.geteuid() == 0:
        assert host in bwrap.HOST_IDS
    processes = {pid: (uids, mapping) for view in views for pid, uids, mapping in view}
    assert processes and all(uids == [host] * 4 for uids, _ in processes.values()), processes
    # the submission's own process: uid 65534 of its namespace, the host uid outside
    assert any(mapping == f"65534 {host} 1" for _, mapping in processes.values()), processes
    assert all(mapping in (f"0 {host} 1", f"65534 {host} 1", "0 0 4294967295")
               for _, mapping in processes.values()), processes


BUNDLED = ("chmod_devices.py", "memfd_hoard.py", "thread_swarm.py")


def test_the_bundled_examples_get_their_verdicts():
    """The adversarial corpus's examples of these attacks (``examples/adversarial``), graded
    as the corpus is, and what each reports of its attack."""
    from moco_ref.run.demo import find_manifest, load_manifest, run_demo, surprise_details

    manifest = find_manifest().parents[1] / "adversarial" / "manifest.json"
    examples = [example for example in load_manifest(manifest)
                if example.path.name in BUNDLED]
    assert sorted(example.path.name for example in examples) == sorted(BUNDLED)
    before = _stats()
    outcomes = {outcome.example.path.name: outcome
                for outcome in run_demo(examples, GradeOptions(), jobs=2)}
    for outcome in outcomes.values():
        assert outcome.as_expected, "\n".join(surprise_details(outcome))
    assert {path: stats[:3] for path, stats in _stats().items()} == \
        {path: stats[:3] for path, stats in before.items()}
    devices = outcomes["chmod_devices.py"].report.stdout
    refused = {line for line in devices.splitlines() if ": refused (" in line}
    # (train_moco runs twice: the main probe and the short one; each attempt is refused)
    assert "ATTACK changed: nothing" in devices and len(refused) == 6, devices
    threads = outcomes["thread_swarm.py"].report.stdout
    assert "can't start new thread" in threads, threads
    hoard = outcomes["memfd_hoard.py"].report
    messages = [r.message for r in hoard.results if r.family == "I4"]
    assert messages and all("memory files" in m and "--memory-mb" in m for m in messages)


# --------------------------------------------------------------------------- the pieces


@pytest.fixture
def open_folder():
    """A folder every user may pass (pytest's own temporary folders are closed to others)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="moco-ref-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_launch_plan_reveals_only_what_bwrap_binds_below_a_closed_folder(open_folder):
    tmp_path = open_folder
    closed = tmp_path / "closed"
    (closed / "python" / "lib").mkdir(parents=True)
    (closed / "secret.txt").write_text("the grader's")
    closed.chmod(0o700)
    binary = tmp_path / "bwrap"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    args = [str(binary), "--ro-bind", str(closed / "python"), "/python", "--tmpfs", "/tmp",
            "--", "/python/bin/python"]
    command = bwrap.launch_command(args, 61000, 61000)
    plan = __import__("json").loads(command[command.index("--") - 1])
    assert command[command.index("--") + 1:] == args
    assert plan["uid"] == plan["gid"] == 61000
    assert plan["cover"] == [str(closed)]  # the outermost folder 61000 may not pass
    assert plan["reveal"] == [str(closed / "python")]  # not secret.txt
    (closed / "python").chmod(0o700)  # a bound folder the sandbox could not read itself
    with pytest.raises(bwrap.HostUserUnavailable, match="not readable by the sandbox"):
        bwrap.launch_command(args, 61000, 61000)


@pytest.mark.skipif(os.geteuid() != 0, reason="covering a folder needs root's mounts")
def test_a_revealed_folder_that_is_itself_covered_still_shows_what_is_revealed_inside_it(
        open_folder):
    """A closed folder revealed whole (the grader's checkout's entries) and covered (it holds a
    Python folder: a tox env) shows the Python folder, and nothing else of it: revealing the
    whole folder recursively brings its own cover along, so what lies inside is bound again."""
    closed = open_folder / "closed"
    (closed / "env" / "bin").mkdir(parents=True)
    (closed / "env" / "bin" / "python").write_text("the interpreter")
    (closed / "secret.txt").write_text("the grader's")
    closed.chmod(0o700)
    script = (f"import json, os, sys; sys.path.insert(0, {str(bwrap.LAUNCHER.parent)!r}); "
              "import launch; "
              f"launch.cover_and_reveal([{str(closed)!r}], [{str(closed)!r}, "
              f"{str(closed / 'env')!r}]); "
              f"print(json.dumps(sorted(os.listdir({str(closed)!r}))), "
              f"open({str(closed / 'env' / 'bin' / 'python')!r}).read())")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split(None, 1) == ['["env"]', "the interpreter\n"], shown.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the grader picks a host uid only as root")
def test_a_sandbox_s_host_uid_is_free_and_unnamed(monkeypatch):
    first = bwrap.host_ids()
    assert first is not None and first[0] in bwrap.HOST_IDS and first[0] == first[1]
    assert bwrap.host_ids({first[0]})[0] != first[0]  # another live sandbox's is skipped
    named = {first[0]}  # as if an account had that uid
    real = bwrap.pwd.getpwuid
    monkeypatch.setattr(bwrap.pwd, "getpwuid",
                        lambda number: real(0) if number in named else real(number))
    assert bwrap.host_ids()[0] != first[0]
    monkeypatch.setattr(bwrap, "HOST_IDS", range(first[0], first[0] + 1))
    with pytest.raises(bwrap.HostUserUnavailable, match="none of the host uids"):
        bwrap.host_ids()
