"""Tests of moco_ref.report, the renderers."""
