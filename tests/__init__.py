"""The test suite: one folder per package room, shared helpers in ``tests.helpers``."""
