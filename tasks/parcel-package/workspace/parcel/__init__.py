"""parcel: shipping labels for a small web shop."""

from parcel.labels import build_label

__all__ = ["build_label"]
