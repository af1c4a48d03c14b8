"""mesh."""
