"""moco-ref export: the query backbone of a checkpoint in the official layout, strictly
loadable into the torchvision architecture without its head."""

from __future__ import annotations

import pytest
import torch
import torchvision

from moco_ref import MoCo
from moco_ref.cli import main


def _official_checkpoint(path, mlp=False):
    """What the official main_moco.py saves: DDP-prefixed keys, the arch, an epoch."""
    model = MoCo(torchvision.models.resnet18, dim=16, K=32, mlp=mlp)
    state = {f"module.{name}": value for name, value in model.official_state_dict().items()}
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": state}, path)
    return model


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_export_strips_the_prefix_drops_the_head_and_loads_strictly(tmp_path, capsys):
    ckpt, out = tmp_path / "checkpoint_0001.pth.tar", tmp_path / "backbone.pth"
    model = _official_checkpoint(ckpt, mlp=True)
    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    backbone = torch.load(out, weights_only=True)
    assert not any(name.startswith(("fc.", "module.", "encoder_")) for name in backbone)
    assert torch.equal(backbone["conv1.weight"], model.encoder_q.conv1.weight)
    classifier = torchvision.models.resnet18(weights=None)
    missing, unexpected = classifier.load_state_dict(backbone, strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"] and not unexpected  # as lincls expects
    assert "loads strictly" in capsys.readouterr().out


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_export_refuses_in_one_line(tmp_path, capsys):
    ckpt = tmp_path / "c.pth"
    _official_checkpoint(ckpt)
    cases = [
        ["export", str(tmp_path / "missing.pth"), "--out", str(tmp_path / "o")],
        ["export", str(ckpt), "--out", str(tmp_path / "o"), "--arch", "resnet50"],
        ["export", str(ckpt), "--out", str(tmp_path / "o"), "--arch", "no_such_net"],
    ]
    for arguments in cases:
        assert main(arguments) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("moco-ref: error:") for line in err)
    assert "does not load strictly into resnet50" in err[1]
