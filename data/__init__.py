"""eaglet.data."""
