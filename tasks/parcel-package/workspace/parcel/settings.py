"""Settings."""

MAX_RETRIES = 30
"""The number of times a busy carrier API is asked again."""

LABEL_WIDTH_MM = 100
LABEL_HEIGHT_MM = 150
DEFAULT_CARRIER = "postnord"
"""The carrier of an order that names none."""
SENDER_COUNTRY = "SE"
