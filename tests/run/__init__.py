"""Tests of the grading pipeline: moco_ref.run.pipeline, batch grading and intake (moco_ref.run)."""
