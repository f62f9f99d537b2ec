"""A MoCo module under another name, and an EMA that rebinds its loop's name, read from the
source (``probe.source``): what makes a class a MoCo module, which class the grader builds,
and the line an EMA that never moved is told with."""

from __future__ import annotations

import textwrap
from pathlib import Path

from moco_ref.probe.options import GradeOptions
from moco_ref.probe.source import loop_name_rebindings, moco_like_class
from moco_ref.run.pipeline import style_decided

MODULE = '''
import torch
from torch import nn


class {name}(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1):
        super().__init__()
        self.{q} = base_encoder(num_classes=dim)
        self.{k} = base_encoder(num_classes=dim)
        self.register_buffer("queue", torch.randn(dim, K))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_k, p_q in zip(self.{k}.parameters(), self.{q}.parameters()):
            {update}

    def forward(self, im_q, im_k):
        return self.{q}(im_q), self.{k}(im_k)
'''


def _write(tmp_path: Path, name="MoCoV2", q="encoder_q", k="encoder_k",
           update="p_k.data.mul_(0.9).add_(p_q.data, alpha=0.1)", extra="") -> Path:
    path = tmp_path / "module.py"
    path.write_text(MODULE.format(name=name, q=q, k=k, update=update) + textwrap.dedent(extra))
    return path


def test_a_class_with_encoders_a_queue_and_a_two_view_forward_is_the_module(tmp_path):
    name, marks = moco_like_class(_write(tmp_path, "MomentumContrast", "student", "teacher"))
    assert name == "MomentumContrast"
    assert marks == ["_momentum_update_key_encoder", "a queue", "encoders student and teacher",
                     "forward over two views"]
    options, note = style_decided(str(tmp_path / "module.py"), GradeOptions())
    assert options.style == "builder" and options.builder_class == "MomentumContrast"
    assert "class MomentumContrast is a MoCo module" in note


def test_two_such_classes_or_none_are_no_module(tmp_path):
    twice = MODULE.format(name="Other", q="encoder_q", k="encoder_k", update="pass")
    assert moco_like_class(_write(tmp_path, extra=twice)) is None
    (tmp_path / "plain.py").write_text("from torch import nn\n\nclass Net(nn.Module):\n"
                                       "    def forward(self, a, b):\n        return a\n")
    assert moco_like_class(tmp_path / "plain.py") is None
    # a class named MoCo is found by its name: nothing to infer
    options, note = style_decided(str(_write(tmp_path, name="MoCo")), GradeOptions())
    assert options.builder_class == "" and options.style == "builder" and note == ""


def test_an_update_that_rebinds_the_loop_s_name_is_found_by_its_line(tmp_path):
    path = _write(tmp_path, update="p_k = p_k * 0.9 + p_q * 0.1")
    assert loop_name_rebindings(path) == [(16, "p_k = p_k * 0.9 + p_q * 0.1")]
    assert loop_name_rebindings(_write(tmp_path)) == []  # written in place
    assert loop_name_rebindings(_write(tmp_path, update="total = p_k * 0.9")) == []
