"""Judging MoCo where it lives: the user's own modules and training loop, in the user's own
process (trusted code: no sandbox), with the grader's checks and messages.

    from moco_ref.trace import MoCoParts, record_moco

    parts = MoCoParts(query=model.encoder_q, key=model.encoder_k, queue=lambda: model.queue,
                      pointer=lambda: model.queue_ptr, temperature=0.07, momentum=0.999)
    with record_moco(parts) as recording:
        ...  # k steps of your own loop
    recording.assert_correct()
"""

__all__ = ["MoCoParts", "Recording", "record_moco"]


def __getattr__(name: str):
    """The recorder on first use: ``moco_ref.trace.layouts`` (the command line's) stays
    torch-free."""
    if name == "MoCoParts":
        from moco_ref.trace.parts import MoCoParts

        return MoCoParts
    if name in ("Recording", "record_moco"):
        from moco_ref.trace import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'moco_ref.trace' has no attribute {name!r}")
