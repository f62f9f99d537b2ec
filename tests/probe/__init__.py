"""Tests of the contract both sides share (moco_ref.probe)."""
