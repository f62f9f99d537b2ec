"""Tests of moco_ref.judge: invariants, checks and their registry, the rubric, the corpus."""
