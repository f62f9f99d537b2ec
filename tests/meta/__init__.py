"""Tests about the project itself and of the grader's own tests (meta-tests)."""
