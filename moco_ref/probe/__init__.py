"""The contract both sides of the sandbox wall share, and nothing else.

What a grading run may be told (``options``); the one table of submission styles, their entry
points and how a style is recognised (``styles``, from source: ``source``); the parts an
observation is split into and how they are assembled (``parts``); the record schema
(``schema``); the probes themselves — their sizes, cases, models and inputs (``cases``,
``lab``, ``builder``) — which the submission's process runs and the grader rebuilds to
recompute; and the one rule for what may cross the wall, within which limits (``wall``).

May import: the standard library, torch, hypothesis, nbformat. Imports nothing else of
``moco_ref`` (an import-linter contract): the observing side (``observe``) and the judging side
(``judge``) both build on it, and neither on the other.
"""
