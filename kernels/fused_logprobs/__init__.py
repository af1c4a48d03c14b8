"""fused logprobs kernel."""
