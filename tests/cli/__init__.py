"""Tests of moco_ref.cli: the commands, the pytest plugin, doctor, the notebook self-check."""
