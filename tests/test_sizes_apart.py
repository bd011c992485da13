"""Two different sizes are not written the same where a sentence sets one against the other.

ZeroRedundancyOptimizer's rank 1 of this audit (and an FSDP2 rank) ran out on placement with a free
block of 4,190,208 bytes beside a 4 MiB request: 'more than the 4.00 MiB request, but in pieces:
the largest was 4.00 MiB', a sentence that reads as if the largest piece could take the request.
"""

from oomdoctor.analysis.results import Facts, Summary, SummaryKind
from oomdoctor.units import MIB, human_sizes_apart
from oomdoctor.views import phrasing


def test_sizes_that_round_alike_get_the_decimals_that_tell_them_apart():
    assert human_sizes_apart(4 * MIB - 4096, 4 * MIB) == ("3.996 MiB", "4.000 MiB")
    assert human_sizes_apart(16 * MIB - 20480, 16 * MIB) == ("15.98 MiB", "16.00 MiB")  # apart already
    assert human_sizes_apart(4 * MIB - 1, 4 * MIB) == ("3.999999 MiB", "4.000000 MiB")
    assert human_sizes_apart(1 << 40, (1 << 40) + 1) == ("1,099,511,627,776 bytes", "1,099,511,627,777 bytes")
    assert human_sizes_apart(4 * MIB, 4 * MIB) == ("4.00 MiB", "4.00 MiB")


def test_the_fragmentation_sentence_tells_the_largest_piece_from_the_request():
    facts = Facts.of(usable=9 * MIB, request=4 * MIB, largest=4 * MIB - 4096)
    text = phrasing.summary(Summary(SummaryKind.FRAGMENTATION, facts))
    assert "the 4.000 MiB request" in text and "the largest was 3.996 MiB" in text
