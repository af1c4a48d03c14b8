"""The projections LoRA can adapt (``lora.targets``) and the stacked decoder weights of each.

Kept apart from ``rljax.models.lora`` (which needs JAX) so that the config derives
``lora.targets``' choices, and refuses a target a model cannot take, from this table without
importing JAX.

On a mixture-of-experts model the MLP targets (``gate``, ``up``, ``down``) adapt the dense MLP
of its dense layers and Qwen2-MoE's shared expert of its MoE layers; the routed experts
(``we_*``) stay frozen, so a target with neither on the model adapts nothing and is refused.
"""

# lora.targets -> the stacked decoder weight each adapts (a dense MLP's, for the MLP targets).
TARGET_WEIGHTS = {
    "q": "wq",
    "k": "wk",
    "v": "wv",
    "o": "wo",
    "gate": "w_gate",
    "up": "w_up",
    "down": "w_down",
}
# The MLP targets -> the Qwen2-MoE shared expert's weight each adapts in the MoE layers.
SHARED_EXPERT_WEIGHTS = {"gate": "ws_gate", "up": "ws_up", "down": "ws_down"}
ATTENTION_TARGETS = tuple(t for t in TARGET_WEIGHTS if t not in SHARED_EXPERT_WEIGHTS)


def target_weights(target: str, *, dense_mlp: bool, shared_expert: bool) -> tuple[str, ...]:
    """The stacked weights ``target`` adapts on a model with dense-MLP layers (``dense_mlp``)
    and/or MoE layers with a shared expert (``shared_expert``); () when it would adapt only
    routed experts, which LoRA never does."""
    if target not in SHARED_EXPERT_WEIGHTS:
        return (TARGET_WEIGHTS[target],)
    return (TARGET_WEIGHTS[target],) * dense_mlp + (SHARED_EXPERT_WEIGHTS[target],) * shared_expert
