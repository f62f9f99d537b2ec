"""Adversarial: SystemExit at import (`exit()` left at the end of a notebook export).

Expected: not gradable, with the traceback.
"""
from _moco import moco_warmup  # noqa: F401

raise SystemExit(0)
