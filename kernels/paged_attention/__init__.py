"""paged attention kernel."""
