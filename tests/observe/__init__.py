"""Tests of the submission's side: the contract (moco_ref.probe) and moco_ref.observe."""
