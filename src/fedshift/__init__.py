"""fedshift: federated learning under feature-distribution skew."""

__version__ = "0.1.0"
