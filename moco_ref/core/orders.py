"""The two step orders DESIGN allows (I6), in a module that needs no torch, so the command
line can offer them without importing it."""

ORDERS = ("paper", "lab")  # paper: EMA after the query update; lab: EMA before the key forward
