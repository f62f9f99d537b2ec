"""Stand-ins for the harness's observing/judging side, for testing the grading plumbing
without depending on the real checks (see ``stub_harness``)."""
