"""`predict --explain`'s stacked bars give every part its own colour: with 12 parts and 11
colours the host's time was drawn in the GEMMs' blue."""

from paraplan.plots.predict import PART_COLOURS
from paraplan.predict.explain import PARTS


def test_every_part_has_a_colour_of_its_own():
    assert len(PARTS) == 13
    assert len(set(PART_COLOURS[: len(PARTS)])) == len(PARTS)
