"""The commands: ``moco-ref grade``, ``checks``, ``demo``, ``walk``, ``train``, ``golden``,
``record``/``compare``, and the pytest plugin."""

from moco_ref.cli.main import main

__all__ = ["main"]
