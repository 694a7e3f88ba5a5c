"""`mizuoto.licenses`: a model directory's model card names its license."""

from __future__ import annotations

import pytest

from mizuoto.licenses import is_non_commercial, model_card_license


@pytest.mark.parametrize(("card", "expected"), [
    ("---\nlicense: cc-by-nc-4.0\ntags: [tts]\n---\n# F5\n", "CC-BY-NC-4.0"),
    ("---\nlicense: apache-2.0\n---\n", "Apache-2.0"),
    ("---\nlicense: other-license\n---\ntext", "other-license"),
    ("# no front matter\nlicense: mit\n", None),
    ("---\nlicense: [unclosed\n---\n", None),
    ("---\n- a list\n---\n", None),
    ("---\nlicense: 3\n---\n", None),
])
def test_the_front_matter_license_is_read(tmp_path, card, expected):
    (tmp_path / "README.md").write_text(card, encoding="utf-8")
    assert model_card_license(tmp_path) == expected


def test_no_card_names_no_license(tmp_path):
    assert model_card_license(tmp_path) is None
    assert model_card_license(tmp_path / "missing") is None


def test_only_the_nc_licenses_are_non_commercial():
    assert is_non_commercial("CC-BY-NC-4.0") and is_non_commercial("cc-by-nc-sa-4.0")
    assert not any(is_non_commercial(name) for name in ("MIT", "Apache-2.0", "CC-BY-4.0", None))
