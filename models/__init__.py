"""eaglet.models."""
