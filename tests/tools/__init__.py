"""Tests of moco_ref.tools: training, walk, export, data, refactor guard, sensitivity, etc."""
