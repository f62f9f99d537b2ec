"""The reference MoCo, and nothing of the harness: the FIFO rule (``queue``), the EMA law
(``momentum``), the mask, logits and loss (``contrastive``), one training step in both orders
(``step``), the warm-up numbers (``warmup``), the official-style module (``builder``) and its
distributed helpers (``distributed``), LAB 07's ``train_moco`` (``lab``), views, input
validation and the one tolerance rule.

May import: the standard library, torch, numpy. Imports nothing else of ``moco_ref``.
"""
