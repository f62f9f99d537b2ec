"""pytest plugin (entry point ``pytest11: moco_ref``): run the grader's checks as tests.

    pytest --moco-impl=path/to/moco.py            # or a notebook, or pkg.module
    pytest --moco-impl=pkg.moco -k I3             # test ids are check ids

The implementation is observed once per session, in a child process, by the same runner as
``moco-ref grade``; each check becomes one test item reporting that check's verdict: failed,
error or timeout → a failure with the check's message; not applicable → skipped with the
reason. A check that did not run is never reported as passed. Without ``--moco-impl`` the
plugin does nothing (and imports nothing heavy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

COLLECTOR_NAME = "moco-ref"
_REPORT_KEY = pytest.StashKey[object]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("moco-ref", "MoCo conformance checks (moco-ref)")
    group.addoption(
        "--moco-impl",
        metavar="PATH_OR_MODULE",
        default=None,
        help="grade this MoCo implementation (.py, .ipynb or pkg.module): one test per check",
    )
    from moco_ref.cli.options import add_plugin_options

    add_plugin_options(group)


def _options(config):
    from moco_ref.cli.options import options_from

    try:
        return options_from(config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _target(config) -> str:
    raw = config.getoption("moco_impl")
    relative = Path(config.invocation_params.dir) / raw
    return str(relative) if relative.exists() else raw


def pytest_configure(config) -> None:
    """A ``--moco-impl`` that names nothing is a usage error before anything is collected."""
    if not config.getoption("moco_impl"):
        return
    from moco_ref.run.targets import TargetError, expand_targets

    try:
        expand_targets([_target(config)])
    except TargetError as exc:
        raise pytest.UsageError(f"--moco-impl: {exc}") from None


def pytest_report_header(config):
    if config.getoption("moco_impl"):
        return f"moco-ref: checking the MoCo implementation {config.getoption('moco_impl')}"
    return None


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they apply to our items
def pytest_collection_modifyitems(session, config, items) -> None:
    if not config.getoption("moco_impl"):
        return
    target = _target(config)
    path = Path(target).resolve() if Path(target).exists() else session.path
    name = f"{COLLECTOR_NAME}[{Path(target).name}]"  # test ids unique per submission
    collector = MocoImplementation.from_parent(session, name=name, nodeid=name, path=path)
    collected = list(collector.collect())
    # Reported like any collection, so the terminal's counts include the checks.
    session.ihook.pytest_collectreport(
        report=pytest.CollectReport(collector.nodeid, "passed", None, collected)
    )
    items.extend(collected)


def pytest_terminal_summary(terminalreporter, config) -> None:
    report = config.stash.get(_REPORT_KEY, None)
    if report is None:
        return
    from moco_ref.report.formats import header_lines

    terminalreporter.section("moco-ref")
    for line in header_lines(report):
        terminalreporter.write_line(line)


class MocoImplementation(pytest.Collector):
    """Observes and judges the implementation once; yields one item per check."""

    def collect(self):
        options = _options(self.config)
        if self.config.option.collectonly:  # list the checks, grade nothing
            yield from self._listed(options)
            return
        report = _graded_once(self.config, _target(self.config), options)
        self.config.stash[_REPORT_KEY] = report
        results = list(report.results)
        if not report.gradable:
            results = _not_gradable_results(report, options)
        else:
            results += _unjudged_results(report, options)
        for result in results:
            yield CheckItem.from_parent(
                self, name=result.check_id, result=result, report=report, options=options
            )


    def _listed(self, options):
        from moco_ref.judge.results import CheckResult, Status, SubmissionReport

        style = options.style or _style_from_source(_target(self.config))
        report = SubmissionReport(_target(self.config), style, gradable=True)
        for spec in _specs(None):  # the same items a graded run yields
            if options.selects(spec.check_id):
                status = Status.NOT_JUDGED if style in spec.styles else Status.NOT_APPLICABLE
                result = CheckResult(spec.check_id, spec.title, spec.family, 0.0, status,
                                     "not graded: --collect-only")
                yield CheckItem.from_parent(self, name=spec.check_id, result=result,
                                            report=report, options=options)


def _style_from_source(target: str) -> str:
    """The style a file's top-level names point to, read without running it."""
    from moco_ref.probe.source import style_from_source

    return (style_from_source(Path(target)) if Path(target).is_file() else None) or "lab"


def _graded_once(config, target: str, options):
    """The implementation's report. Under pytest-xdist every worker collects the same items:
    the first to get here grades, the others read its report (a lock file per test run)."""
    from moco_ref.run.pipeline import grade_submission

    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return grade_submission(target, options)
    import fcntl
    import hashlib
    import json
    import tempfile

    from moco_ref.judge.results import SubmissionReport

    key = hashlib.sha256(f"{workerinput.get('testrunuid')}|{target}|{options.to_dict()}"
                         .encode()).hexdigest()[:24]
    shared = Path(tempfile.gettempdir()) / f"moco-ref-pytest-{key}.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            return SubmissionReport.from_dict(json.loads(shared.read_text(encoding="utf-8")))
        report = grade_submission(target, options)
        shared.write_text(json.dumps(report.to_dict(), default=str), encoding="utf-8")
        return report


class CheckItem(pytest.Item):
    def __init__(self, *, result, report, options, **kwargs) -> None:
        super().__init__(**kwargs)
        self.result = result
        self.report = report
        self.options = options
        self.extra_keyword_matches.add(result.family)
        marker = result.family.replace("-", "_")  # families are markers: -m I4
        if not any(line.split(":", 1)[0] == marker for line in self.config.getini("markers")):
            self.config.addinivalue_line("markers", f"{marker}: moco-ref checks of {marker}")
        self.add_marker(getattr(pytest.mark, marker))
        self.user_properties += [("submission", Path(report.submission).name),
                                 ("points", f"{result.points:g}"),
                                 ("max_points", f"{result.max_points:g}"),
                                 ("status", result.status.value)]
        from moco_ref.judge.results import Status

        if result.status is Status.NOT_APPLICABLE:  # skipped at the check, not in this file
            reason = result.message or f"not applicable to style {report.style}"
            self.add_marker(pytest.mark.skip(reason=f"{result.check_id}: {reason}"))

    def runtest(self) -> None:
        from moco_ref.judge.results import Status

        status = self.result.status
        if status is Status.PASSED:
            return
        if status is Status.NOT_APPLICABLE:
            pytest.skip(self.result.message or f"not applicable to style {self.report.style}")
        raise CheckNotPassed(self.result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckNotPassed):
            from moco_ref.report.scoring import rerun_command

            result = self.result
            return (
                f"{result.check_id} [{result.family}] {result.status.value}: {result.title}\n"
                f"{result.message}\n"
                f"rerun: {rerun_command(self.report.submission, result.check_id, self.options)}"
            )
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"moco-ref check {self.result.check_id}: {self.result.title}"


class CheckNotPassed(Exception):
    def __init__(self, result) -> None:
        super().__init__(result.message)
        self.result = result


def _specs(style):
    try:
        from moco_ref.judge.registry import all_checks

        return list(all_checks(style))
    except Exception:  # noqa: BLE001 - without a registry there is nothing to list
        return []


def _not_gradable_results(report, options):
    """Every check the implementation would have faced fails with the traceback."""
    from moco_ref.judge.results import CheckResult, Status

    style = report.style if report.style != "unknown" else None
    message = f"the implementation is not gradable:\n{report.traceback}"
    specs = [spec for spec in _specs(style) if options.selects(spec.check_id)]
    if not specs:
        return [CheckResult("not-gradable", "the implementation loads and runs", "contract",
                            0.0, Status.ERROR, message)]
    return [
        CheckResult(spec.check_id, spec.title, spec.family, spec.points, Status.ERROR, message)
        for spec in specs
    ]


def _unjudged_results(report, options):
    """Checks of the style that the judge returned no verdict for fail rather than vanish."""
    from moco_ref.judge.results import CheckResult, Status

    judged = {result.check_id for result in report.results}
    return [
        CheckResult(spec.check_id, spec.title, spec.family, spec.points, Status.ERROR,
                    "the judge returned no verdict for this check")
        for spec in _specs(report.style)
        if spec.check_id not in judged and options.selects(spec.check_id)
    ]
