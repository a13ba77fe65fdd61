"""eaglet.spec."""
