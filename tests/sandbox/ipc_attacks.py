"""Jobs that keep memory where it outlives them or where no process's memory shows it —
System V segments and semaphore sets, ``/dev/shm`` files, POSIX message queues, named
semaphores — run on one rung, with what is left afterwards (issue 38, item 3). Used by
``test_ipc_and_shared_memory`` in its own process, and run as

    python -m tests.sandbox.ipc_attacks --rung confined [--user UID] NAME ...

inside the default-container simulation (JSON on stdout: one ``outcome`` per NAME)."""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import secrets
import sys
import tempfile
import textwrap
import time

PREAMBLE = '''
import ctypes, ctypes.util, os, sys, time

TAG = "TAG_VALUE"
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p
if not hasattr(LIBC, "sem_open"):
    LIBC = ctypes.CDLL(ctypes.util.find_library("pthread"), use_errno=True)
LIBC.sem_open.restype = ctypes.c_void_p


def say(key, value):
    print(f"ATTACK {key}: {value}", flush=True)


def failed(what):
    number = ctypes.get_errno()
    say(what, "refused: " + errno_name(number) + " " + os.strerror(number))


def errno_name(number):
    import errno
    return errno.errorcode.get(number, str(number))


def namespaces():
    say("namespaces", " ".join(os.readlink(f"/proc/self/ns/{kind}") for kind in ("ipc", "mnt")))
'''

ATTACKS = {
    # 3 x 300 MB, written, detached, kept: the segments outlive the processes
    "sysv-segments": '''
def moco_warmup():
    namespaces()
    for index in range(3):
        size = 300 * 2**20
        segment = LIBC.shmget(0, ctypes.c_size_t(size), 0o1600)
        if segment < 0:
            return failed("shmget")
        address = LIBC.shmat(segment, None, 0)
        ctypes.memset(address, 1, size)
        LIBC.shmdt(ctypes.c_void_p(address))
        say("segments", f"{(index + 1) * 300} MB")
    time.sleep(30)
''',
    # semaphore sets of 32000: ~2 MB of kernel memory each, in no process
    "sysv-semaphores": '''
def moco_warmup():
    namespaces()
    for index in range(600):
        if LIBC.semget(0, 32000, 0o1600) < 0:
            return failed("semget")
    say("semaphore sets", "600")
    time.sleep(30)
''',
    # 900 MB in one file of /dev/shm, closed, left
    "shm-file": '''
def moco_warmup():
    namespaces()
    block, written = b"x" * 2**20, 0
    try:
        with open(f"/dev/shm/{TAG}-hoard", "wb") as handle:
            while written < 900:
                handle.write(block)
                handle.flush()
                written += 1
    except OSError as error:
        say("/dev/shm", f"{written} MB, then refused: {errno_name(error.errno)}")
        return
    say("/dev/shm", f"{written} MB")
    time.sleep(30)
''',
    # a forked child writes 900 MB into a file of a folder of its own in /dev/shm, unlinked at
    # once and held open: no name, no mapping, not a memfd
    "shm-unlinked-in-child": '''
def moco_warmup():
    namespaces()
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        word, written = "", 0
        try:
            os.mkdir(f"/dev/shm/{TAG}-folder", 0o700)
            path = f"/dev/shm/{TAG}-folder/hoard"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.unlink(path)
            for written in range(900):
                os.write(fd, b"x" * 2**20)
            word = "900 MB"
        except OSError as error:
            word = f"{written} MB, then refused: {errno_name(error.errno)}"
        os.write(write_end, word.encode())
        time.sleep(60)
        os._exit(0)
    word = os.read(read_end, 200).decode()
    say("unlinked in a child", word)
    time.sleep(30 if word == "900 MB" else 1)
''',
    # POSIX message queues of the largest allowed size, filled, made until refused, kept
    "mqueue": '''
class Attributes(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("reserved", ctypes.c_long * 4)]


def moco_warmup():
    namespaces()
    attributes, message = Attributes(0, 10, 8192, 0), b"x" * 8192
    for index in range(1000):
        queue = LIBC.mq_open(f"/{TAG}-{index}".encode(), 0o2 | 0o100 | 0o4000, 0o600,
                             ctypes.byref(attributes))
        if queue < 0:
            return failed(f"mq_open after {index} queues")
        while LIBC.mq_send(queue, message, len(message), 0) == 0:
            pass
    say("mq_open", "1000 queues")
''',
    # named POSIX semaphores (sem.NAME files in /dev/shm), never unlinked, until refused
    "semaphore-files": '''
def moco_warmup():
    namespaces()
    for index in range(20000):
        if LIBC.sem_open(f"/{TAG}-{index}".encode(), 0o100, 0o600, 1) in (None, 0):
            return failed(f"sem_open after {index}")
    say("sem_open", "20000 semaphores")
    time.sleep(30)
''',
    # the namespace's System V limits, written back unchanged (harmless where it works)
    "ipc-limits": '''
def moco_warmup():
    namespaces()
    with open("/proc/sys/kernel/sem") as handle:
        value = handle.read()
    say("sem limits", " ".join(value.split()))
    try:
        with open("/proc/sys/kernel/sem", "w") as handle:
            handle.write(value)
        say("sysctl sem", "written")
    except OSError as exc:
        say("sysctl sem", "refused: " + errno_name(exc.errno) + " " + exc.strerror)
''',
}

FINISH = '''

def train_moco(initial, x, train, epochs=15):
    return None
'''


def ipc_rows() -> dict[str, set[tuple[str, str]]]:
    """The rows (key, id) of this IPC namespace's System V tables."""
    found = {}
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as handle:
            handle.readline()
            found[kind] = {tuple(line.split()[:2]) for line in handle}
    return found


def shared_memory_state() -> dict:
    entries = {}
    for entry in os.scandir("/dev/shm"):
        info = entry.stat(follow_symlinks=False)
        entries[entry.name] = [info.st_uid, info.st_gid]
    usage = os.statvfs("/dev/shm")
    return {"entries": entries,
            "used_mb": (usage.f_blocks - usage.f_bfree) * usage.f_frsize / 2**20}


def message_queue_exists(name: str) -> str:
    """``"no"`` when this IPC namespace has no POSIX message queue ``name``, else why not
    sure (``"yes"`` or an errno name)."""
    libc = ctypes.CDLL(None, use_errno=True)
    queue = libc.mq_open(name.encode(), os.O_RDONLY)
    if queue >= 0:
        libc.mq_close(queue)
        return "yes"
    number = ctypes.get_errno()
    return "no" if number == errno.ENOENT else errno.errorcode.get(number, str(number))


def namespaces_in_use() -> set[str]:
    """Every IPC and mount namespace a process of this machine is in (as seen from here)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            for kind in ("ipc", "mnt"):
                try:
                    found.add(os.readlink(f"/proc/{name}/ns/{kind}"))
                except OSError:
                    pass
    return found


def attack(rung: str, name: str, *, memory_mb: int = 512, timeout: float = 60) -> dict:
    """Run the attack ``name`` as a submission's ``moco_warmup`` on ``rung``; what it said,
    how its job ended, and what the machine holds before and after."""
    from moco_ref.probe.options import GradeOptions
    from moco_ref.sandbox import client
    from moco_ref.sandbox.attempt import run_attempt

    tag = f"moco-ref-test-{secrets.token_hex(4)}"
    sandbox = client.current_zygote(isolation=rung)
    folder = tempfile.mkdtemp(prefix="moco-ref-ipc-")
    path = os.path.join(folder, f"attack_{name.replace('-', '_')}.py")
    with open(path, "w") as handle:
        handle.write(PREAMBLE.replace("TAG_VALUE", tag) + textwrap.dedent(ATTACKS[name])
                     + FINISH)
    options = GradeOptions(style="lab", memory_mb=memory_mb, timeout=timeout)
    before = {"ipc": sorted(map(list, set().union(*ipc_rows().values()))),
              "shm": shared_memory_state()}
    started = time.monotonic()
    attempt = run_attempt(sandbox, path, options, time.monotonic() + timeout, ["moco_warmup"],
                          helpers=False)
    said = {}
    for line in attempt.stdout.splitlines():
        if line.startswith("ATTACK "):
            key, _, value = line[len("ATTACK "):].partition(": ")
            said[key] = value
    rows = ipc_rows()
    after = {"ipc": sorted(map(list, set().union(*rows.values()))),
             "shm": shared_memory_state()}
    queues = {f"/{tag}-{index}": message_queue_exists(f"/{tag}-{index}") for index in (0, 1)}
    job_namespaces = said.get("namespaces", "").split()
    return {"name": name, "rung": rung, "tag": tag, "said": said, "exit": attempt.exit or {},
            "seconds": round(time.monotonic() - started, 1), "before": before, "after": after,
            "queues": queues, "isolation": sandbox.namespaces,
            "namespaces still held": sorted(set(job_namespaces) & namespaces_in_use()),
            "host namespaces": sorted({os.readlink(f"/proc/self/ns/{kind}")
                                       for kind in ("ipc", "mnt")}),
            "stderr": attempt.stderr[-2000:], "uid": os.geteuid()}


def _become(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sandbox.ipc_attacks")
    parser.add_argument("--rung", default="confined")
    parser.add_argument("--user", type=int, help="run as this uid (the grader not root)")
    parser.add_argument("names", nargs="+", choices=sorted(ATTACKS))
    args = parser.parse_args(argv)
    if args.user is not None:
        _become(args.user)
        os.environ["HOME"] = tempfile.gettempdir()
    outcomes = [attack(args.rung, name) for name in args.names]
    print(json.dumps({"outcomes": outcomes}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
