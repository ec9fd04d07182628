"""Modules on stfast's fused ops, drop-in for their plain-PyTorch references."""
from .geo_conv import GeoConv
from .linear import Linear
from .lstm import LSTM

__all__ = ["LSTM", "GeoConv", "Linear"]
