from inkwell.text import wrap_lines


def test_wrap_lines():
    assert wrap_lines("one two three", 7) == ["one two", "three"]
