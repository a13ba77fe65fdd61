"""One-off probes, sweeps and profiles; run each as a module from the repository root:
`python -m benchmarks.probes.<script>`."""
