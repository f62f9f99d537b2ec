"""The verification harness: observations of an implementation, and the checks that judge
them against the reference (DESIGN: "the submission's process observes, the grader's
process judges")."""
