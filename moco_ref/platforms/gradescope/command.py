"""``moco-ref gradescope build|test|run``: a Gradescope autograder made of moco-ref
(``packager``; ``local_run`` tries it).

- ``build [--out autograder.zip] [--rubric FILE] [--style S] [--timeout S] [--wheel FILE]``
  writes the zip to upload to Gradescope;
- ``test ZIP SUBMISSION [--keep DIR]`` runs it on one submission as Gradescope would (without
  ``setup.sh``) and validates its ``results.json``: exit 0 valid, 1 invalid, 2 bad input;
- ``run [--root DIR] [--metadata FILE]`` is what the zip's ``run_autograder`` calls on
  Gradescope; what only the staff should read (why nothing was graded, a rubric total that is
  not the assignment's ``total_points``) goes to its stderr, never into ``results.json``.
"""

from __future__ import annotations

import argparse
import sys

from moco_ref.platforms.commands import graded_or_failed, tried_outcome
from moco_ref.probe.options import STYLES
from moco_ref.run.command_line import EXIT_BELOW as EXIT_INVALID
from moco_ref.run.command_line import EXIT_OK, usage_error


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "gradescope", help="build, try and run a Gradescope autograder made of moco-ref")
    actions = parser.add_subparsers(dest="gradescope_command", required=True)

    build = actions.add_parser("build", help="write the autograder zip to upload to Gradescope")
    build.add_argument("--out", default="autograder.zip", metavar="ZIP",
                       help="the zip to write (default %(default)s)")
    build.add_argument("--rubric", metavar="FILE",
                       help="the course's rubric (TOML); default: moco-ref's default rubric")
    build.add_argument("--style", choices=STYLES, help="grade every submission as this style")
    build.add_argument("--timeout", type=float, metavar="S",
                       help="wall-clock seconds per submission (default 60)")
    build.add_argument("--wheel", metavar="FILE",
                       help="a moco_ref wheel of this version to bundle (default: built from "
                            "this source checkout)")
    build.set_defaults(run=run_build)

    test = actions.add_parser(
        "test", help="run an autograder zip on one submission locally and validate its results")
    test.add_argument("zip", metavar="ZIP")
    test.add_argument("submission", metavar="SUBMISSION", help="a file or a folder")
    test.add_argument("--keep", metavar="DIR",
                      help="unpack into DIR (new or empty) and keep it, results.json included")
    test.add_argument("--timeout", type=float, default=900.0, metavar="S",
                      help="seconds run_autograder may take (default %(default)s)")
    test.set_defaults(run=run_test)

    run = actions.add_parser("run", help="grade /autograder/submission (what run_autograder "
                                         "calls on Gradescope)")
    run.add_argument("--root", metavar="DIR",
                     help="the autograder's root (default $MOCO_REF_AUTOGRADER_ROOT or "
                          "/autograder)")
    run.add_argument("--metadata", metavar="FILE",
                     help="Gradescope's submission metadata (default "
                          "$MOCO_REF_SUBMISSION_METADATA or ROOT/submission_metadata.json)")
    run.set_defaults(run=run_run)


GRADESCOPE_DEFAULT_MB = 768  # the memory of Gradescope's default autograder container


def run_build(args: argparse.Namespace) -> int:
    from moco_ref.platforms.course import PlatformError
    from moco_ref.platforms.gradescope.packager import build_autograder

    try:
        built = build_autograder(args.out, rubric_path=args.rubric, style=args.style,
                                 timeout=args.timeout, wheel=args.wheel)
    except PlatformError as exc:
        return usage_error(str(exc))
    from moco_ref.tools.run_needs import RUN_NEEDS

    print(f"wrote {built.path} ({', '.join(built.members)})")
    fits = RUN_NEEDS.container_mb <= GRADESCOPE_DEFAULT_MB
    print(f"one grading run needs {RUN_NEEDS.text()} (Gradescope's default container has "
          f"{GRADESCOPE_DEFAULT_MB} MB: " + ("enough" if fits else
                                            "pick a larger one in the assignment's "
                                            "autograder settings") + ")")
    print(f"try it: moco-ref gradescope test {built.path} SUBMISSION")
    return EXIT_OK


def run_test(args: argparse.Namespace) -> int:
    from moco_ref.platforms.course import PlatformError
    from moco_ref.platforms.gradescope.local_run import try_autograder

    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return usage_error("validating results.json needs jsonschema: pip install jsonschema")
    if not args.timeout > 0:
        return usage_error("--timeout must be > 0")
    try:
        tried = try_autograder(args.zip, args.submission, keep=args.keep, timeout=args.timeout)
    except PlatformError as exc:
        return usage_error(str(exc))
    data = tried.data or {}
    tests = data.get("tests") or []
    failed = sum(1 for test in tests if isinstance(test, dict) and test.get("status") != "passed")
    hidden = {}
    for test in tests:
        if isinstance(test, dict) and test.get("visibility", "visible") != "visible":
            hidden[test["visibility"]] = hidden.get(test["visibility"], 0) + 1
    if tried.data is not None:
        shown = ", ".join(f"{count} {name}" for name, count in sorted(hidden.items()))
        print(f"score {data.get('score')}, {len(tests)} tests ({failed} failed"
              + (f"; {shown}" if shown else "") + ")")
    return tried_outcome(tried, "run_autograder", keep=bool(args.keep))


def run_run(args: argparse.Namespace) -> int:
    from moco_ref.platforms.gradescope.packager import (
        grade_in_autograder,
        write_failure_results,
    )

    ran = graded_or_failed(lambda: grade_in_autograder(args.root, metadata=args.metadata),
                           write_failure_results, args.root, "autograder's")
    if isinstance(ran, int):
        return ran
    report = ran.report
    if ran.problem:
        print(f"moco-ref: error: {ran.problem}", file=sys.stderr)
    for note in ran.staff_notes:
        print(f"moco-ref: {note}", file=sys.stderr)
    tests = ran.data["tests"]
    failed = sum(1 for test in tests if test["status"] != "passed")
    verdict = (f"score {ran.data['score']:g}/{report.max_score:g}" if report.gradable
               else "not gradable")
    print(f"moco-ref: {verdict}, {len(tests)} tests ({failed} failed)")
    return EXIT_INVALID if ran.problem else EXIT_OK
