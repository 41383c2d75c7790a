"""crossover-monitor: measures where the GPU starts to beat the CPU at matrix multiplication."""

__version__ = "0.1.0"
