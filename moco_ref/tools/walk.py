"""The one-step walk-through of seed page P17, executed by the reference and narrated.

A 4-slot dictionary holds k1…k4; one image (source id 5) gives two views; its key k5 is the
positive; L = −ln p⁺; the gradient reaches θq only; the EMA moves θk; k5 enters and k1
leaves, so the next batch meets k2…k5. The narration is an event log of what the trainer
actually did, so ``--order`` shows where the EMA really sits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from moco_ref.core.queue import KeyQueue
from moco_ref.core.step import ORDERS, MoCoTrainer

WALK_M, WALK_T, WALK_LR, WALK_SLOTS = 0.9, 0.2, 0.5, 4
_PIXELS = torch.tensor(  # five tiny 3-pixel "images": ids 1…4 made k1…k4, id 5 is this batch
    [[1.0, 0.0, 0.2], [0.0, 1.0, 0.1], [-1.0, 0.3, 0.0], [0.2, -1.0, 0.4], [0.7, 0.6, -0.3]],
    dtype=torch.float64,
)


@dataclass
class WalkEvent:
    stage: str
    detail: str


@dataclass
class Walk:
    order: str
    events: list[WalkEvent] = field(default_factory=list)
    dictionary_before: list[str] = field(default_factory=list)
    dictionary_after: list[str] = field(default_factory=list)
    loss: float = 0.0

    def text(self) -> str:
        title = "Algorithm 1 of the paper" if self.order == "paper" else "LAB 07 / official code"
        lines = [
            f"MoCo, one step on a {WALK_SLOTS}-slot dictionary (seed page P17) "
            f"- order: {self.order} ({title})",
            f"  m = {WALK_M}, T = {WALK_T}, encoders: 3 -> 2 linear maps in float64, "
            "θk trailing θq as it does mid-training",
            f"  dictionary before the step (oldest first): {' '.join(self.dictionary_before)}",
        ]
        lines += [f"  {i:>2}. {e.stage:<22} {e.detail}" for i, e in enumerate(self.events, 1)]
        lines.append(
            f"  dictionary for the next batch: {' '.join(self.dictionary_after)} "
            "(k2…k4 kept bit for bit, not recomputed)"
        )
        return "\n".join(lines)


def _fmt(values: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:+.3f}" for v in values.flatten().tolist()) + "]"


class _NarratedTrainer(MoCoTrainer):
    """The reference trainer, logging each private stage as it runs."""

    def __init__(self, *args, walk: Walk, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.walk = walk

    def _log(self, stage: str, detail: str) -> None:
        self.walk.events.append(WalkEvent(stage, detail))

    def _encode_queries(self, view_q):
        q = super()._encode_queries(view_q)
        self._log("query encoder θq", f"view a -> q = {_fmt(q)} (with autograd)")
        return q

    def _encode_keys(self, view_k):
        k = super()._encode_keys(view_k)
        self._log("key encoder θk", f"view b -> k+ = k5 = {_fmt(k)} (no autograd)")
        return k

    def _logits_and_labels(self, q, k, ids):
        logits, labels, in_batch = super()._logits_and_labels(q, k, ids)
        probs = logits.softmax(dim=1)[0]
        names = ["k5 (positive)"] + [f"k{int(i)}" for i in self.queue.ids]
        shown = ", ".join(f"{n}: {p:.3f}" for n, p in zip(names, probs.tolist()))
        self._log("compare", f"q against k+ and the old dictionary, p = softmax(q·k/T): {shown}")
        return logits, labels, in_batch

    def _update_query_encoder(self, loss):
        self._log("loss", f"L = -ln p+ = {loss.item():.4f}")
        before = [p.detach().clone() for p in self.encoder_q.parameters()]
        super()._update_query_encoder(loss)
        grad = torch.cat([p.grad.flatten() for p in self.encoder_q.parameters()]).norm()
        key_grads = {p.grad is None for p in self.encoder_k.parameters()}
        moved = max((a - b).abs().max().item() for a, b in zip(self.encoder_q.parameters(), before))
        self._log(
            "gradient -> θq",
            f"|dL/dθq| = {grad:.4f}, θq moved by up to {moved:.4f}; "
            f"θk.grad is None: {key_grads == {True}}",
        )

    def _momentum_update_key_encoder(self):
        before = [p.detach().clone() for p in self.encoder_k.parameters()]
        super()._momentum_update_key_encoder()
        moved = max((a - b).abs().max().item() for a, b in zip(self.encoder_k.parameters(), before))
        law = f"θk <- {WALK_M}·θk + {1 - WALK_M:.1f}·θq"
        self._log("EMA -> θk", f"{law}, θk moved by up to {moved:.4f}")

    def _dequeue_and_enqueue(self, k, ids):
        leaving = f"k{int(self.queue.ids[0])}"
        super()._dequeue_and_enqueue(k, ids)
        self._log("FIFO", f"k5 enters, {leaving} leaves")


def run_walk(order: str = "paper") -> Walk:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    generator = torch.Generator().manual_seed(17)
    encoder = nn.Linear(3, 2, bias=False).to(torch.float64)
    with torch.no_grad():
        encoder.weight.copy_(torch.randn(2, 3, generator=generator, dtype=torch.float64))
    lagging = nn.Linear(3, 2, bias=False).to(torch.float64)  # θk trails θq mid-training
    with torch.no_grad():
        lagging.weight.copy_(encoder.weight + 0.3 * torch.randn(2, 3, generator=generator,
                                                                dtype=torch.float64))
    walk = Walk(order=order)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=WALK_LR)
    trainer = _NarratedTrainer(
        encoder, optimizer, m=WALK_M, temperature=WALK_T, capacity=WALK_SLOTS, order=order,
        key_encoder=lagging, walk=walk,
    )
    with torch.no_grad():  # earlier steps produced k1…k4 with the key encoder
        old_keys = torch.nn.functional.normalize(trainer.encoder_k(_PIXELS[:4]), dim=1)
    trainer.queue = KeyQueue(WALK_SLOTS, 2, dtype=torch.float64)
    trainer.queue.enqueue(old_keys, torch.arange(1, 5))
    walk.dictionary_before = [f"k{i}" for i in trainer.queue.ids.tolist()]
    noise = 0.05 * torch.randn(2, 3, generator=generator, dtype=torch.float64)
    view_a, view_b = _PIXELS[4:] + noise[:1], _PIXELS[4:] + noise[1:]
    walk.events.append(WalkEvent("two views", "image 5 -> view a (query), view b (key)"))
    result = trainer.step(view_a, view_b, torch.tensor([5]))
    walk.loss = result.loss.item()
    walk.dictionary_after = [f"k{i}" for i in trainer.queue.ids.tolist()]
    return walk
