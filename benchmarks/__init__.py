"""Kernel and end-to-end benchmarks; run each as a module from the repository root: `python -m benchmarks.<script>`."""
