"""A prompt file that is not UTF-8 is refused with its path and line, not a bare UnicodeDecodeError (issue 14)."""
import pytest

from flow_grpo.data import load_prompts


@pytest.mark.parametrize("name", ["p.txt", "p.jsonl"])
def test_non_utf8_prompt_file_names_file_and_line(tmp_path, name):
    f = tmp_path / name
    good = b'{"prompt": "a cat"}' if name.endswith("jsonl") else b"a cat"
    bad = '{"prompt": "caf\xe9"}'.encode("latin-1") if name.endswith("jsonl") else "caf\xe9".encode("latin-1")
    f.write_bytes(good + b"\r\n\r\n" + good + b"\r" + bad + b"\n")  # CRLF, blank line, lone CR: bad is line 4
    with pytest.raises(ValueError, match=rf"{name}:4: not valid UTF-8 \(byte 0xe9 at offset \d+\)") as ei:
        load_prompts(str(f))
    assert str(f) in str(ei.value)


def test_universal_newlines_are_kept(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes("a cat\r\nb\u00e9e\rc dog\n".encode("utf-8"))
    assert load_prompts(str(f)) == (["a cat", "b\u00e9e", "c dog"], [{}, {}, {}])
