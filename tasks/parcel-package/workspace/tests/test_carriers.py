from parcel.carriers import carrier_name


def test_carrier_names():
    assert carrier_name("dhl") == "DHL Express"
