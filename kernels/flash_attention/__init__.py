"""flash attention kernel."""
