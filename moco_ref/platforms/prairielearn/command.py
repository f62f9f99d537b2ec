"""``moco-ref prairielearn build|test|run``: a PrairieLearn external grader made of moco-ref
(``packager``: the package and its run; ``local_run``: trying it).

- ``build OUTDIR [--rubric FILE] [--style S] [--timeout S] [--wheel FILE] [--image NAME]
  [--file-name NAME]`` writes the grader image's Dockerfile (and wheel), the question
  (``info.json`` with its external-grading options, ``question.html``) and its ``tests/``
  (entrypoint, rubric, options);
- ``test OUTDIR SUBMISSION... [--keep DIR] [--timeout S] [--isolation I]
  [--default-container]`` lays out ``/grade`` in a temporary folder, runs the entrypoint
  (as Docker's default profile would, with ``--default-container``) and validates
  ``results.json`` against PrairieLearn's format: exit 0 valid, 1 invalid, 2 bad input;
- ``run [--root DIR] [--isolation I]`` is what the entrypoint calls in the container.
"""

from __future__ import annotations

import argparse
import sys

from moco_ref.platforms.commands import graded_or_failed, tried_outcome
from moco_ref.probe.options import STYLES
from moco_ref.run.command_line import EXIT_BELOW as EXIT_INVALID
from moco_ref.run.command_line import EXIT_OK, add_isolation_flag, usage_error


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "prairielearn", help="build, try and run a PrairieLearn external grader made of moco-ref")
    actions = parser.add_subparsers(dest="prairielearn_command", required=True)

    build = actions.add_parser("build", help="write the grader image, the question and its "
                                             "tests/ for a PrairieLearn course")
    build.add_argument("outdir", metavar="OUTDIR", help="the folder to write (new or a "
                                                        "previous build)")
    build.add_argument("--rubric", metavar="FILE",
                       help="the course's rubric (TOML); default: moco-ref's default rubric")
    build.add_argument("--style", choices=STYLES, help="grade every submission as this style")
    build.add_argument("--timeout", type=float, metavar="S",
                       help="wall-clock seconds per submission (default 60); the job's "
                            "timeout in info.json adds one run and a margin")
    build.add_argument("--wheel", metavar="FILE",
                       help="a moco_ref wheel of this version to bundle (default: built from "
                            "this source checkout)")
    build.add_argument("--image", metavar="NAME", default=None,
                       help="the grader image's name on Docker Hub, as info.json names it "
                            "(default moco-ref-grader:VERSION)")
    build.add_argument("--file-name", metavar="NAME", default=None,
                       help="the file students upload (default moco.py)")
    build.set_defaults(run=run_build)

    test = actions.add_parser(
        "test", help="run the package's entrypoint on one submission locally and validate "
                     "its results.json")
    test.add_argument("outdir", metavar="OUTDIR", help="what `prairielearn build` wrote")
    test.add_argument("submissions", metavar="SUBMISSION", nargs="+",
                      help="the submission's files or folders (copied into /grade/student)")
    test.add_argument("--keep", metavar="DIR",
                      help="lay out /grade in DIR (new or empty) and keep it")
    test.add_argument("--timeout", type=float, metavar="S",
                      help="seconds the entrypoint may take (default: the job timeout of "
                           "info.json)")
    add_isolation_flag(test)
    test.add_argument("--default-container", action="store_true",
                      help="run the entrypoint as Docker's default profile runs a container "
                           "(root without CAP_SYS_ADMIN, namespaces refused; needs root)")
    test.set_defaults(run=run_test)

    run = actions.add_parser("run", help="grade /grade/student into /grade/results/"
                                         "results.json (what the entrypoint calls)")
    run.add_argument("--root", metavar="DIR",
                     help="the grading job's root (default $MOCO_REF_GRADE_ROOT or /grade)")
    add_isolation_flag(run)
    run.set_defaults(run=run_run)


def run_build(args: argparse.Namespace) -> int:
    from moco_ref.platforms.course import PlatformError
    from moco_ref.platforms.prairielearn.packager import (
        DEFAULT_FILE_NAME,
        DEFAULT_IMAGE,
        build_prairielearn,
    )
    from moco_ref.tools.run_needs import RUN_NEEDS

    try:
        built = build_prairielearn(args.outdir, rubric_path=args.rubric, style=args.style,
                                   timeout=args.timeout, wheel=args.wheel,
                                   image=args.image or DEFAULT_IMAGE,
                                   file_name=args.file_name or DEFAULT_FILE_NAME)
    except PlatformError as exc:
        return usage_error(str(exc))
    grading = built.info["externalGradingOptions"]
    print(f"wrote {built.outdir}: {', '.join(built.files)}")
    print(f"info.json: image {grading['image']}, entrypoint {grading['entrypoint']}, "
          f"timeout {grading['timeout']} s")
    print(f"one grading run needs {RUN_NEEDS.text()}")
    print(f"try it: moco-ref prairielearn test {built.outdir} SUBMISSION")
    return EXIT_OK


def run_test(args: argparse.Namespace) -> int:
    from moco_ref.platforms.course import PlatformError
    from moco_ref.platforms.prairielearn.local_run import try_prairielearn

    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return usage_error("validating results.json needs jsonschema: pip install jsonschema")
    if args.timeout is not None and not args.timeout > 0:
        return usage_error("--timeout must be > 0")
    try:
        tried = try_prairielearn(args.outdir, args.submissions, keep=args.keep,
                                 timeout=args.timeout, isolation=args.isolation,
                                 default_container=args.default_container)
    except PlatformError as exc:
        return usage_error(str(exc))
    data = tried.data if isinstance(tried.data, dict) else {}
    tests = [t for t in data.get("tests") or [] if isinstance(t, dict)]
    if tried.data is not None:
        short = sum(1 for t in tests if t.get("points") != t.get("max_points"))
        images = sum(len(t.get("images") or []) for t in tests)
        print(f"gradable {data.get('gradable')}, score {data.get('score')}, {len(tests)} "
              f"tests ({short} short of full points" + (f", {images} images" if images else "")
              + ")")
        if data.get("format_errors"):
            print(f"format_errors: {data['format_errors']}")
    return tried_outcome(tried, "the entrypoint", keep=bool(args.keep))


def run_run(args: argparse.Namespace) -> int:
    from moco_ref.platforms.prairielearn.packager import (
        grade_in_prairielearn,
        write_failure_results,
    )

    ran = graded_or_failed(lambda: grade_in_prairielearn(args.root, isolation=args.isolation),
                           write_failure_results, args.root, "grader's")
    if isinstance(ran, int):
        return ran
    if ran.problem:
        print(f"moco-ref: error: {ran.problem}", file=sys.stderr)
    data, report = ran.data, ran.report
    verdict = (f"score {data['score']:g} ({report.score:g}/{report.max_score:g} points)"
               if data["gradable"] else "not gradable")
    print(f"moco-ref: {verdict}, {len(data['tests'])} tests")
    return EXIT_INVALID if ran.problem else EXIT_OK
