"""Renderers only: a grade, once judged, as the grader, a CI job, a learning platform or a
student reads it — the terminal, JSON and JUnit (``formats``), Gradescope and PrairieLearn
(``lms``), a student's feedback page (``feedback``, its pictures ``figures``), the class
report (``class_report``), the gradebook CSVs (``gradebook_csv``); with what a grade means
for a gate (``scoring``) and one module of student-safe text they share (``text``).

May import: the standard library, the contract ``moco_ref.probe`` and the judge's results,
registry and rubric. Never the pipeline that grades (``moco_ref.run.pipeline``), nor the running of
batches (``moco_ref.run``).
"""
