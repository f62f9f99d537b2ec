"""Learning platforms, one package each: a writer of the platform's results (from the
student's view, ``StudentView`` with the platform's ``SHOWING``), a packager that builds what
a course uploads, a local run that tries it here as the platform would, and the commands
``moco-ref NAME build|test|run``. A package here is found by its name and exposes ``PLATFORM``;
what every platform shares is public in ``course``, ``results``, ``local_run`` and
``commands``, and no platform imports another's package.

Adding a platform is adding a package ``moco_ref/platforms/<name>/`` whose ``__init__`` sets
``PLATFORM = Platform(...)``: its writer joins the table of writers (``grade --write NAME``)
and its commands join the command line.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from moco_ref.report.writers import REPORT_WRITERS, Writer


@dataclass(frozen=True)
class Platform:
    """What one platform's package offers."""

    name: str
    writer: Writer
    add_commands: Callable  # add_commands(subparsers): ``moco-ref NAME …``


@functools.cache
def platforms() -> dict[str, Platform]:
    """Every platform package here, by name (in name order); found once per process."""
    found = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.ispkg:
            platform = importlib.import_module(f"{__name__}.{module.name}").PLATFORM
            found[platform.name] = platform
    return found


def writers() -> dict[str, Writer]:
    """The table of writers: the report's own and each platform's."""
    table = dict(REPORT_WRITERS)
    for platform in platforms().values():
        table[platform.writer.name] = platform.writer
    return table
