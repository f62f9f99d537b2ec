"""Tests of moco_ref.core, the reference MoCo."""
