"""Intake and batch running: what comes in, and running a class of it through grading.

What comes in (``targets``: which paths and module names are submissions, their names, the
shards, ``--only``; ``intake``: folders, zips, learning platforms' exports and their
rosters); a batch (``batch``: a folder graded in parallel, its reports and summaries written
to the output folder, ``output``; ``cache``: the signed cache of unchanged submissions;
``progress``); runs read back (``gradebook``: shards merged, two gradings compared); and the
bundled examples graded against their manifest (``demo``).

May import: the standard library, the contract ``moco_ref.probe``, the judge's results, the
one-submission pipeline ``moco_ref.run.pipeline``, the sandbox (for what keys the cache) and the
renderers ``moco_ref.report``. Only the tools and the commands import it; the reports, the
judge and the observing side never do (import-linter contracts).
"""
