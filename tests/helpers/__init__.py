"""Helpers shared by the tests in every room (imported as ``tests.helpers.<module>``)."""
