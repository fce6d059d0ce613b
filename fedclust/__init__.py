"""fedclust: vectorized multi-process trainer for clustered federated learning."""

__version__ = "0.1.0"
