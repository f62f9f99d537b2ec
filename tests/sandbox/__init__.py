"""Tests of moco_ref.sandbox: the isolation, and what crosses the wall from a submission."""
