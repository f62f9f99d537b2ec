"""The torchrun entry point trains on 2 CPU processes and writes its metrics (slow)."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "-m", "moco_ref.tools.train_dist", "--epochs", "1", "--out", str(tmp_path)],
        check=True, timeout=300,
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(metrics["history"]) == 1
    for which in ("random_init", "trained"):
        assert 0.0 <= metrics["probe"][which]["linear"] <= 1.0


@pytest.mark.parametrize(("arguments", "says"), [
    (["--recipe", "nope"], "invalid choice: 'nope'"),
    (["--epochs", "0"], "expected a positive integer, got 0"),
])
def test_bad_arguments_are_refused_like_moco_ref_train(arguments, says, capsys):
    from moco_ref.tools.train_dist import _parse

    with pytest.raises(SystemExit) as caught:
        _parse(arguments)
    assert caught.value.code == 2 and says in capsys.readouterr().err
