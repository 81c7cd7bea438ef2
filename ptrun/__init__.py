"""ptrun."""
