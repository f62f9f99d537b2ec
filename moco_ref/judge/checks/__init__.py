"""The checks, one module per invariant family; importing this package declares them all."""

from moco_ref.judge.checks import (  # noqa: F401
    contract,
    i1_key_grads,
    i2_stored_keys,
    i3_fifo,
    i4_same_source_mask,
    i5_warmup_values,
    i6_step_order,
    i7_ema_law,
    i8_loss,
    i9_batch_not_negative,
    warmup,
)
