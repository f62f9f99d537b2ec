"""Where a dictionary's keys lie in its tensor (torch-free, for the command line too)."""

LAYOUTS = ("dim-first", "rows", "per-view")  # [dim, K], [K, dim], [V, dim, K]
