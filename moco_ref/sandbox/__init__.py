"""The isolation machinery between the grader and a submission.

The grader's side: ``bwrap`` (the sandbox's command line and file system view), ``client``
(the warm process's grader end), ``attempt`` (one process observing a submission),
``observation`` (the retry loop over fresh processes, returning a typed ``SandboxRun``),
``capture``, ``confined_view`` (what a confined-rung job may see), ``launch``. Inside the
sandbox: ``zygote`` (the warm process, supervisor, job watch), ``jobspace``, ``confine``,
``landlock``, ``seccomp``, ``clib``, ``procs``.

May import: the standard library, torch, the contract ``moco_ref.probe`` and the observing
side ``moco_ref.observe`` (whose worker it runs). Never the judge, the reports or the
reference.
"""
