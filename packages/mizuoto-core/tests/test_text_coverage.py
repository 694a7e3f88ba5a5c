"""The warning an engine gives for characters its model cannot speak."""

from mizuoto.text.coverage import SHOWN, dropped_characters_warning


def test_nothing_dropped_is_no_warning():
    assert dropped_characters_warning([], "Hello.", "spaces") is None
    assert dropped_characters_warning([" "], "Hello .", "spaces") is None  # a space is no loss


def test_the_warning_names_the_characters_and_their_share():
    said = dropped_characters_warning(["ж", "ы", "ж"], "Say жыж now", "spaces (id 0)")
    assert said == ("3 characters of the text are not in the model's vocabulary and read as "
                    "spaces (id 0), not spoken (33% of the text): ж ы")
    one = dropped_characters_warning(["ж"], "ж", "<unk>")
    assert one.startswith("1 character of the text is not") and "(100% of the text)" in one


def test_many_distinct_characters_are_counted_not_all_listed():
    dropped = [chr(0x4E00 + n) for n in range(SHOWN + 3)]
    said = dropped_characters_warning(dropped, "".join(dropped), "<unk>")
    assert said.endswith(" and 3 more") and dropped[SHOWN] not in said
