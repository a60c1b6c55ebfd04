from runner.terminal.output import OutputCollector, strip_ansi


def test_strip_ansi_colours_and_titles():
    assert strip_ansi("\x1b[1;31mred\x1b[0m \x1b]0;title\x07ok") == "red ok"


def test_escape_split_across_chunks_is_removed():
    c = OutputCollector()
    c.feed(b"a\x1b[3")
    c.feed(b"1mb\x1b")
    c.feed(b"[0mc")
    assert c.finish() == "abc"


def test_utf8_split_across_chunks():
    data = "héllo wörld".encode()
    c = OutputCollector()
    for i in range(len(data)):
        c.feed(data[i : i + 1])
    assert c.finish() == "héllo wörld"


def test_truncation_note_is_exact():
    c = OutputCollector(limit=50_000)
    for _ in range(100):
        c.feed(b"y\n" * 1000)  # 200,000 characters in total
    out = c.finish()
    assert out.startswith("y\ny\n")
    head, note = out.rsplit("\n[", 1)
    assert len(head) == 50_000
    assert note == "output truncated: showing the first 50,000 of 200,000 characters]"
    assert c.truncated and c.total_chars == 200_000


def test_short_output_keeps_text_and_drops_trailing_newlines():
    c = OutputCollector()
    c.feed(b"line1\r\nline2\n\n")
    assert c.finish() == "line1\nline2"
