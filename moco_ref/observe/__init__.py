"""The observing side: what runs beside the submission, inside the sandbox, in hostile
territory. The worker loads the submission (``loader``), refuses reference imports
(``guard``), observes it part by part through the probes (``observers``, ``parts``,
``lab_probe``, ``builder_probe``, ``builder_ranks``, ``builder_observer``) and sends plain
records over the channel (``channel``). Nothing here judges.

May import: the standard library, torch, nbformat, and the contract ``moco_ref.probe``.
Never the reference (``core``), the judge, the reports or the tools — not even indirectly
(an import-linter contract), so a submission cannot reach them in ``sys.modules``.
"""
