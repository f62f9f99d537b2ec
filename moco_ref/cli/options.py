"""The grading options as flags, generated from the one table (``moco_ref.probe.options
.OPTIONS``): argparse groups for ``grade`` and ``demo``, the ``sensitivity`` command's subset
and the pytest plugin's ``--moco-*`` options. The exit codes and the usage error line are
``moco_ref.run.command_line``'s, named here too for the commands."""

from __future__ import annotations

from moco_ref.probe.options import OPTIONS, GradeOptions, OptionSpec, grade_options, options_problem
from moco_ref.run.command_line import EXIT_BELOW, EXIT_OK, EXIT_USAGE, usage_error  # noqa: F401

PLUGIN_PREFIX = "moco_"  # pytest's option namespace is shared: its dests are prefixed


def _argument_kwargs(spec: OptionSpec, *, default_none: bool = False, prefix: str = "") -> dict:
    kwargs: dict = {"dest": prefix + spec.field}
    help_text = spec.help
    if spec.kind is None:
        kwargs.update(action="store_true")
    else:
        kwargs.update(type=spec.kind, default=None if default_none else spec.default)
        if spec.choices:
            kwargs["choices"] = spec.choices
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
    if default_none:  # the plugin: its default is GradeOptions', said in the help
        help_text = help_text.replace("%(default)s", str(spec.default))
    kwargs["help"] = help_text
    return kwargs


def add_option_flags(parser, groups: tuple[str, ...] = ("judging", "running"),
                     only=None) -> dict:
    """The table's flags of ``groups`` on ``parser``, in an argument group per name (returned,
    so a command can add its own flags beside them); ``only``: just these fields."""
    sections = {name: parser.add_argument_group(name) for name in groups}
    for spec in OPTIONS:
        if spec.group in groups and (only is None or spec.field in only):
            sections[spec.group].add_argument(spec.flag, **_argument_kwargs(spec))
    return sections


def add_plugin_options(group) -> None:
    """The table's plugin options as ``--moco-<flag>`` on a pytest option group."""
    for spec in OPTIONS:
        if spec.in_plugin:
            group.addoption(f"--moco-{spec.flag[2:]}", **_argument_kwargs(
                spec, default_none=True, prefix=PLUGIN_PREFIX))


def values_of(source) -> dict:
    """field → value of every table option ``source`` carries: an argparse namespace, or
    pytest's ``config`` (its ``--moco-*`` options)."""
    if hasattr(source, "getoption"):
        return {spec.field: source.getoption(PLUGIN_PREFIX + spec.field)
                for spec in OPTIONS if spec.in_plugin}
    return {spec.field: getattr(source, spec.field) for spec in OPTIONS
            if hasattr(source, spec.field)}


def options_from(source, **others) -> GradeOptions:
    """``GradeOptions`` from parsed flags; raises ``ValueError`` with one line when a value
    cannot be used."""
    values = values_of(source)
    problem = options_problem(values)
    if problem:
        raise ValueError(problem)
    return grade_options(values, **others)



def add_running_flags(parser) -> dict:
    """The running flags of every command that grades: the table's, ``--isolation`` and
    ``-j``; returns the argument groups."""
    from moco_ref.cli.isolation import add_isolation_flag

    sections = add_option_flags(parser, ("running",))
    add_isolation_flag(sections["running"])
    sections["running"].add_argument("-j", "--jobs", type=int, default=2, metavar="N",
                                     help="submissions graded at once")
    return sections


def rubric_of(args):
    """The course's rubric (``--rubric FILE``), read once per command (``RubricError`` when
    unusable), or the default."""
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric

    if not getattr(args, "rubric", None):
        return DEFAULT_RUBRIC
    if getattr(args, "loaded_rubric", None) is None:
        args.loaded_rubric = load_rubric(args.rubric)
    return args.loaded_rubric
