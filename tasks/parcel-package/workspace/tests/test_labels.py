from parcel.labels import build_label

ORDER = {"name": "Ada Lind", "street": "Storgatan 1", "postcode": "114 55", "city": "Stockholm", "country": "se"}


def test_a_label_prints_the_city_in_capitals():
    assert build_label(ORDER)["lines"][2] == "114 55 STOCKHOLM"


def test_an_order_without_a_carrier_gets_the_default():
    assert build_label(ORDER)["carrier"] == "PostNord"
