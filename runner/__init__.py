"""eaglet.runner: what runs a job around the engine and the training loop: config checks and memory sizing, the
Hydra entry, signals, tracking, the common set-up, and run_spec.py's run."""
