"""stfast: fast training of spatio-temporal travel-time models (DeepTTE) on GPS trajectories."""
__version__ = "0.1.0"
