from inkwell.render import render_note


def test_a_heading_gets_an_id():
    assert render_note("# Hello, World!") == '<h1 id="hello-world">Hello, World!</h1>'


def test_deep_headings_stay_text():
    assert render_note("##### Too deep").startswith("<p>")
