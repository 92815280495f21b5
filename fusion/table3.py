"""DNNFusion's fusion-opportunity table (paper §3.2, Table 3): what fusing two mapping types gives.

Rows are the first (producer) type, columns the second (consumer). Each cell gives the fused
type and a colour: GREEN fuses without further analysis, YELLOW asks a cost source, RED never
fuses. The cells' types and the two red cells are certain; the colours are rebuilt from the
paper's prose (see ../shared/design/dnnfusion-paper.md §2). The two cells the text leaves open are
decided here:

* One-to-Many -> One-to-Many is YELLOW: legal, and the safe choice is to measure.
* Reorganize / Shuffle combined with each other are GREEN: the prose only asks for profiling
  when One-to-Many or Many-to-Many is involved, and both are pure index arithmetic in Halide.

Reorganize with Shuffle gives Reorganize in either order (the table's one exception to the
impedance rule).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .mapping import REORG, SHUFFLE, MappingType, MtM, OtM, OtO


class Color(enum.Enum):
    """Whether a pair fuses: always, after asking a cost source, or never."""

    GREEN = "green"
    YELLOW = "yellow"
    RED = "red"


@dataclass(frozen=True)
class Cell:
    """One cell: the fused type (None for red cells) and the colour."""

    fused: MappingType | None
    color: Color


G, Y, R = Color.GREEN, Color.YELLOW, Color.RED

TABLE3: dict[tuple[MappingType, MappingType], Cell] = {
    # first = One-to-One: fusing with anything is profitable (Add and GEMM "in either order")
    (OtO, OtO): Cell(OtO, G), (OtO, OtM): Cell(OtM, G), (OtO, MtM): Cell(MtM, G),
    (OtO, REORG): Cell(REORG, G), (OtO, SHUFFLE): Cell(SHUFFLE, G),
    # first = One-to-Many: a scattered input to a compute-heavy op (Expand then Conv) is red
    (OtM, OtO): Cell(OtM, G), (OtM, OtM): Cell(OtM, Y), (OtM, MtM): Cell(None, R),
    (OtM, REORG): Cell(OtM, Y), (OtM, SHUFFLE): Cell(OtM, Y),
    # first = Many-to-Many: Conv then Conv is red; Conv then Expand / Resize must be measured
    (MtM, OtO): Cell(MtM, G), (MtM, OtM): Cell(MtM, Y), (MtM, MtM): Cell(None, R),
    (MtM, REORG): Cell(MtM, Y), (MtM, SHUFFLE): Cell(MtM, Y),
    # first = Reorganize
    (REORG, OtO): Cell(REORG, G), (REORG, OtM): Cell(OtM, Y), (REORG, MtM): Cell(MtM, Y),
    (REORG, REORG): Cell(REORG, G), (REORG, SHUFFLE): Cell(REORG, G),
    # first = Shuffle
    (SHUFFLE, OtO): Cell(SHUFFLE, G), (SHUFFLE, OtM): Cell(OtM, Y), (SHUFFLE, MtM): Cell(MtM, Y),
    (SHUFFLE, REORG): Cell(REORG, G), (SHUFFLE, SHUFFLE): Cell(SHUFFLE, G),
}


def cell(first: MappingType, second: MappingType) -> Cell:
    """The Table 3 cell for a producer of type `first` fused with a consumer of type `second`."""
    return TABLE3[(first, second)]
