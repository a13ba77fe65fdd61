"""eaglet.engine: the decoding engine (AR and EAGLE), its stream plans, CUDA graphs, sampling and phase timing."""
