"""Postal addresses."""


def format_address(name: str, street: str, postcode: str, city: str, country: str) -> list[str]:
    """The lines of an address as a label prints them: the postcode before the city, the
    city and the country in capitals."""
    return [name, street, f"{postcode} {city.upper()}", country.upper()]
