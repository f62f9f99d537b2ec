"""The pieces of the sandbox, one at a time: the framed observation channel, the
reference-import guard, the /proc sweeps, the namespaces, the zygote, and the strict validation
of observation records against the probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from moco_ref.judge.styles import validate_part
from moco_ref.observe import channel
from moco_ref.observe.worker import observe_submission
from moco_ref.probe.options import GradeOptions
from moco_ref.run.pipeline import grade_submission
from moco_ref.sandbox import client, procs, seccomp
from tests.helpers.grading_stubs.leftovers import TAG, leftovers, wait_for_no_leftovers

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "submissions")

# --------------------------------------------------------------------------- the channel


def _read_all(data: bytes, nonce: bytes) -> channel.ChannelLog:
    read_end, write_end = os.pipe()
    reader = channel.FrameReader(read_end, nonce)
    os.write(write_end, data)
    os.close(write_end)
    return reader.join(5)


def _frames(nonce: bytes, *items) -> bytes:
    read_end, write_end = os.pipe()
    writer = channel.FrameWriter(write_end, nonce)
    for kind, payload in items:
        writer.send(kind, payload)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        return handle.read()


def test_frames_round_trip_as_plain_data():
    nonce = channel.new_nonce()
    data = _frames(nonce, (channel.STAGE, {"stage": "observe"}),
                   (channel.PART, {"part": "x", "data": torch.arange(3)}))
    log = _read_all(data, nonce)
    assert not log.corrupt and [f.kind for f in log.frames] == [channel.STAGE, channel.PART]
    assert torch.equal(log.frames[1].payload["data"], torch.arange(3))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("tamper", ["nonce", "garbage", "cut", "code"])
def test_anything_but_our_frames_marks_the_channel_corrupt(tamper):
    nonce = channel.new_nonce()
    good = _frames(nonce, (channel.STAGE, {"stage": "observe"}))
    if tamper == "nonce":
        data = good + _frames(channel.new_nonce(), (channel.RESULT, {"gradable": True}))
    elif tamper == "garbage":
        data = good + b"\0" * 100
    elif tamper == "cut":
        data = good + _frames(nonce, (channel.RESULT, {"gradable": True}))[:-3]
    else:  # a pickle that is not plain data: torch.load(weights_only=True) refuses it
        import io
        import pickle

        body = pickle.dumps(os.system)
        buffer = io.BytesIO()
        buffer.write(body)
        data = good + channel._HEADER.pack(channel.MAGIC, nonce, channel.PART, len(body)) + body
    log = _read_all(data, nonce)
    assert log.corrupt
    assert [f.kind for f in log.frames] == [channel.STAGE]  # what came before is kept


# --------------------------------------------------------------------------- the guard

GUARD_SCRIPT = textwrap.dedent("""
    import importlib, sys, types
    from moco_ref.observe import guard
    g = guard.install()
    submission = types.ModuleType("moco_submission")
    results = {}
    for label, code in [
        ("import", "import moco_ref"),
        ("from", "from moco_ref.core.step import MoCoTrainer"),
        ("dunder", "__import__('moco_ref.core.queue')"),
        ("import_module", "import importlib; importlib.import_module('moco_ref.core.warmup')"),
        ("find_spec", "import importlib.util; importlib.util.find_spec('moco_ref.core.lab')"),
        ("other", "import json"),
    ]:
        try:
            exec(code, submission.__dict__)
            results[label] = "allowed"
        except ImportError as error:
            results[label] = "refused" if "refuses" in str(error) else repr(error)
    grader = types.ModuleType("moco_ref.observe.fake_observer")  # grader code may import it
    exec("from moco_ref.judge import registry; import moco_ref.tools.walk", grader.__dict__)
    print(results, sorted(g.refused))
""")


@pytest.mark.full  # the second tier: starts the real sandbox per case
def test_the_guard_refuses_reference_imports_from_submission_code():
    done = subprocess.run([sys.executable, "-c", GUARD_SCRIPT], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": _package_root()})
    assert done.returncode == 0, done.stderr
    results, refused = done.stdout.strip().split("} ")
    assert results + "}" == str({"import": "refused", "from": "refused", "dunder": "refused",
                                 "import_module": "refused", "find_spec": "refused",
                                 "other": "allowed"})
    # find_spec("moco_ref.core.lab") is refused at its first parent, "moco_ref"; `from
    # moco_ref.core import queue` is refused at "moco_ref.core" too
    assert refused == str(sorted(["moco_ref", "moco_ref.core", "moco_ref.core.step",
                                  "moco_ref.core.queue", "moco_ref.core.warmup"]))


def _package_root() -> str:
    import moco_ref

    return os.path.dirname(os.path.dirname(moco_ref.__file__))


# --------------------------------------------------------------------------- /proc sweeps


def test_sweeps_find_a_double_forked_setsid_grandchild():
    """A grandchild that left the session and lost its parent is still found: by the token in
    its environment, and (while it lives) below a subreaper."""
    token = "sweep-test-" + TAG
    env = {**os.environ, procs.TOKEN_VARIABLE: token}
    script = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        time.sleep(600)\n"
              "    os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    deadline = time.monotonic() + 10
    while not (members := procs.job_members(token=token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(members) == 1
    (pid,) = members
    info = procs.read_info(pid)
    assert info.sid != os.getsid(0) and info.ppid != os.getpid()  # only the token finds it
    assert procs.kill_until_gone(lambda: procs.job_members(token=token)) == 1
    assert procs.job_members(token=token) == set()


def test_the_leftover_scan_sees_tagged_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", TAG])
    try:
        assert any(pid == child.pid for pid, _ in leftovers())
    finally:
        child.kill()
        child.wait()
    assert wait_for_no_leftovers() == []


# --------------------------------------------------------------------------- seccomp

_REFUSED_PROBES = {  # name: (syscall number on x86-64, arguments)
    "unshare(CLONE_NEWUSER)": (272, (0x10000000,)),
    "unshare(CLONE_NEWNS)": (272, (0x00020000,)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "umount2": (166, (0, 0)),
    "mount_setattr": (442, (0, 0, 0, 0, 0)),
    "fsopen": (430, (0, 0)),
    "ptrace(PTRACE_TRACEME)": (101, (0, 0, 0, 0)),
    "process_vm_readv": (310, (1, 0, 0, 0, 0, 0)),
    "keyctl": (250, (0, 0)),
    "bpf": (321, (0, 0, 0)),
    "perf_event_open": (298, (0, 0, 0, 0, 0)),
    "userfaultfd": (323, (0,)),
    "io_uring_setup": (425, (1, 0)),
    "setns": (308, (0, 0)),
    "clone(CLONE_NEWUSER)": (56, (0x10000000 | 17, 0, 0, 0, 0)),
}


def _in_child(body) -> str:
    """``body()``'s text, computed in a forked child (the filter cannot be removed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        os.close(read_end)
        try:
            text = body()
        except BaseException as error:  # noqa: BLE001
            text = repr(error)
        os.write(write_end, text.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        message = handle.read().decode()
    os.waitpid(pid, 0)
    return message


@pytest.mark.skipif(seccomp.available() != "", reason="no seccomp table for this machine")
def test_the_seccomp_filter_refuses_what_grading_never_needs_and_allows_the_rest():
    def body():
        import ctypes
        import errno
        import subprocess
        import threading

        libc = ctypes.CDLL(None, use_errno=True)
        seccomp.install()
        got = {}
        for name, (number, args) in _REFUSED_PROBES.items():
            result = libc.syscall(number, *args)
            got[name] = "EPERM" if result == -1 and ctypes.get_errno() == errno.EPERM else \
                f"{result}/{ctypes.get_errno()}"
        result = libc.syscall(435, 0, 0)
        got["clone3"] = "ENOSYS" if ctypes.get_errno() == errno.ENOSYS and result == -1 else "?"
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        got["threads, fork and exec"] = str(subprocess.run(["/bin/true"]).returncode)
        return repr(got)

    got = eval(_in_child(body))  # noqa: S307 - our own child's repr of a dict of strings
    assert got == {**{name: "EPERM" for name in _REFUSED_PROBES}, "clone3": "ENOSYS",
                   "threads, fork and exec": "0"}


def test_every_refused_call_is_named_for_the_documentation():
    assert {"ptrace", "mount", "mount_setattr", "unshare", "setns", "bpf", "keyctl",
            "io_uring_setup", "userfaultfd", "perf_event_open"} <= set(seccomp.refused_calls())


# --------------------------------------------------------------------------- the zygote


def test_the_zygote_is_warm_single_threaded_and_isolates():
    zygote = client.zygote_for(client.child_environment())
    hello = zygote.hello
    assert hello["threads"] == 1  # forking a threaded process is unsafe
    assert {"torch", "torch.optim", "moco_ref.observe.worker"} <= set(hello["preload"]["loaded"])
    # optimizers run eagerly without importing torch's compiler (1.4 s of every start)
    assert hello["preload"]["eager_optimizer_wrappers"] > 0
    assert hello["preload"]["compiler_imported"] is False
    assert hello["subreaper"]


@pytest.mark.slow  # starts a zygote of its own (~5-15 s)
def test_a_killed_zygote_is_replaced(tmp_path):
    from tests.helpers.grading_stubs.fixtures import GOOD_WARMUP, write

    env = client.child_environment()
    old = client.zygote_for(env)
    os.kill(old.process.pid, signal.SIGKILL)
    old.process.wait()
    report = grade_submission(write(tmp_path, "ok.py", GOOD_WARMUP + "\nSEED = 0\n"))
    assert client.zygote_for(env) is not old
    assert report.gradable or "internal error" in report.traceback


# --------------------------------------------------------------------------- records


@pytest.fixture(scope="module")
def lab_parts():
    frames = observe_submission(os.path.join(EXAMPLES, "correct_lab_order.py"),
                                GradeOptions(style="lab"))
    return frames["parts"]


def _check(parts, edit=None, options=None) -> str:
    import copy

    payload = copy.deepcopy(parts["train_moco"])
    if edit is not None:
        edit(payload["data"], payload["meta"])
    return validate_part("lab", "train_moco", payload["data"], payload["meta"],
                         options or GradeOptions(style="lab"))


def test_a_real_record_is_valid(lab_parts):
    assert _check(lab_parts) == ""
    warmup = lab_parts["moco_warmup"]
    assert validate_part("lab", "moco_warmup", warmup["data"], warmup["meta"],
                         GradeOptions()) == ""


def _scale_outputs(data, meta):
    data["events"][5]["output"] = data["events"][5]["output"] * 1.05


def _hide_ids(data, meta):
    data["events"][3]["rows_id"] = torch.full_like(data["events"][3]["rows_id"], -1)


def _other_initial(data, meta):
    data["initial_params"] = data["initial_params"] + 0.01


def _other_seed(data, meta):
    meta["probe"] = {**meta["probe"], "seed": 5}


def _reorder_clock(data, meta):
    data["events"][2]["clock"] = data["events"][1]["clock"]


def _wrong_shape(data, meta):
    data["events"][0]["params"][0] = data["events"][0]["params"][0][:-1]


def _not_plain(data, meta):
    data["events"][0]["output"] = torch.nn.Parameter(data["events"][0]["output"])


@pytest.mark.parametrize(("edit", "problem"), [
    (_scale_outputs, "event 5: the recorded output of the probe model differs"),
    (_hide_ids, "event 3: rows traced to view call"),
    (_other_initial, "initial_params are not the probe model's"),
    (_other_seed, "the record names probe"),
    (_reorder_clock, "clock does not move forward"),
    (_wrong_shape, "has shape"),
    (_not_plain, "is not a tensor"),
])
def test_altered_records_are_refused(lab_parts, edit, problem):
    assert problem in _check(lab_parts, edit)


@pytest.mark.parametrize("where", ["record", "event", "returned", "meta"])
def test_an_entry_the_observer_never_writes_is_refused(lab_parts, where):
    def plant(data, meta):
        target = {"record": data, "event": data["events"][0], "returned": data["returned"],
                  "meta": meta}[where]
        target["ta_override"] = "full marks"

    assert "entries the observer never writes: ['ta_override']" in _check(lab_parts, plant)


@pytest.mark.parametrize(("style", "example", "part", "plant"), [
    ("components", "components_correct.py", "queue", lambda d: d[0].update(extra=1)),
    ("components", "components_correct.py", "ema", lambda d: d[0].update(extra=1)),
    ("builder", "builder_correct_official_style.py", "all",
     lambda d: d["run"]["steps"][0]["events"][0].update(extra=1)),
    ("builder", "builder_correct_official_style.py", "all",
     lambda d: d["mlp"]["module"].update(extra=1)),
])
def test_other_styles_refuse_entries_the_observer_never_writes(style, example, part, plant):
    options = GradeOptions(style=style)
    payload = observe_submission(os.path.join(EXAMPLES, example), options)["parts"][part]
    assert validate_part(style, part, payload["data"], payload["meta"], options) == ""
    plant(payload["data"])
    assert "entries the observer never writes: ['extra']" in validate_part(
        style, part, payload["data"], payload["meta"], options)


def test_a_record_for_another_seed_is_refused(lab_parts):
    assert "the record names probe" in _check(lab_parts, options=GradeOptions(seed=4))


# --------------------------------------------------------------------------- fair to neighbours


def test_extra_view_calls_beyond_what_the_probe_makes_are_refused_cheaply(lab_parts):
    """Hundreds of extra ``views`` calls all naming one stored tensor are tiny on the wire
    and costly to check: a record with more calls, or more viewed images, than a run of the
    probe can make is refused at once, by bounds derived from the probe's own sizes."""
    import time

    from moco_ref.probe.cases import default_lab_probe

    probe = default_lab_probe(0)
    many = torch.arange(probe.n_images)

    def flood(data, meta):
        data["view_calls"] = data["view_calls"] + [many] * 40

    started = time.monotonic()
    problem = _check(lab_parts, flood)
    assert "images together" in problem and str(probe.max_view_rows) in problem
    assert time.monotonic() - started < 5

    def calls(data, meta):
        data["view_calls"] = data["view_calls"] + [many[:1]] * probe.max_view_calls

    assert f"at most {probe.max_view_calls} calls" in _check(lab_parts, calls)


def test_checking_a_record_stops_at_the_grader_s_own_deadline(lab_parts):
    """Validation checks its deadline inside its loops: past it, the grader's trouble is
    raised (never a verdict on the submission)."""
    import time

    from moco_ref.judge.record import GraderOutOfTime

    payload = lab_parts["train_moco"]
    with pytest.raises(GraderOutOfTime):
        validate_part("lab", "train_moco", payload["data"], payload["meta"],
                      GradeOptions(style="lab"), deadline=time.monotonic() - 1)


def test_concurrent_jobs_get_a_cpu_each_while_there_are_cpus():
    """A fair share: each running job its own CPU while one is free, none beyond that; a
    CPU given back is given again."""
    from moco_ref.sandbox.attempt import CpuShares

    shares = CpuShares(cpus=[0, 1])
    first, second, third = shares.take(), shares.take(), shares.take()
    assert {first, second} == {0, 1} and third is None
    shares.give_back(first)
    assert shares.take() == first


def test_a_job_runs_on_its_own_cpu_and_cannot_leave_it(tmp_path):
    """Inside the sandbox the job's affinity is the one CPU it was given, and it cannot widen
    it (``sched_setaffinity`` is refused by the filter)."""
    from moco_ref.run.pipeline import observe_sandboxed

    probe = tmp_path / "affinity.py"
    probe.write_text(
        "import os\n"
        "def moco_warmup():\n"
        "    before = sorted(os.sched_getaffinity(0))\n"
        "    try:\n"
        "        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))\n"
        "        widened = 'yes'\n"
        "    except OSError as exc:\n"
        "        widened = type(exc).__name__\n"
        "    return {'FIFO': before, 'EMA': [], 'temperature_probabilities': {},\n"
        "            'widened': widened}\n")
    record = observe_sandboxed(str(probe), GradeOptions(style="lab", timeout=60))
    result = record["observations"]["moco_warmup"]["result"]
    assert len(result["FIFO"]) == 1 and result["widened"] == "PermissionError"
