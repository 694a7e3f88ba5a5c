"""Kept for plugins written against plugin API 1.0, which import the range validators from
here; they live in :mod:`mizuoto.validation.ranges` (below ``options``, which uses them)."""

from mizuoto.validation.ranges import check_number, integer_in, number_in, plain_number, shown

__all__ = ["check_number", "integer_in", "number_in", "plain_number", "shown"]
