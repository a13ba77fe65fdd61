"""eaglet.kernels."""
