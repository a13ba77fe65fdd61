"""eaglet.engine."""
