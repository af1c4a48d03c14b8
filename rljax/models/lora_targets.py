"""The projections LoRA can adapt (``lora.targets``) and the stacked decoder weight of each.

Kept apart from ``rljax.models.lora`` (which needs JAX) so that the config derives
``lora.targets``' choices from this table without importing JAX.
"""

# lora.targets -> the stacked decoder weight each adapts.
TARGET_WEIGHTS = {
    "q": "wq",
    "k": "wk",
    "v": "wv",
    "o": "wo",
    "gate": "w_gate",
    "up": "w_up",
    "down": "w_down",
}
