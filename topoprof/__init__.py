"""topoprof: GPU topology and interconnect profiler for multi-GPU PyTorch training."""

__version__ = "0.1.0"
