"""Gradescope: ``writer`` (results.json), ``packager`` (the autograder zip and its run),
``local_run`` (the zip tried here), ``command`` (``moco-ref gradescope build|test|run``)."""

from moco_ref.platforms import Platform
from moco_ref.platforms.gradescope.command import add_parser
from moco_ref.platforms.gradescope.writer import WRITER

PLATFORM = Platform("gradescope", WRITER, add_parser)
