"""Where a controller resumes reading the value signals: the lowest offset not yet processed.

Faust commits, per partition, the offsets its agents have acknowledged without a gap. After a
rebalance that gives a worker its partition straight back, its agent goes on with the records it
had buffered while the partition is read again from the committed offset, so the acknowledged
offsets can run ahead of records the new read has not delivered yet, and the commit with them. A
worker that dies then (a kill a few seconds after a pause) leaves a committed offset past signals
it never processed: counted neither by it nor, since they are not read again, by its successor.

So the controller keeps its own mark per value partition: every offset below it was processed
(the value books in the ``value_seen`` table have them), whatever Faust committed. The mark is
written to the same table, on the partition's own changelog partition. A worker that takes the
partition over reads the partition again from the mark, and so does a worker whose mark lags far
behind what it processes (Faust drops a record read again below the newest offset it delivered,
so the read again after a rebalance can lose records for good): the signals read again are
dropped as duplicates by their producer and seq
(:meth:`headroom.controllers.app.Controller.count_value`), and those never processed are counted.

Pure: no Kafka, no clock.
"""

from __future__ import annotations

__all__ = ["MAX_SEQ_GAPS", "ReadMarks", "covers", "mark_key", "merge_seqs", "take_seq"]

MARK_PREFIX = "@read-mark/"
MAX_SEQ_GAPS = 4096  # seqs below the newest not seen yet, kept per producer (the oldest dropped)


def take_seq(newest: int, gaps: list[int], seq: int) -> int | None:
    """One producer's seqs seen so far are those up to ``newest`` except ``gaps``: take ``seq``
    once. Returns the new newest when ``seq`` was not seen yet (``gaps`` updated in place), None
    for one seen before. A seq may come after a later one (a partition read again): below the
    newest it is new only if it is one of the gaps."""
    if seq > newest:
        gaps.extend(range(newest + 1, seq))
        del gaps[:-MAX_SEQ_GAPS]
        return seq
    if seq in gaps:
        gaps.remove(seq)
        return newest
    return None


def covers(newest: int, gaps: list[int], seq: int) -> bool:
    """Whether ``seq`` was seen (:func:`take_seq`'s sets)."""
    return seq <= newest and seq not in gaps


def merge_seqs(a: tuple[int, list[int]], b: tuple[int, list[int]]) -> tuple[int, list[int]]:
    """The seqs seen in either of two sets ``(newest, gaps)``."""
    low, newest = min(a[0], b[0]), max(a[0], b[0])
    above = [g for g in range(low + 1, newest + 1) if not covers(*a, g) and not covers(*b, g)]
    below = sorted(g for g in set(a[1]) & set(b[1]) if g <= low)
    return newest, (below + above)[-MAX_SEQ_GAPS:]


def mark_key(partition: int) -> str:
    """The ``value_seen`` table key of a partition's mark (never a producer id: those are
    ``<name>.<pid>.<hex>``)."""
    return f"{MARK_PREFIX}{int(partition)}"


class ReadMarks:
    """Per partition, the lowest offset not processed yet, from the offsets processed (in any
    order) since the partition's mark was set."""

    def __init__(self) -> None:
        self._low: dict[int, int] = {}
        self._ahead: dict[int, set[int]] = {}  # processed offsets above the mark

    def start(self, partition: int, low: int) -> None:
        """Begin (again) at ``low``: every offset below it is processed."""
        self._low[partition] = int(low)
        self._ahead[partition] = set()

    def known(self, partition: int) -> bool:
        return partition in self._low

    def low(self, partition: int) -> int | None:
        return self._low.get(partition)

    def has(self, partition: int, offset: int) -> bool:
        """Whether ``offset`` of ``partition`` was processed (below the mark, or above it)."""
        low = self._low.get(partition)
        return low is not None and (offset < low or offset in self._ahead[partition])

    def lag(self, partition: int) -> int:
        """How many offsets above the mark were processed while it waits for a lower one."""
        return len(self._ahead.get(partition, ()))

    def raise_to(self, partition: int, offset: int) -> None:
        """Nothing below ``offset`` can be processed any more (no longer on the topic)."""
        low = self._low.get(partition)
        if low is None or offset <= low:
            return
        self._ahead[partition] = {o for o in self._ahead[partition] if o >= offset}
        self._low[partition] = offset
        self._advance(partition)

    def processed(self, partition: int, offset: int) -> bool:
        """Record ``offset`` as processed; True when the mark moved. An offset below the mark
        (read again) changes nothing."""
        low = self._low.get(partition)
        if low is None:
            self.start(partition, offset + 1)
            return True
        if offset < low:
            return False
        self._ahead[partition].add(int(offset))
        return self._advance(partition)

    def _advance(self, partition: int) -> bool:
        low, ahead = self._low[partition], self._ahead[partition]
        moved = False
        while low in ahead:
            ahead.discard(low)
            low += 1
            moved = True
        self._low[partition] = low
        return moved

    def forget(self, partitions: set[int]) -> None:
        """The partitions moved away: their marks are the table's from now on."""
        for p in partitions:
            self._low.pop(p, None)
            self._ahead.pop(p, None)
