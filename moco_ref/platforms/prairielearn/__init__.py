"""PrairieLearn: ``writer`` (the external grader's results), ``packager`` (the image, the
question and its tests, and the run in the grading container), ``local_run`` (the package tried
here), ``command`` (``moco-ref prairielearn build|test|run``)."""

from moco_ref.platforms import Platform
from moco_ref.platforms.prairielearn.command import add_parser
from moco_ref.platforms.prairielearn.writer import WRITER

PLATFORM = Platform("prairielearn", WRITER, add_parser)
