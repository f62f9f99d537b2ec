"""A builder submission's class: ``MoCo``, or ``MoCo`` in another case — found from the
source (the grader's side) and from the namespace (the observing side) by one rule."""

from __future__ import annotations

from moco_ref.probe.source import bound_entry_points, may_be_helper, style_from_source
from moco_ref.probe.styles import as_entry_points, builder_class_name, detect_style


def test_the_builder_class_is_moco_or_moco_in_another_case():
    assert builder_class_name({"MoCo", "Moco"}) == "MoCo"
    assert builder_class_name({"Moco", "helper"}) == "Moco"
    assert builder_class_name({"MOCO"}) == "MOCO"
    assert builder_class_name({"MoCoV2", "Mocha", "moco_warmup"}) is None
    assert as_entry_points({"Moco", "train_moco", "x"}) == {"MoCo", "train_moco"}


def test_a_file_binding_moco_in_another_case_is_a_builder_submission(tmp_path):
    path = tmp_path / "module.py"
    path.write_text("import torch.nn as nn\n\n\nclass Moco(nn.Module):\n    pass\n")
    assert bound_entry_points(path) == {"MoCo"}
    assert style_from_source(path) == "builder"
    assert not may_be_helper(path)  # graded on its own, never a classmate's helper


def test_a_namespace_with_moco_in_another_case_is_builder_but_not_a_function_of_that_name():
    assert detect_style({"MOCO": type("MOCO", (), {})}) == "builder"
    assert detect_style({"train_moco": lambda: None, "moco": lambda: None}) == "lab"


def test_the_report_says_the_class_goes_by_another_name():
    from pathlib import Path

    from moco_ref.probe.options import GradeOptions
    from moco_ref.run.pipeline import style_decided

    examples = Path(__file__).resolve().parents[2] / "examples" / "submissions"
    options, note = style_decided(str(examples / "builder_correct_class_named_moco.py"),
                                  GradeOptions())
    assert options.style == "builder"
    assert note.startswith("its builder class is named Moco, not MoCo")
    _, plain = style_decided(str(examples / "builder_correct_official_style.py"), GradeOptions())
    assert plain == ""
