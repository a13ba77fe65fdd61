"""eaglet.experiments."""
