"""MoCo across 2 and 3 CPU processes (gloo on loopback)."""

import pytest
import torch
import torch.multiprocessing as mp

from tests.helpers import distributed_workers as workers


def _run(body, world, tmp_path):
    mp.start_processes(body, args=(world, str(tmp_path / "rendezvous"), str(tmp_path)),
                       nprocs=world, start_method="fork")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_shuffle_then_unshuffle_is_the_identity_and_gather_is_in_rank_order(world, tmp_path):
    ranks = _run(workers.shuffle_and_gather, world, tmp_path)
    for rank, seen in enumerate(ranks):
        assert torch.equal(seen["restored"], seen["x"]), f"rank {rank} got other images back"
        assert seen["gathered"].tolist() == list(range(world))
    everything = torch.cat([seen["x"] for seen in ranks]).flatten().sort().values
    shuffled = torch.cat([seen["shuffled"] for seen in ranks]).flatten().sort().values
    assert torch.equal(everything, shuffled), "the shuffle must be a permutation of all images"


@pytest.mark.parametrize("world", [2, 3])
def test_queues_agree_across_ranks_and_match_one_process_on_the_whole_batch(world, tmp_path):
    ranks = _run(workers.train_moco_ranks, world, tmp_path)
    single = workers.train_moco_single(world)
    for step in range(workers.STEPS):
        for rank, seen in enumerate(ranks):
            assert torch.equal(seen["queue"][step], ranks[0]["queue"][step]), (step, rank)
            assert torch.equal(seen["queue_ids"][step], single["queue_ids"][step]), (step, rank)
        torch.testing.assert_close(ranks[0]["queue"][step], single["queue"][step],
                                   rtol=1e-5, atol=1e-6)
        together = torch.cat([seen["logits"][step] for seen in ranks])
        torch.testing.assert_close(together, single["logits"][step], rtol=1e-4, atol=1e-5)
    for a, b in zip(ranks[0]["params"], single["params"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
