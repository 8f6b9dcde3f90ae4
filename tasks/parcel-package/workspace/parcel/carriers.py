"""Carriers, by code."""

CARRIERS = {"postnord": "PostNord", "dhl": "DHL Express", "bring": "Bring"}


def carrier_name(code: str) -> str:
    """The name printed on a label for a carrier's code."""
    return CARRIERS[code]
