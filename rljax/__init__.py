"""rljax: JAX-native asynchronous RL post-training for LLMs."""
