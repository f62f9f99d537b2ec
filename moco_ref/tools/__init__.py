"""Tools around the reference and the grader, each its own job: the golden values
(``golden``), the refactor guard (``refactor_guard``), the single-point mutants and the
sensitivity measure (``mutants``, ``sensitivity``), the Gradescope packager (``autograder``),
the step-by-step walk (``walk``) and the digits training recipe (``data``, ``models``,
``evaluation``, ``recipes``, ``train_dist``, ``checkpoint``, figures).

May import everything below the command line: the pipeline, the reports, the judge, the
reference and the contract.
"""
