"""troupe."""
