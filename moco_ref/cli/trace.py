"""``moco-ref trace record|check … -- SCRIPT ARGS`` and ``moco-ref revisions A B -- …``.

``trace`` runs the user's own training script in this process (trusted code: no sandbox),
attaches the recorder to the first instance of ``--attach`` it calls and stops after
``--steps`` steps: ``record`` saves the trajectory for ``moco-ref compare``, ``check`` prints
the grader's verdicts (exit 0 at full marks, 1 otherwise). ``revisions`` runs one recording
command (``record …`` on the grader's probe, or ``trace record …``) at two git revisions of
the user's repository, each in a worktree of its own, and compares the two.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from moco_ref.trace.layouts import LAYOUTS


def add_parsers(subparsers) -> None:
    trace = subparsers.add_parser(
        "trace", help="record or check the MoCo of your own training script, in this process "
                      "(trusted code: no sandbox)")
    actions = trace.add_subparsers(dest="action", required=True)
    for action, help_text in (("record", "save the trajectory of the script's first steps"),
                              ("check", "judge the script's first steps with the grader's "
                                        "checks")):
        parser = actions.add_parser(action, help=help_text)
        _add_part_flags(parser)
        if action == "record":
            parser.add_argument("--out", required=True, type=Path,
                                help="trajectory file to write (for moco-ref compare)")
        else:
            parser.add_argument("--ragged", choices=("drops", "refuses"), default=None,
                                help="your policy when K is not a multiple of the batch")
        parser.add_argument("command", nargs="*", default=[],
                            help="-- SCRIPT.py ARGS… or -- -m MODULE ARGS…")
        parser.set_defaults(run=run_trace)
    revisions = subparsers.add_parser(
        "revisions", help="run one recording command at two git revisions (worktrees) and "
                          "compare the trajectories")
    revisions.add_argument("a", help="the revision before (e.g. HEAD~1, a tag, a commit)")
    revisions.add_argument("b", help="the revision after")
    revisions.add_argument("--repo", type=Path, default=Path("."),
                           help="the git repository (default: here)")
    revisions.add_argument("--keep", type=Path, default=None, metavar="DIR",
                           help="keep both trajectories in DIR (a.json.gz, b.json.gz)")
    revisions.add_argument("command", nargs="*", default=[],
                           help="-- record TARGET [flags] or -- trace record [flags] -- SCRIPT …")
    revisions.set_defaults(run=run_revisions)


def _add_part_flags(parser) -> None:
    parts = parser.add_argument_group("the parts, as attribute paths of the attached instance")
    parts.add_argument("--attach", required=True, metavar="CLASS",
                       help="the class holding your MoCo (module:Qualname or module.Qualname; "
                            "__main__:Name for one defined in the script)")
    parts.add_argument("--query", required=True, metavar="PATH[,PATH]",
                       help="the query encoder (backbone,projector: input of the first, "
                            "output of the last)")
    parts.add_argument("--key", required=True, metavar="PATH[,PATH]",
                       help="the key encoder, or the EMA wrapper holding it")
    parts.add_argument("--queue", metavar="PATH", help="the dictionary tensor")
    parts.add_argument("--pointer", metavar="PATH", help="the ring's write position")
    parts.add_argument("--layout", choices=LAYOUTS, default="dim-first")
    parts.add_argument("--views", metavar="METHOD",
                       help="the method that receives the views in image order (forward, "
                            "training_step): needed when the key batch is shuffled")
    parts.add_argument("--temperature", type=float, default=None, metavar="T")
    parts.add_argument("--momentum", type=float, default=None, metavar="M")
    run = parser.add_argument_group("the run")
    run.add_argument("--steps", type=int, default=10, help="training steps to record (10)")
    run.add_argument("--seed", type=int, default=0, help="seeds fixed before the script (0)")


def _command(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def run_trace(args: argparse.Namespace) -> int:
    from moco_ref.cli.options import usage_error
    from moco_ref.trace.script import AttachError, PartPaths, record_script

    command = _command(args.command)
    if not command or command == ["-m"]:
        return usage_error("trace: name the script after --: -- train.py ARGS or -- -m MODULE")
    if command[0] != "-m" and not Path(command[0]).is_file():
        return usage_error(f"trace: no script {command[0]!r}")
    if args.steps < 1:
        return usage_error(f"--steps must be ≥ 1, not {args.steps}")
    try:
        paths = PartPaths(query=args.query.split(","), key=args.key.split(","),
                          queue=args.queue, pointer=args.pointer, layout=args.layout,
                          views=args.views, temperature=args.temperature,
                          momentum=args.momentum)
        run = record_script(command, args.attach, paths, steps=args.steps, seed=args.seed)
    except (AttachError, ValueError, TypeError) as exc:
        return usage_error(f"trace: {exc}")
    if isinstance(run.error, (AttachError, TypeError)) and run.recording is None:
        return usage_error(f"trace: {run.error}")
    source = " ".join(command)
    if args.action == "record":
        from moco_ref.tools import refactor_guard
        from moco_ref.trace.trajectory import trajectory_of

        trajectory = trajectory_of(run.recording, source, error=run.error, notes=run.notes)
        refactor_guard.save(trajectory, args.out)
        steps = len(trajectory.get("steps") or [])
        crash = trajectory.get("crash")
        told = f"; the run raised: {refactor_guard.crash_text(crash)}" if crash else ""
        print(f"recorded {source} ({steps} steps){told} to {args.out}")
        for note in run.notes:
            print(f"note: {note}")
        return 0
    if run.recording is None:
        print(f"moco-ref trace: {source} never called an instance of {args.attach}"
              + (f" (it raised {type(run.error).__name__}: {run.error})" if run.error else ""),
              file=sys.stderr)
        return 1
    report = run.recording.judge(ragged=args.ragged)
    print(report.text())
    if run.error is not None:
        print(f"the script raised after {len(run.recording.steps)} step(s): "
              f"{type(run.error).__name__}: {run.error}")
    return 0 if not report.failed and not report.not_judged and run.error is None else 1


def run_revisions(args: argparse.Namespace) -> int:
    """``record``/``trace record`` at each revision, in a worktree, then ``compare``."""
    from moco_ref.cli.options import usage_error
    from moco_ref.cli.refactor import VERDICT_EXIT
    from moco_ref.tools import refactor_guard

    command = _command(args.command)
    if not command or command[0] not in ("record", "trace"):
        return usage_error("revisions: give the recording command after --: record TARGET … "
                           "or trace record … -- SCRIPT …")
    repo = args.repo.resolve()
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top is None:
        return usage_error(f"revisions: {args.repo} is not in a git repository")
    shas = [_git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}") for rev in (args.a, args.b)]
    for rev, sha in zip((args.a, args.b), shas):
        if sha is None:
            return usage_error(f"revisions: no revision {rev!r} in {top}")
    inside = os.path.relpath(os.getcwd(), top) if _inside(os.getcwd(), top) else "."
    with tempfile.TemporaryDirectory(prefix="moco-ref-revisions-") as scratch:
        outputs = []
        for label, rev, sha in (("a", args.a, shas[0]), ("b", args.b, shas[1])):
            tree = Path(scratch) / label
            if _git(Path(top), "worktree", "add", "--detach", "--quiet", str(tree), sha) is None:
                return usage_error(f"revisions: git worktree add failed for {rev}")
            out = (args.keep.resolve() / f"{label}.json.gz") if args.keep else \
                Path(scratch) / f"{label}.json.gz"
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                done = _record_at(command, tree / inside, out)
            finally:
                _git(Path(top), "worktree", "remove", "--force", str(tree))
            print(f"{label}: {rev} ({sha[:10]}): {done.strip().splitlines()[-1] if done else ''}")
            if not out.exists():
                print(f"moco-ref revisions: nothing was recorded at {rev}", file=sys.stderr)
                return 1
            outputs.append(out)
        a, b = (refactor_guard.load(path) for path in outputs)
    verdict = refactor_guard.classify(a, b)
    print(verdict)
    return VERDICT_EXIT[verdict.kind]


def _record_at(command: list[str], where: Path, out: Path) -> str:
    """The recording command run in ``where`` (the worktree), its output path given."""
    if command[0] == "trace":
        rest = command[2:] if command[1:2] == ["record"] else command[1:]
        argv = ["trace", "record", "--out", str(out), *rest]
    else:
        argv = [command[0], *command[1:], "--out", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "moco_ref.cli", *argv], cwd=where, env=env,
                          capture_output=True, text=True)
    sys.stderr.write(done.stderr[-4000:])
    return done.stdout


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")
