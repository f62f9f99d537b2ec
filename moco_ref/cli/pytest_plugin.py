"""pytest plugin (entry point ``pytest11: moco_ref``): run the grader's checks as tests.

    pytest --moco-impl=path/to/moco.py            # or a notebook, or pkg.module
    pytest --moco-impl=pkg.moco -k I3             # test ids are check ids
    pytest --moco-impl=moco.py moco.py::I3-fifo-keeps-newest   # a node id as printed

Each check is one test item, its node id the implementation's file (relative to the rootdir)
and the check id, so a printed id runs again as it is. The implementation is observed once
per session — when the first chosen item runs, on the checks ``-k`` / ``-m`` chose only — in
a child process, by the same runner as ``moco-ref grade``; each item reports its check's
verdict: failed, error or timeout → a failure with the check's message; not applicable →
skipped with the reason. A check that did not run is never reported as passed; a traceback
of an implementation that is not gradable is told once. The grading is in the first item's
setup, so JUnit's times are the time spent. Without ``--moco-impl`` the plugin does nothing
(and imports nothing heavy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

COLLECTOR_NAME = "moco-ref"
_REPORT_KEY = pytest.StashKey[object]()
_FILE_KEY = pytest.StashKey[object]()  # the implementation's file, resolved once
_TOLD_KEY = pytest.StashKey[str]()  # the check that told the not-gradable traceback


def pytest_addoption(parser) -> None:
    group = parser.getgroup("moco-ref", "MoCo conformance checks (moco-ref)")
    group.addoption(
        "--moco-impl",
        metavar="PATH_OR_MODULE",
        default=None,
        help="grade this MoCo implementation (.py, .ipynb or pkg.module): one test per check",
    )
    from moco_ref.cli.isolation import PLUGIN_ISOLATION_HELP
    from moco_ref.cli.options import add_plugin_options

    add_plugin_options(group)
    group.addoption("--moco-isolation", default=None, choices=_isolation_modes(),
                    help=PLUGIN_ISOLATION_HELP)
    group.addoption("--moco-rubric", metavar="FILE", default=None,
                    help="the course's points per family or check (TOML), as grade --rubric")
    group.addoption("--moco-write", action="append", default=[], metavar="NAME=FILE",
                    help="also write the implementation's report with this writer of grade "
                         "--write (json, junit, text, feedback-html, feedback-md, gradescope, "
                         "prairielearn, …) to FILE; repeatable")


def _isolation_modes() -> tuple[str, ...]:
    from moco_ref.sandbox.client import ISOLATION_MODES

    return tuple(ISOLATION_MODES)


def _options(config):
    from moco_ref.cli.options import options_from
    from moco_ref.judge.rubric import RubricError, load_rubric

    rubric = ()
    path = config.getoption("moco_rubric")
    try:
        if path:
            rubric = load_rubric(Path(config.invocation_params.dir) / path).to_pairs()
        return options_from(config, rubric=rubric)
    except (ValueError, RubricError, OSError) as exc:
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
    _write_requests(config)


def pytest_report_header(config):
    if config.getoption("moco_impl"):
        return f"moco-ref: checking the MoCo implementation {config.getoption('moco_impl')}"
    return None


def _implementation_file(config) -> Path | None:
    """The implementation's file (a module target's too), resolved; None for a module whose
    file cannot be found."""
    if _FILE_KEY in config.stash:
        return config.stash[_FILE_KEY]
    target = _target(config)
    if Path(target).exists():
        found = Path(target).resolve()
    else:
        from moco_ref.probe.source import is_module_target, module_file

        module = module_file(target) if is_module_target(target) else None
        found = Path(module).resolve() if module else None
    config.stash[_FILE_KEY] = found
    return found


def _is_implementation(config, path) -> bool:
    if not config.getoption("moco_impl"):
        return False
    found = _implementation_file(config)
    return found is not None and Path(path).resolve() == found


def pytest_pycollect_makemodule(module_path, parent):
    """The implementation named on the command line (``pytest --moco-impl=x.py x.py::I3-…``,
    a node id as printed) is its checks, never imported as a test module."""
    if _is_implementation(parent.config, module_path):
        return MocoImplementation.from_parent(parent, path=module_path)
    return None


def pytest_collect_file(file_path, parent):
    """The same for a notebook named on the command line (``.py`` files: above)."""
    if file_path.suffix != ".py" and _is_implementation(parent.config, file_path):
        return MocoImplementation.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they apply to our items
def pytest_collection_modifyitems(session, config, items) -> None:
    """The checks are items whatever the arguments; their node ids are the implementation's
    file (relative to the rootdir) and the check id, so they can be run again as printed."""
    if not config.getoption("moco_impl") or any(isinstance(i, CheckItem) for i in items):
        return
    found = _implementation_file(config)
    if found is not None:
        from _pytest.pathlib import bestrelpath

        # outside the rootdir: the path as typed from the rootdir (``../x/moco.py``)
        relative = None if found.is_relative_to(config.rootpath) else bestrelpath(
            config.rootpath, found)
        collector = MocoImplementation.from_parent(session, path=found, nodeid=relative)
    else:  # a module whose file is unknown: named by the module
        name = f"{COLLECTOR_NAME}[{_target(config)}]"
        collector = MocoImplementation.from_parent(session, name=name, nodeid=name,
                                                   path=session.path)
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
    for name, path in _written(config, report):
        terminalreporter.write_line(f"{name} written to {path}")


def _write_requests(config) -> list[tuple[object, Path]]:
    """``--moco-write NAME=FILE`` as (writer, path); ``pytest.UsageError`` for a bad one."""
    from moco_ref.platforms import writers

    table, requests = writers(), []
    for item in config.getoption("moco_write") or ():
        name, _, path = item.partition("=")
        if name not in table or not path:
            raise pytest.UsageError(f"--moco-write {item}: give NAME=FILE, NAME one of "
                                    f"{', '.join(table)}")
        requests.append((table[name], Path(config.invocation_params.dir) / path))
    return requests


def _written(config, report) -> list[tuple[str, Path]]:
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric
    from moco_ref.report.writers import Writing

    rubric_path = config.getoption("moco_rubric")
    rubric = (load_rubric(Path(config.invocation_params.dir) / rubric_path) if rubric_path
              else DEFAULT_RUBRIC)
    writing = Writing(_options(config), rubric)
    written = []
    for writer, path in _write_requests(config):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(writer.render(report, writing), encoding="utf-8")
        written.append((writer.name, path))
    return written


class MocoImplementation(pytest.File):
    """The implementation's checks, one item each, as the registry lists them; grading waits
    for the first item that runs, when ``-k`` / ``-m`` have chosen the items (only the
    chosen checks are graded; ``--collect-only`` grades nothing)."""

    def collect(self):
        options = _options(self.config)
        for spec in _specs(None):
            if options.selects(spec.check_id):
                yield CheckItem.from_parent(self, name=spec.check_id, spec=spec,
                                            options=options)


def _session_report(session):
    """The implementation's report, graded once, on the checks of the items chosen to run."""
    report = session.config.stash.get(_REPORT_KEY, None)
    if report is None:
        from dataclasses import replace

        chosen = tuple(item.name for item in session.items if isinstance(item, CheckItem))
        options = replace(_options(session.config), checks=chosen)
        report = _graded_once(session.config, _target(session.config), options,
                              session.config.getoption("moco_isolation"))
        session.config.stash[_REPORT_KEY] = report
    return report


def _graded_once(config, target: str, options, isolation: str | None = None):
    """The implementation's report. Under pytest-xdist every worker collects the same items:
    the first to get here grades, the others read its report (a lock file per test run)."""
    from moco_ref.run.pipeline import grade_submission

    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return grade_submission(target, options, isolation=isolation)
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
        report = grade_submission(target, options,
                                  isolation=isolation)
        shared.write_text(json.dumps(report.to_dict(), default=str), encoding="utf-8")
        return report


class CheckItem(pytest.Item):
    """One check. Its verdict is read in ``setup`` (the first item's setup grades: JUnit
    times are the time really spent, the grading in the first check's)."""

    def __init__(self, *, spec, options, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.options = options
        self.result = None
        self.report = None
        self.extra_keyword_matches.add(spec.family)
        marker = spec.family.replace("-", "_")  # families are markers: -m I4
        if not any(line.split(":", 1)[0] == marker for line in self.config.getini("markers")):
            self.config.addinivalue_line("markers", f"{marker}: moco-ref checks of {marker}")
        self.add_marker(getattr(pytest.mark, marker))

    def setup(self) -> None:
        from moco_ref.judge.results import Status

        self.report = _session_report(self.session)
        self.result = _result_for(self.spec, self.report, self.session)
        result = self.result
        self.user_properties += [("submission", Path(self.report.submission).name),
                                 ("points", f"{result.points:g}"),
                                 ("max_points", f"{result.max_points:g}"),
                                 ("status", result.status.value)]
        if result.status is Status.NOT_APPLICABLE:
            reason = (f"{result.check_id}: "
                      f"{result.message or f'not applicable to style {self.report.style}'}")
            try:  # reported at the check (the implementation's file), not at this line
                skipped = pytest.skip.Exception(reason, _use_item_location=True)
            except TypeError:  # a pytest without it
                skipped = pytest.skip.Exception(reason)
            raise skipped

    def runtest(self) -> None:
        from moco_ref.judge.results import Status

        if self.result.status is not Status.PASSED:
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
        return self.path, 0, f"moco-ref check {self.spec.check_id}: {self.spec.title}"


def _result_for(spec, report, session):
    """The check's verdict in ``report``: not applicable to its style; not gradable (the
    traceback told once, under the first check that runs); or no verdict, an error."""
    from moco_ref.judge.results import CheckResult, Status

    for result in report.results:
        if result.check_id == spec.check_id:
            return result
    if report.gradable and report.style not in spec.styles:
        return CheckResult(spec.check_id, spec.title, spec.family, 0.0, Status.NOT_APPLICABLE,
                           f"does not apply to style {report.style}")
    if report.gradable:
        return CheckResult(spec.check_id, spec.title, spec.family, spec.points, Status.ERROR,
                           "the judge returned no verdict for this check")
    told = session.config.stash.get(_TOLD_KEY, None)
    if told is None:
        session.config.stash[_TOLD_KEY] = spec.check_id
        message = f"the implementation is not gradable:\n{report.traceback}"
    else:
        from moco_ref.report.text import one_line_reason

        message = (f"not run: the implementation is not gradable "
                   f"({one_line_reason(report.traceback) or 'it did not load'}; told in full "
                   f"under {told})")
    return CheckResult(spec.check_id, spec.title, spec.family, spec.points, Status.ERROR,
                       message)


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
