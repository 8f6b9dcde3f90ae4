"""Labels for orders."""

from parcel import settings
from parcel.address import format_address
from parcel.carriers import carrier_name


def build_label(order: dict) -> dict:
    """A label for `order` (a dict from the shop's JSON export)."""
    carrier = order.get("carrier", settings.DEFAULT_CARRIER)
    lines = format_address(order["name"], order["street"], order["postcode"], order["city"], order["country"])
    return {"lines": lines, "carrier": carrier_name(carrier),
            "size_mm": (settings.LABEL_WIDTH_MM, settings.LABEL_HEIGHT_MM)}
