"""Text files users give: UTF-8, or an error naming the file and the byte offset."""

from __future__ import annotations

import pytest

from mizuoto.errors import InvalidRequest
from mizuoto.text import files


def test_utf8_text_is_read(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_text("Grüße, 你好 🙂\n", encoding="utf-8")
    assert files.read_utf8(path, "--text-file") == "Grüße, 你好 🙂\n"


@pytest.mark.parametrize("prefix", [b"", b"plain ascii " * 10])
def test_latin1_is_named_with_its_byte_offset(tmp_path, prefix):
    path = tmp_path / "latin1.txt"
    path.write_bytes(prefix + "café".encode("latin-1"))
    with pytest.raises(InvalidRequest) as caught:
        files.check_utf8(path, "--text-file")
    assert caught.value.field == "--text-file"
    assert f"byte {len(prefix) + 3} (e9)" in str(caught.value) and "iconv" in str(caught.value)


def test_an_error_past_the_first_block_has_the_right_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", 7)
    path = tmp_path / "late.txt"
    path.write_bytes("ééé".encode() + b"abcd" + b"\xff" + b"xyz")  # 6 bytes of é, then 4
    with pytest.raises(InvalidRequest, match=r"byte 10 \(ff\)"):
        files.check_utf8(path, "--text-file")


def test_a_character_cut_at_a_block_boundary_is_fine(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", 3)
    path = tmp_path / "split.txt"
    path.write_text("aé" * 20, encoding="utf-8")
    files.check_utf8(path, "--text-file")


def test_a_file_ending_inside_a_character(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes("ab€".encode()[:-1])
    with pytest.raises(InvalidRequest, match=r"byte 2 \(e2 82\)"):
        files.check_utf8(path, "--text-file")


@pytest.mark.parametrize(("data", "block", "offset"), [
    (b"abcdefg\xff", 4, 7), (b"ab\xc3\xa9cd\xfe", 3, 6), (b"\xc3\xa9\xc3\xa9\xc3", 2, 4),
    (b"abc\xc3(", 4, 3)])
def test_offsets_across_blocks(tmp_path, monkeypatch, data, block, offset):
    monkeypatch.setattr(files, "_BLOCK", block)
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    with pytest.raises(InvalidRequest, match=rf"byte {offset} "):
        files.check_utf8(path, "--text-file")


@pytest.mark.parametrize("encoding", ["UTF-16LE", "UTF-16BE", "UTF-32LE", "UTF-32BE"])
def test_a_unicode_file_with_a_byte_order_mark_is_named_with_its_encoding(tmp_path, encoding):
    """Excel's "Unicode Text" and Notepad's "Unicode" are UTF-16 with a BOM: the hint names
    that encoding (converting from latin1, the usual hint, would garble the file)."""
    path = tmp_path / "unicode.csv"
    path.write_bytes("\ufeffid,text\na,café\n".encode(encoding))
    with pytest.raises(InvalidRequest) as caught:
        files.check_utf8(path, "input")
    assert f"is not UTF-8 text: it is {encoding}" in str(caught.value)
    assert f"iconv -f {encoding} -t utf-8" in str(caught.value)


@pytest.mark.parametrize("path", ["/dev/zero", "/proc/self/maps", "/dev/urandom"])
def test_a_text_file_that_is_no_regular_file_is_refused_before_reading(path):
    from mizuoto.text.files import read_utf8

    with pytest.raises(InvalidRequest, match="not a regular file") as raised:
        read_utf8(path, "dataset")
    assert raised.value.field == "dataset"
