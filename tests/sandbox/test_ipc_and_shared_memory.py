"""Memory that outlives a job, or that no process's memory shows (issue 38, item 3): System V
shared memory segments and semaphore sets, POSIX message queues, files in ``/dev/shm`` (named
ones, unlinked ones held open, named semaphores).

On each rung available here — bwrap, and the confined rung here (a job that stays uid 0, with
a gid of its own), inside the default-container simulation (a uid per job) and there as a
grader that is not root (the jobs keep its uid) — each kind is shown stopped at the job's
memory budget or refused with its reason, and nothing of it is left once the job is over:
no System V row, no ``/dev/shm`` entry, no message queue, no namespace of the job's. The
pieces (the filter, the owner of a job's ``/dev/shm`` entries, the tables read, a memory
file mapped by one page) are checked on their own, cheaply; the bundled examples of each
kind get their verdicts on both rungs."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moco_ref.sandbox import client, jobspace, landlock, seccomp, shared_memory, zygote
from moco_ref.tools import default_container
from tests.sandbox import ipc_attacks

ROOT = Path(__file__).resolve().parents[2]
needs_landlock = pytest.mark.skipif(landlock.abi() <= 0, reason="no Landlock on this kernel")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the simulation starts as root")
CLONE_NEWIPC = 0x08000000
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p


def _in_child(body) -> dict:
    """``body()`` (a JSON-able dict) run in a forked child."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            result = body()
        except BaseException as exc:  # noqa: BLE001
            result = {"raised": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        text = handle.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def _errno(result: int) -> str:
    return "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


def _private_ipc() -> bool:
    """An IPC namespace of this (child) process's own, so that nothing it makes is the
    machine's (root only)."""
    return os.geteuid() == 0 and LIBC.unshare(CLONE_NEWIPC) == 0


# --------------------------------------------------------------------------- the pieces


def test_the_confined_filter_refuses_system_v_ipc_and_message_queues():
    """The confined rung's tightening refuses every System V IPC call and POSIX message
    queue (EPERM); the filter both rungs share does not (bwrap's IPC namespace is the job's),
    and doctor's list of refused calls names them for the confined rung only."""
    def attempts(tightening):
        def run():
            private = _private_ipc()
            if tightening is None and not private:
                return {"private": False}  # would make them in the machine's namespace
            seccomp.install(tightening)
            found = {
                "shmget": _errno(LIBC.shmget(0, ctypes.c_size_t(4096), 0o1600)),
                "semget": _errno(LIBC.semget(0, 1, 0o1600)),
                "msgget": _errno(LIBC.msgget(0, 0o1600)),
                "mq_open": _errno(LIBC.mq_open(b"/moco-ref-test-filter", 0o2 | 0o100, 0o600,
                                               None)),
            }
            LIBC.mq_unlink(b"/moco-ref-test-filter")
            return {"private": private, **found}
        return run

    refused = _in_child(attempts(seccomp.Tightening()))
    assert refused == {"private": refused["private"], "shmget": "EPERM", "semget": "EPERM",
                       "msgget": "EPERM", "mq_open": "EPERM"}, refused
    common = _in_child(attempts(None))
    if common["private"]:  # made in a namespace of the child's own, gone with it
        assert set(common.values()) == {True, "allowed"}, common
    assert set(seccomp.IPC_X86_64) <= set(seccomp.refused_calls(seccomp.Tightening()))
    assert not set(seccomp.IPC_X86_64) & set(seccomp.refused_calls())


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")
def test_a_job_s_dev_shm_entries_are_told_apart_counted_once_and_removed(tmp_path):
    """By uid (a job of its own uid), by gid (a job that stays uid 0) or by time (a job of
    the grader's uid): its files, in folders too and once however many names they have,
    count; a neighbour's do not and stay; what a live process holds is spared."""
    root = tmp_path / "shm"
    root.mkdir()

    def make(relative: str, size: int, uid: int = 0, gid: int = 0) -> Path:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.chown(path, uid, gid)
        return path

    make("neighbour", 8192, uid=61198, gid=61198)
    make("grader-before", 4096)
    mine = make("mine", 3 * 4096, uid=61101, gid=61101)
    os.link(mine, root / "mine-again")  # the same file under two names: once
    make("folder/inner", 5 * 4096, uid=61101, gid=61101)
    os.chown(root / "folder", 61101, 61101)
    by_uid = shared_memory.Owner.of_job({"uid": 61101, "gid": 61101}, str(root))
    held = shared_memory.holdings(by_uid, str(root))
    assert sorted(held.files.values()) == [3 * 4096, 5 * 4096] and held.entries == 4
    assert held.problem() == ""

    make("uid0-job", 2 * 4096, uid=0, gid=61150)
    by_gid = shared_memory.Owner.of_job({"uid": None, "gid": 61150}, str(root))
    assert list(shared_memory.holdings(by_gid, str(root)).files.values()) == [2 * 4096]

    by_time = shared_memory.Owner.of_job({"uid": None, "gid": None}, str(root))
    assert by_time.shared and shared_memory.holdings(by_time, str(root)).files == {}
    made = make("grader-after", 4096, uid=os.geteuid(), gid=os.getegid())
    kept = make("held-by-a-neighbour", 4096, uid=os.geteuid(), gid=os.getegid())
    assert shared_memory.holdings(by_time, str(root)).entries == 2
    spare = frozenset({(kept.stat().st_dev, kept.stat().st_ino)})
    assert shared_memory.sweep(by_time, str(root), spare=spare) == 1
    assert not made.exists() and kept.exists()

    assert shared_memory.sweep(by_uid, str(root)) == 4
    assert shared_memory.sweep(by_gid, str(root)) == 1
    assert sorted(os.listdir(root)) == ["grader-before", "held-by-a-neighbour", "neighbour"]


def test_too_many_entries_or_a_folder_the_watch_cannot_list_is_over_the_limits(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setattr(shared_memory, "MAX_JOB_ENTRIES", 3)
    for index in range(4):
        (tmp_path / f"sem.{index}").write_bytes(b"x")
    owner = shared_memory.Owner(uid=os.geteuid())
    assert "more than 3 files and folders in /dev/shm" in \
        shared_memory.holdings(owner, str(tmp_path)).problem()
    assert "cannot list" in shared_memory.Holdings(unreadable=["folder"]).problem()


def test_the_ipc_tables_are_read_as_memory(tmp_path):
    """Segments by id with their resident bytes; message queues and semaphore sets as the
    kernel memory they take (a set of 32000 semaphores: 2 MB)."""
    (tmp_path / "shm").write_text(
        "       key      shmid perms size  cpid  lpid nattch   uid   gid  cuid  cgid atime "
        "dtime ctime rss swap\n"
        "0 7 600 1048576 1 1 0 0 0 0 0 0 0 0 8192 0\n"
        "0 9 600 1048576 1 1 1 0 0 0 0 0 0 0 4096 0\n")
    (tmp_path / "msg").write_text(
        "key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid stime rtime ctime\n"
        "0 0 600 100 16384 1 0 0 0 0 0 0 0 0\n")
    (tmp_path / "sem").write_text(
        "key semid perms nsems uid gid cuid cgid otime ctime\n"
        "0 0 600 32000 0 0 0 0 0 0\n0 1 600 1 0 0 0 0 0 0\n")
    assert jobspace.segments(str(tmp_path)) == {("sysv", 7): 8192, ("sysv", 9): 4096}
    messages = jobspace.IPC_OBJECT_BYTES + 16384 * jobspace.MESSAGE_BYTES + 200
    semaphores = 2**21 + jobspace.IPC_OBJECT_BYTES + jobspace.SEMAPHORE_BYTES
    assert jobspace.ipc_kernel_bytes(str(tmp_path)) == messages + semaphores
    assert jobspace.ipc_kernel_bytes(str(tmp_path / "none")) == 0


def test_a_memory_file_mapped_by_one_page_still_counts_whole():
    """The exact sum counts a memory file's bytes less what its mappings add to the job's
    proportional set sizes: mapped and touched whole, it counts once (in the mapping); mapped
    by one page, it counts whole (a page in the mapping, the rest as a file). The same for a
    ``/dev/shm`` file held open, unlinked, and for a System V segment attached by a page."""
    watch = zygote.JobWatch(os.getpid(), 1, None)
    me = [os.getpid()]

    def exact(files: dict) -> dict:
        watch.mapped = {}
        watch._proportional(os.getpid(), files)
        return {key: max(0, size - watch.mapped.get(key, 0)) for key, size in files.items()}

    def key(fd: int) -> tuple[int, int]:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino

    size = 8 * 2**20
    fd = os.memfd_create("moco-ref-test")
    try:
        os.posix_fallocate(fd, 0, size)
        second = os.dup(fd)  # the same file twice: counted once
        files = {key(fd): zygote.JobWatch.memory_files(me)[key(fd)]}
        assert files == {key(fd): size}
        assert exact(files) == {key(fd): size}
        page = mmap.mmap(fd, 4096)
        page[0] = 1
        assert exact(files)[key(fd)] >= size - 4096
        whole = mmap.mmap(fd, size)
        whole[:] = b"x" * size
        assert exact(files)[key(fd)] <= size // 8
        whole.close()
        page.close()
        os.close(second)
    finally:
        os.close(fd)

    device = shared_memory.device()
    if device is not None:
        path = f"/dev/shm/moco-ref-test-{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.unlink(path)
        try:
            os.posix_fallocate(fd, 0, size)
            assert key(fd) not in zygote.JobWatch.memory_files(me)  # not a memfd
            found = zygote.JobWatch.memory_files(me, devices={device})
            assert found[key(fd)] == size
        finally:
            os.close(fd)

    def segment() -> dict:
        if not _private_ipc():
            return {"skipped": True}
        identifier = LIBC.shmget(0, ctypes.c_size_t(size), 0o1600)
        address = LIBC.shmat(identifier, None, 0)
        ctypes.memset(address, 1, size)
        LIBC.shmdt(ctypes.c_void_p(address))
        stored = jobspace.segments()
        detached = exact(stored)
        address = LIBC.shmat(identifier, None, 0)
        ctypes.memset(address, 1, 4096)  # one page mapped
        LIBC.munmap(ctypes.c_void_p(address + 4096), ctypes.c_size_t(size - 4096))
        return {"stored": list(stored.values()), "detached": list(detached.values()),
                "one page": list(exact(stored).values())}

    found = _in_child(segment)
    if not found.get("skipped"):
        assert found["stored"] == found["detached"] == [size], found
        assert found["one page"][0] >= size - 4096, found


# --------------------------------------------------------------------------- the rungs

MEMORY = "memory: the job's processes held more than its 512 MB"
# how each kind is stopped or refused, by rung: (the job's limit, or what the attack said)
BWRAP = {
    "sysv-segments": ("limit", MEMORY),
    "sysv-semaphores": ("said", "semget", "refused: ENOSPC"),  # the namespace's SEMMNS
    "ipc-limits": ("said", "sysctl", "refused: EROFS"),  # /proc/sys read-only for the job
    "shm-file": ("said", "/dev/shm", "refused: ENOSPC"),  # its own 64 MB /dev/shm
    "shm-unlinked-in-child": ("said", "unlinked in a child", "refused: ENOSPC"),
    "mqueue": ("said", "mq_open after", "refused: EMFILE"),  # RLIMIT_MSGQUEUE
    "semaphore-files": ("said", "sem_open after", "refused: ENOSPC"),
}
CONFINED = {
    "sysv-segments": ("said", "shmget", "refused: EPERM"),
    "sysv-semaphores": ("said", "semget", "refused: EPERM"),
    "ipc-limits": ("said", "sysctl", "refused: E"),  # Landlock's EACCES, or a read-only /proc
    "shm-file": ("limit", MEMORY),
    "shm-unlinked-in-child": ("limit", MEMORY),
    "mqueue": ("said", "mq_open after 0 queues", "refused: EPERM"),
    "semaphore-files": ("limit", "/dev/shm: the job kept more than 4096 files and folders"),
}


def _check(outcome: dict, expected: dict) -> None:
    """Stopped or refused as ``expected`` says, and nothing of it left on this machine."""
    name, said, limit = outcome["name"], outcome["said"], outcome["exit"].get("limit") or ""
    context = json.dumps({key: outcome[key] for key in ("said", "exit", "stderr")})[:3000]
    how = expected[name]
    if how[0] == "limit":
        assert limit.startswith(how[1]), context
    else:
        _, key, words = how
        values = [value for found, value in said.items() if found.startswith(key)]
        assert values and words in values[0] and not limit, context
        if words == "refused: ENOSPC" and "MB" in values[0]:  # at its /dev/shm's 64 MB
            assert int(values[0].split()[0]) <= jobspace.SHARED_MEMORY_MB, values
    if name == "mqueue" and how[2] == "refused: EMFILE":  # held to 800 KB: a few queues
        count = int(next(key for key in said if key.startswith("mq_open")).split()[2])
        assert 1 <= count <= 10, said
    before, after = outcome["before"], outcome["after"]
    assert [row for row in after["ipc"] if row not in before["ipc"]] == [], after["ipc"]
    left = [entry for entry in after["shm"]["entries"] if outcome["tag"] in entry]
    assert left == [], left
    assert set(outcome["queues"].values()) == {"no"}, outcome["queues"]


@pytest.fixture(scope="module")
def bwrap_sandbox() -> client.Zygote:
    try:
        return client.current_zygote(isolation="bwrap")
    except client.IsolationUnavailable as exc:
        pytest.skip(f"no bwrap here: {exc}")


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(ipc_attacks.ATTACKS))
def test_on_the_bwrap_rung_each_kind_is_stopped_or_refused_and_goes_with_the_job(
        bwrap_sandbox, name):
    """The job's own IPC namespace and 64 MB /dev/shm: segments count against its memory,
    semaphores are refused beyond a sixteenth of it (512 MB / 16 / 64 bytes each = 524288,
    in sets of at most 32000) by the namespace's own limits, which the job cannot change,
    /dev/shm and message queues are refused at their size, and the namespaces holding what
    it made are gone once it is over."""
    outcome = ipc_attacks.attack("bwrap", name)
    _check(outcome, BWRAP)
    if name == "ipc-limits":
        assert outcome["said"]["sem limits"] == "32000 524288 500 1024", outcome["said"]
    namespaces = outcome["said"]["namespaces"].split()
    assert len(namespaces) == 2 and not set(namespaces) & set(outcome["host namespaces"])
    assert outcome["namespaces still held"] == [], outcome["namespaces still held"]


@pytest.mark.full
@needs_landlock
@pytest.mark.parametrize("name", sorted(ipc_attacks.ATTACKS))
def test_on_the_confined_rung_each_kind_is_stopped_or_refused_and_removed(name):
    """The container's IPC namespace and /dev/shm, shared: System V IPC and message queues
    are refused by the filter, the job's /dev/shm files (named, in folders, unlinked and held
    open by a child) count against its memory and are removed at its end. Here the grader is
    root and its Python closed to others, so the job is uid 0 with a gid of its own."""
    outcome = ipc_attacks.attack("confined", name)
    _check(outcome, CONFINED)
    if os.geteuid() == 0:
        gid = outcome["exit"]["isolation"]
        assert "of its own" in gid, gid
    words = client.not_protected("confined")
    assert "/dev/shm shared between jobs (what a job keeps there counts against its memory " \
        "and is removed at its end" in words, words


@pytest.mark.full
@needs_root
@needs_landlock
@pytest.mark.parametrize("user, home_closed", [(None, False), (None, True), (61250, False)],
                         ids=["job-uids", "uid0-own-gid", "grader-not-root"])
def test_inside_a_default_container_each_kind_is_stopped_or_refused_and_removed(user,
                                                                                home_closed):
    """Where Gradescope and PrairieLearn run the grader (the simulation, without
    ``CAP_SYS_PTRACE``): with a uid per job (the grader root); as uid 0 with a gid per job
    (the Python installation closed to others: the supervisor watches with that gid, or the
    kernel would hide the job's descriptors from it); and with the grader's own uid (a grader
    that is not root: its jobs' /dev/shm files are told apart by when they appear)."""
    command = [sys.executable, "-m", "tests.sandbox.ipc_attacks", "--rung", "confined",
               *(["--user", str(user)] if user else []), *sorted(ipc_attacks.ATTACKS)]
    env = {key: value for key, value in os.environ.items() if key != client.ISOLATION_VARIABLE}
    done = subprocess.run(default_container.command(command, home_closed=home_closed),
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout)["outcomes"]
    assert [outcome["name"] for outcome in outcomes] == sorted(ipc_attacks.ATTACKS)
    for outcome in outcomes:
        _check(outcome, CONFINED)
        isolation = outcome["exit"]["isolation"]
        if user:
            assert outcome["uid"] == user and f"the grader's uid {user}" in isolation
        elif home_closed:
            assert "uid 0 without capabilities (gid 611" in isolation, isolation
        else:
            assert "of its own (unprivileged)" in isolation, isolation


BUNDLED = ("sysv_segment_hoard.py", "sysv_segments_scattered.py", "shm_file_hoard.py",
           "shm_file_held_by_child.py", "mqueue_left_open.py", "mqueue_filled.py",
           "semaphore_file_left.py", "sysv_semaphore_hoard.py")


@pytest.mark.full
@pytest.mark.parametrize("rung", ["bwrap", pytest.param("confined", marks=needs_landlock)])
def test_the_bundled_examples_get_their_verdicts_on_each_rung(rung, monkeypatch):
    """Two shapes of each kind in the adversarial corpus (``examples/adversarial``): the
    same verdict on both rungs, and nothing of theirs left behind."""
    from moco_ref.probe.options import GradeOptions
    from moco_ref.run.demo import find_manifest, load_manifest, run_demo, surprise_details

    if rung == "bwrap":
        try:
            client.current_zygote(isolation="bwrap")
        except client.IsolationUnavailable as exc:
            pytest.skip(f"no bwrap here: {exc}")
    monkeypatch.setenv(client.ISOLATION_VARIABLE, rung)
    manifest = find_manifest().parents[1] / "adversarial" / "manifest.json"
    examples = [example for example in load_manifest(manifest)
                if example.path.name in BUNDLED]
    assert sorted(example.path.name for example in examples) == sorted(BUNDLED)
    rows = ipc_attacks.ipc_rows()
    outcomes = {outcome.example.path.name: outcome
                for outcome in run_demo(examples, GradeOptions(), jobs=2)}
    for outcome in outcomes.values():
        assert outcome.as_expected, "\n".join(surprise_details(outcome))
        assert outcome.report.isolation.startswith(rung)
    assert ipc_attacks.ipc_rows() == rows
    names = ("moco-hoard", "moco-hidden-", "sem.moco-left")
    assert not [entry for entry in os.listdir("/dev/shm") if entry.startswith(names)]
    for name in ["/moco-left", *(f"/moco-filled-{index}" for index in range(3))]:
        assert ipc_attacks.message_queue_exists(name) == "no", name
    said = {name: outcome.report.stdout for name, outcome in outcomes.items()}
    if rung == "confined":
        assert "shmget refused: Operation not permitted" in said["sysv_segment_hoard.py"]
        assert "mq_open refused: Operation not permitted" in said["mqueue_left_open.py"]
    else:
        assert "No space left on device" in said["shm_file_hoard.py"]
        # the queue is made, unless the sandbox user's RLIMIT_MSGQUEUE (counted per host user,
        # shared by the jobs running at once) was just used up by mqueue_filled.py
        assert ("queue /moco-left left with a message: True" in said["mqueue_left_open.py"]
                or "mq_open refused: Too many open files" in said["mqueue_left_open.py"])
