"""``moco-ref doctor``: what a submission's process actually sees here, found by grading a
probe submission in the same sandbox as any other (its ``moco_warmup`` reports from inside):
its user, capabilities, no_new_privs and seccomp, limits, which paths it can read or write,
whether it can change the device nodes, its /dev/shm and terminals, whether it sees other
processes, and whether it reaches the network or host sockets; and, from outside, the host
user its processes run as."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

PROBE = r'''
import errno, os, resource, socket


def _status():
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp"):
                fields[key] = value.strip()
    return fields


def _can(action, path):
    try:
        if action == "read":
            return "yes (%d entries)" % len(os.listdir(path))
        else:
            name = os.path.join(path, ".moco-ref-doctor-probe")
            with open(name, "w") as handle:
                handle.write("x")
            os.remove(name)
        return "yes"
    except OSError as error:
        return "no (" + type(error).__name__ + ")"


def _network():
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1).close()
        return "reaches the internet"
    except OSError as error:
        return "no internet (" + type(error).__name__ + ")"


def _devices():
    changed, refused = [], set()
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        path = "/dev/" + name
        try:
            info = os.stat(path)
        except OSError:
            continue
        for change in (lambda: os.chmod(path, info.st_mode & 0o7777),  # the mode it has
                       lambda: os.chown(path, info.st_uid, info.st_gid)):  # the owner too
            try:
                change()
                changed.append(name)
            except OSError as error:
                refused.add(errno.errorcode.get(error.errno, str(error.errno)))
    if changed:
        return "CAN BE CHANGED: " + ", ".join(sorted(set(changed)))
    return "read-only (chmod and chown refused: " + ", ".join(sorted(refused)) + ")"


def _shared_memory():
    try:
        info = os.statvfs("/dev/shm")
    except OSError as error:
        return "none (" + type(error).__name__ + ")"
    return "%d MB" % (info.f_blocks * info.f_frsize // 2**20)


def _limit(name):
    soft, _ = resource.getrlimit(getattr(resource, name))
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def _listing(path, shown):
    try:
        return shown(os.listdir(path))
    except OSError as error:
        return "not readable (" + type(error).__name__ + ")"


def moco_warmup():
    paths = PATHS
    report = {"uid": str(os.getuid()), "gid": str(os.getgid()), "cwd": os.getcwd()}
    report.update(_status())
    report["processes visible"] = _listing(
        "/proc", lambda names: str(sum(1 for p in names if p.isdigit())))
    report["top of the file system"] = _listing("/", lambda names: " ".join(sorted(names)))
    report["network"] = _network()
    report["device nodes"] = _devices()
    report["/dev/shm"] = _shared_memory()
    try:
        report["terminals (/dev/pts)"] = " ".join(sorted(os.listdir("/dev/pts"))) or "none"
    except OSError as error:
        report["terminals (/dev/pts)"] = "none (" + type(error).__name__ + ")"
    for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE"):
        report[name] = _limit(name)
    for label, path in paths.items():
        report["read " + label] = _can("read", path)
        report["write " + label] = _can("write", path)
    return {"temperature_probabilities": {}, "FIFO": [], "EMA": [], "doctor": report}
'''


def add_parser(subparsers) -> None:
    from moco_ref.cli.isolation import add_isolation_flag

    parser = subparsers.add_parser(
        "doctor", help="what a graded submission's process can see and do here")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_isolation_flag(parser, help_text="the isolation to look at (default: the one "
                       "grading uses)")
    parser.set_defaults(run=run)


def explain_isolation(isolation: str | None = None) -> dict:
    """What the probe submission reported from inside the sandbox, and the isolation mode."""
    from moco_ref.probe.options import GradeOptions
    from moco_ref.run.pipeline import observe_sandboxed
    from moco_ref.sandbox.client import current_zygote, isolation_description, not_protected

    project = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="moco-ref-doctor-") as folder:
        paths = {"home": os.path.expanduser("~"), "project": project, "/tmp": "/tmp",
                 "the submission's folder": folder, "/": "/", "the package": str(
                     Path(__file__).resolve().parents[1])}
        probe = Path(folder) / "doctor_probe.py"
        probe.write_text(PROBE.replace("PATHS", repr(paths)))
        record = observe_sandboxed(str(probe), GradeOptions(style="lab", timeout=60),
                                   isolation=isolation)
    warmup = record.get("observations", {}).get("moco_warmup", {})
    inside = ((warmup.get("result") or {}).get("doctor")) if isinstance(warmup, dict) else None
    zygote = current_zygote(isolation=isolation)
    return {"rung": zygote.rung, "jobs as root": zygote.jobs_as_root,
            "isolation": isolation_description(isolation),
            "not protected": not_protected(isolation),
            "host uid": zygote.host_user(), "inside": inside,
            "problem": None if inside else (record.get("traceback") or str(warmup)[:2000])}


def run(args: argparse.Namespace) -> int:
    from moco_ref.cli.isolation import isolation_refusal
    from moco_ref.sandbox.seccomp import Tightening, refused_calls

    refusal = isolation_refusal(args.isolation)
    if refusal:
        print(json.dumps({"isolation": None, "problem": refusal}) if args.json else
              f"moco-ref: {refusal}")
        return 1
    found = explain_isolation(args.isolation)
    found["seccomp refuses"] = refused_calls(
        Tightening(tcp=True, file_metadata=found["jobs as root"])
        if found["rung"] == "confined"
        else None)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0 if found["inside"] else 1
    print(f"rung in force: {found['rung']}")
    print(f"isolation: {found['isolation']}")
    print(found["not protected"])
    print(f"host uid of the submission's processes: {found['host uid']}")
    if not found["inside"]:
        print(f"the probe submission could not report: {found['problem']}")
        return 1
    width = max(len(key) for key in found["inside"])
    for key, value in found["inside"].items():
        print(f"  {key:<{width}}  {value}")
    if found["rung"] == "bwrap":
        print("  (/tmp inside is the job's own scratch; home and project are the empty folders "
              "above the bound Python installation)")
    if found["rung"] != "processes":
        print(f"seccomp refuses: {', '.join(found['seccomp refuses'])}")
    return 0
