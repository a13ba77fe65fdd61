"""eaglet.training."""
