"""What rows each rank, worker and epoch of a shardflow pipeline gets, written down once.

This is the executable specification of the row semantics (issue 27): the README's
"Defaults you can rely on" must say what this module says, and tests/test_model.py holds
the engine to it. It imports nothing of shardflow; it is slow and obvious on purpose.

Rows are integers: a source is a list of shards, each a tuple of row ids in file order,
and every op maps id sequences to id sequences. Filters, maps and flat_maps are named
functions of the id (``FILTERS``, ``MAPS``, ``FLAT_MAPS``) so that a test can run the same
function inside the engine; a weighted_sample reads ``weight(id)``, a pack ``length(id)``
(each row a sequence of that many tokens; a pack's id is ``PACK_BASE`` + its first
sequence's).

A reading is divided into parts: ``world_size`` ranks, each read by ``num_workers``
workers; part ``(rank, worker)``. Division, in order of what decides it:

1. **Global ops.** Every op up to the last ``take``/``skip`` (and everything that reads rows
   by index: ``select``, ``shard``, ``train_test_split``, a full ``shuffle``,
   ``weighted_sample``) runs on the whole dataset, in chain order, before the epoch is
   divided. A take/skip counts rows of the whole dataset, never of a part.
2. **Division** of that epoch sequence ``G`` (length ``T``) among ranks and workers:
   contiguous runs (:func:`contiguous`), or, when a filter, flat_map, buffered shuffle,
   concatenate or interleave comes before the last take/skip, round-robin
   (:func:`dealt`); a concatenate/interleave read without any take/skip/index op is
   divided part by part (:func:`combined_parts`), a combination nested in it being one
   dataset there (:func:`nested`). Records skipped as unreadable keep their places
   (:func:`skipping`).
3. **Per-part ops.** The ops after that (map, filter, flat_map, a buffered shuffle, the
   loader's own ``shuffle=True``) run on each part's rows, padding included.
4. **Batching** (:func:`batches`): each part's rows cut into batches; ``drop_last`` drops a
   short last batch of each part. A torch ``DataLoader`` over the adapter yields its
   workers' batches round-robin (:func:`torch_batches`).

**Epochs.** A split is fixed: every op before the last pick (``take``, ``skip``,
``select``, ``shard``, ``train_test_split``, ``weighted_sample``), the order of a combined
dataset's parts and an interleave's draws among them, draws as in epoch 0
(:func:`draw_epoch`). Ops at or after the last pick draw anew each epoch.

**Chance.** The model cannot know the engine's random draws. Where a seeded op's draw is
global (a full shuffle, a weighted_sample, a buffered shuffle before a take/skip, an
interleave with probabilities read as one stream), the model asks an ``observe``
callback for what the engine drew (the rows of that dataset prefix, read as one part, in
the epoch the model says the op draws for), checks the draw is one the op may make
(:func:`check_draw`), and goes on exactly from it. Where chance decides rows per part (a
buffered shuffle after the split, ``DataLoader(shuffle=True)``, an interleave with
probabilities mixing each part's own shares), :func:`parts` raises :class:`NotExact` and
:func:`invariants` says what must hold whatever the draws.

**What a seed determines.** A draw is a function of the seed, the epoch it draws for
(:func:`draw_epoch`) and the rows it draws from, and of nothing else: not the process,
the thread count, or the division among ranks and workers (each part's rows are cut from
the one draw that one part reading the whole epoch sees). Another epoch (where the draw
is new each epoch) or another seed gives another draw, but by chance (for a shuffle of
``n`` rows, once in ``n!``). tests/test_model.py holds the engine to each.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

# ---------------------------------------------------------------------------------------
# The functions ops apply, by name (the engine runs the same ones on each row's id).

FILTERS: dict[str, Callable[[int], bool]] = {
    "even": lambda i: i % 2 == 0,
    "not_div3": lambda i: i % 3 != 0,
    "low": lambda i: i % 10 < 7,
    "none": lambda i: False,
}

#: A flat_map's output ids live above every source id (sources use ids below FAN_BASE),
#: so rows stay unique: row ``i`` becomes ``i % 3`` rows (0, 1 or 2), or exactly one.
FAN_BASE = 10_000
FLAT_MAPS: dict[str, Callable[[int], list[int]]] = {
    "fan": lambda i: [FAN_BASE + 3 * i + j for j in range(i % 3)],
    "one": lambda i: [FAN_BASE + 3 * i],
}

#: A map keeps rows and ids (the engine's map adds a column, ``twice = 2 * id``).
MAPS: dict[str, Callable[[int], int]] = {"twice": lambda i: i}

#: A packed row's id: PACK_BASE + the id of its first (longest) sequence, above every
#: source and flat_map id (sources below FAN_BASE, flat_maps of them below 4 * FAN_BASE).
PACK_BASE = 1_000_000


def length(i: int) -> int:
    """How many tokens row ``i`` is, to :class:`Pack` (the engine's ``input_ids``: ``i``,
    that many times)."""
    return 1 + i % 5


def weight(i: int) -> float:
    """A row's weight for ``weighted_sample``: a third of the rows may never be drawn."""
    return 0.0 if i % 3 == 0 else float(i % 4 + 1)


# ---------------------------------------------------------------------------------------
# Ops and datasets: plain, hashable data.


@dataclass(frozen=True)
class Take:
    n: int


@dataclass(frozen=True)
class Skip:
    n: int


@dataclass(frozen=True)
class Select:
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Shard:
    """HF's ``shard(num_shards, index, contiguous=True)``: consecutive rows, the first
    ``len % num_shards`` shards one row longer."""

    num_shards: int
    index: int


@dataclass(frozen=True)
class TrainTestSplit:
    """HF's ``train_test_split(test_size, shuffle=False)[split]``: a float size is a
    fraction (test rounds up, as HF's), an int a row count; train is the first
    ``n - test`` rows, test the ``test`` rows after them."""

    test_size: int | float
    split: str  # "train" | "test"


@dataclass(frozen=True)
class Shuffle:
    """``buffer_size=None``: a full permutation (needs random access); else a buffer."""

    seed: int
    buffer_size: int | None = None


@dataclass(frozen=True)
class Filter:
    name: str


@dataclass(frozen=True)
class Map:
    name: str = "twice"


@dataclass(frozen=True)
class FlatMap:
    name: str


@dataclass(frozen=True)
class Pack:
    """``pack(seq_length, "bfd", buffer_rows=window)``: each run of ``window`` rows (of
    :func:`length` tokens each) packed best fit decreasing, as TRL's ``pack_dataset``
    packs a map batch (:func:`best_fit`); a pack's id is ``PACK_BASE`` + its first
    sequence's. It keeps every row's tokens once (``seq_length`` is at least every
    length: nothing truncated) and orders the packs as they were opened; like a
    flat_map it decides the number of rows, so it is run where a flat_map is."""

    seq_length: int
    window: int


@dataclass(frozen=True)
class WeightedSample:
    """``weighted_sample(weights, num_samples, seed=...)`` with replacement, the weights
    being ``weight(id)`` of each row."""

    num_samples: int
    seed: int = 0


Op = Union[Take, Skip, Select, Shard, TrainTestSplit, Shuffle, Filter, Map, FlatMap, Pack, WeightedSample]

#: Ops after which a row's number in the stream tells nothing of the rows before it.
REMAKES = (FlatMap, Pack)

#: Ops that pick rows by their position: everything before the last one draws as in epoch 0.
PICKS = (Take, Skip, Select, Shard, TrainTestSplit, WeightedSample)


def reads_by_index(op: Op) -> bool:
    """Ops that address rows by index (``select`` and what is built on it, a full
    shuffle, a weighted draw): the rows before them are one global, indexed list."""
    return isinstance(op, (Select, Shard, TrainTestSplit, WeightedSample)) or (
        isinstance(op, Shuffle) and op.buffer_size is None
    )


@dataclass(frozen=True)
class Source:
    """A plain dataset: its shards as listed (sorted), each a tuple of row ids. ``skip``:
    read with ``on_error="skip"``, ``bad`` the ids whose records cannot be decoded (see
    :func:`skipping`)."""

    shards: tuple[tuple[int, ...], ...]
    ops: tuple[Op, ...] = ()
    skip: bool = False
    bad: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Concatenate:
    parts: tuple[Dataset, ...]
    ops: tuple[Op, ...] = ()


@dataclass(frozen=True)
class Interleave:
    parts: tuple[Dataset, ...]
    probabilities: tuple[float, ...] | None = None
    seed: int = 0
    stopping: str = "first_exhausted"
    ops: tuple[Op, ...] = ()


Dataset = Union[Source, Concatenate, Interleave]
STOPPING = ("first_exhausted", "all_exhausted", "all_exhausted_without_replacement")

#: The buffer of ``DataLoader(shuffle=True)`` (its size does not change any rule here).
LOADER_BUFFER = 1 << 14


def then(ds: Dataset, op: Op) -> Dataset:
    return replace(ds, ops=ds.ops + (op,))


def prefix(ds: Dataset, n: int) -> Dataset:
    """``ds`` with only its first ``n`` ops."""
    return replace(ds, ops=ds.ops[:n])


def as_loaded(ds: Dataset, shuffle: bool = False, seed: int = 0) -> Dataset:
    """The dataset a ``DataLoader(ds, shuffle=..., seed=...)`` reads: its shuffle is a
    buffered shuffle after every op of the chain (so it is never before a split)."""
    return then(ds, Shuffle(seed, LOADER_BUFFER)) if shuffle else ds


def addressable(ds: Dataset) -> bool:
    """Whether rows can be read by index: what ``select``, ``shard``,
    ``train_test_split``, ``weighted_sample`` and a full shuffle need (a full shuffle of
    a dataset without it is a buffered one). A filter keeps it (random access runs the
    filter once over the rows, as ``datasets`` does); an interleave, a flat_map or a
    buffered shuffle ends it."""
    if isinstance(ds, Interleave):
        origin = False
    elif isinstance(ds, Concatenate):
        origin = all(addressable(p) for p in ds.parts)
    else:
        origin = True
    return origin and all(
        isinstance(op, (Take, Skip, Map, Filter)) or reads_by_index(op) for op in ds.ops
    )


def plan_known(ds: Dataset) -> bool:
    """Whether a division knows the dataset's rows before reading them: no filter or
    flat_map after its rows are addressed by index decides them (one before a select is
    run once over the rows, or read into memory), here or in a part. A combination of
    datasets it does not know cannot be cut into shares that come out equal."""
    indexed = [i for i, op in enumerate(ds.ops) if reads_by_index(op)]
    if any(isinstance(op, (Filter, *REMAKES)) for op in ds.ops[indexed[-1] + 1 if indexed else 0 :]):
        return False
    return bool(indexed) or isinstance(ds, Source) or all(plan_known(p) for p in ds.parts)


def nested(ds: Dataset) -> bool:
    """Whether a part of a combination is itself a combination read as it is (no op
    that reads its rows by index, which would read them once, as a list). Such a part is
    one dataset to the combination holding it: read as a single reader reads it (a
    nested interleave is mixed once, not by each reader from its own shares) and cut
    like any other part, so its rows do not depend on the division."""
    return not isinstance(ds, Source) and not any(reads_by_index(op) for op in ds.ops)


def remixes(ds: Dataset, stopping: str = "first_exhausted") -> bool:
    """Whether the rest of an epoch would be mixed anew from the rows left by an
    interleave of this stopping strategy, here or in a part, read as a stream. Where a
    first_exhausted mix ends depends on every row it draws from, so an epoch of it
    resumes only on the division that saved it; an all_exhausted mix of the rows left
    delivers each of them, repeating some."""
    if isinstance(ds, Source) or any(reads_by_index(op) for op in ds.ops):
        return False
    here = isinstance(ds, Interleave) and ds.stopping == stopping
    return here or any(remixes(p, stopping) for p in ds.parts)


def skipping(ds: Source, div: Division | None = None) -> tuple[Source, str]:
    """Where records skipped as unreadable (``on_error="skip"``, ids ``ds.bad``) leave
    the rows: a skipped record has no row, but keeps its place. Where the division cuts
    record positions (:func:`anatomy` "contiguous": the global take/skip count records,
    a part's share is a run of records, padding included), each part delivers its share
    less the skipped records ("in place": ranks can differ by the records they skip).
    Where every part reads the stream ("dealt"), the stream never holds them: the ops
    count the rows decoded ("before"). Returns the dataset with its records all readable
    and which of the two."""
    readable = replace(ds, skip=False, bad=frozenset())
    return readable, ("before" if anatomy(ds, div).how == "dealt" else "in place")


def skips(ds: Source, div: Division, epoch: int = 0) -> dict[tuple[int, int], int] | None:
    """How many records each part counts as skipped where they are skipped in place
    (:func:`skipping`): those of its share, padding included, so each once across the
    parts but for padding. ``None`` where every part reads the stream (each counts what
    it read)."""
    readable, where = skipping(ds, div)
    if where == "before":
        return None
    whole = contiguous(rows(prefix(readable, anatomy(ds, div).global_ops), epoch), div)
    return {key: sum(i in ds.bad for i in part) for key, part in whole.items()}


def seeded(ds: Dataset) -> bool:
    """Whether any draw of chance decides the rows (a shuffle, a weighted draw, an
    interleave with probabilities), here or in a part."""
    here = any(isinstance(op, (Shuffle, WeightedSample)) for op in ds.ops)
    if isinstance(ds, Source):
        return here
    mixed = isinstance(ds, Interleave) and ds.probabilities is not None
    return here or mixed or any(seeded(p) for p in ds.parts)


# ---------------------------------------------------------------------------------------
# Errors the model raises.


class NotExact(Exception):
    """Chance decides which rows a part gets, or their order: see :func:`invariants`."""


class Refused(Exception):
    """The engine must refuse this reading with a clear error (``ValueError`` or a
    ``ShardflowError``), not deliver rows, for the reason ``why`` names: one of
    :data:`REFUSALS`, whose pattern the engine's message must match."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why
        self.match = REFUSALS[why]


#: Why the engine refuses a reading, and what its message says (a regular expression):
#: the model states the reason, the tests hold the engine to saying it.
REFUSALS: dict[str, str] = {
    "empty split": r"with \d+ rows these sizes leave the \w+ split empty",
    "select out of range": r"select: index \d+ is out of range for \d+ rows",
    "interleave built": r"dataset \d+ (is empty|has probability 0)",
    "too few rows for the readers": r"interleave: dataset \d+ has \d+ rows, too few to give each of the \d+ readers",
}


class Violation(AssertionError):
    """What the engine did breaks a rule of the model."""


#: What the engine drew for a seeded op: the rows of this dataset read as one part
#: (world_size=1, one worker, no padding) in this epoch.
Observe = Callable[[Dataset, int], list[int]]


# ---------------------------------------------------------------------------------------
# Epochs: splits are fixed.


def last_pick(ops: Sequence[Op]) -> int | None:
    picks = [i for i, op in enumerate(ops) if isinstance(op, PICKS)]
    return picks[-1] if picks else None


def draw_epoch(ops: Sequence[Op], stage: int, epoch: int) -> int:
    """The epoch the op at ``stage`` draws for in epoch ``epoch``: ops before the last
    pick draw as in epoch 0, so ``shuffle(seed=0).take(n)`` selects the same rows in
    every epoch (and ``skip(n)`` its exact complement); a weighted_sample reads its
    weights through an order that does not move. The last pick itself and the ops after
    it draw anew each epoch: ``DataLoader(ds.shuffle(0))`` reshuffles every epoch."""
    last = last_pick(ops)
    return 0 if last is not None and stage < last else epoch


def origin_epoch(ds: Dataset, epoch: int) -> int:
    """The epoch of what a dataset's ops start from (a combined dataset's parts, an
    interleave's draws): epoch 0 when any pick follows, as for the ops before it."""
    return 0 if last_pick(ds.ops) is not None else epoch


# ---------------------------------------------------------------------------------------
# One reader: the whole dataset, in order.


def shard_range(n: int, num_shards: int, index: int) -> range:
    each, extra = divmod(n, num_shards)
    start = each * index + min(index, extra)
    return range(start, start + each + (1 if index < extra else 0))


def split_range(n: int, op: TrainTestSplit) -> range:
    size = op.test_size
    test = math.ceil(size * n) if isinstance(size, float) else size
    if not 0 < test < n:
        raise Refused("empty split", f"train_test_split(test_size={size}) of {n} rows")
    train = n - test
    return range(0, train) if op.split == "train" else range(train, n)


def check_draw(op: Op, before: list[int], drawn: list[int]) -> None:
    """What a seeded op may draw from ``before``: a shuffle reorders the rows (each
    exactly once); a weighted_sample draws ``num_samples`` rows, never a zero-weight one."""
    if isinstance(op, Shuffle):
        if Counter(drawn) != Counter(before):
            raise Violation(f"{op} is not a reordering of its {len(before)} rows: {drawn} from {before}")
    elif isinstance(op, WeightedSample):
        allowed = {i for i in before if weight(i) > 0}
        if len(drawn) != op.num_samples or not set(drawn) <= allowed:
            raise Violation(f"{op} drew {drawn}; allowed: {sorted(allowed)}")


def apply(op: Op, rows: list[int]) -> list[int]:
    """A deterministic op on the whole sequence."""
    if isinstance(op, Take):
        return rows[: op.n]
    if isinstance(op, Skip):
        return rows[op.n :]
    if isinstance(op, Select):
        if any(i >= len(rows) for i in op.indices):
            raise Refused("select out of range", f"an index past {len(rows)} rows")
        return [rows[i] for i in op.indices]
    if isinstance(op, Shard):
        return [rows[i] for i in shard_range(len(rows), op.num_shards, op.index)]
    if isinstance(op, TrainTestSplit):
        return [rows[i] for i in split_range(len(rows), op)]
    return per_row(op, rows)


def per_row(op: Op, rows: list[int]) -> list[int]:
    """An op that a part can run on its own rows: one row at a time, or (a pack) one
    window of its rows at a time."""
    if isinstance(op, Filter):
        return [i for i in rows if FILTERS[op.name](i)]
    if isinstance(op, Map):
        return [MAPS[op.name](i) for i in rows]
    if isinstance(op, FlatMap):
        return [j for i in rows for j in FLAT_MAPS[op.name](i)]
    if isinstance(op, Pack):
        out = []
        for start in range(0, len(rows), op.window):
            window = rows[start : start + op.window]
            out += [PACK_BASE + window[pack[0]] for pack in best_fit([length(i) for i in window], op.seq_length)]
        return out
    raise TypeError(f"{op} is not a row-by-row op")


def best_fit(lengths: list[int], seq_length: int) -> list[list[int]]:
    """TRL's best fit decreasing (``_pack_bfd``): the sequences (indices into
    ``lengths``) longest first, ties in their order; each goes to the pack with the least
    room it fits in, the first to have been left with that room among several, or opens
    a new pack. The packs in the order they were opened."""
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])
    packs: list[list[int]] = []
    room: list[int] = []
    with_room: dict[int, list[int]] = {}
    for k in order:
        fits = sorted(r for r, waiting in with_room.items() if r >= lengths[k] and waiting)
        if fits:
            p = with_room[fits[0]].pop(0)
        else:
            packs.append([])
            room.append(seq_length)
            p = len(packs) - 1
        packs[p].append(k)
        room[p] -= lengths[k]
        if room[p] > 0:
            with_room.setdefault(room[p], []).append(p)
    return packs


def rows(ds: Dataset, epoch: int = 0, observe: Observe | None = None) -> list[int]:
    """The dataset's rows in epoch ``epoch`` as one reader gets them (world_size=1, one
    worker): shards in the order listed, rows in file order, parts of a concatenation
    one after another, an interleave mixed from its parts' whole rows, then every op in
    chain order, each drawing for :func:`draw_epoch`."""
    if isinstance(ds, Source) and ds.skip:
        return parts(ds, Division(), epoch, observe)[(0, 0)]
    out = origin_rows(ds, origin_epoch(ds, epoch), observe)
    for stage, op in enumerate(ds.ops):
        if isinstance(op, (Shuffle, WeightedSample)):
            if observe is None:
                raise NotExact(f"{op} draws by chance; pass observe=")
            drawn = observe(prefix(ds, stage + 1), draw_epoch(ds.ops, stage, epoch))
            check_draw(op, out, drawn)
            out = drawn
        else:
            out = apply(op, out)
    return out


def size(ds: Dataset) -> int | None:
    """How many rows one reader gets, where neither chance nor a flat_map decides it
    (what ``len(ds)`` says: after a filter, what the filter keeps, where the rows before
    it can be addressed)."""
    if isinstance(ds, Source):
        n: int | None = sum(len(s) for s in ds.shards)
    else:
        sizes = [size(p) for p in ds.parts]
        if any(s is None for s in sizes):
            n = None
        elif isinstance(ds, Concatenate):
            n = sum(s for s in sizes if s is not None)
        elif ds.probabilities is not None:
            n = None
        else:
            try:
                n = len(origin_rows(replace(ds, parts=tuple(Source((tuple(range(s or 0)),)) for s in sizes)), 0, None))
            except Refused:
                n = None
    for stage, op in enumerate(ds.ops):
        if n is None:
            return None
        if isinstance(op, Filter):
            through = prefix(ds, stage + 1)
            try:
                n = len(rows(through)) if addressable(through) else None
            except (NotExact, Refused):
                n = None
            continue
        if isinstance(op, Take):
            n = min(n, op.n)
        elif isinstance(op, Skip):
            n = max(0, n - op.n)
        elif isinstance(op, Select):
            n = len(op.indices)
        elif isinstance(op, Shard):
            n = len(shard_range(n, op.num_shards, op.index))
        elif isinstance(op, TrainTestSplit):
            n = len(split_range(n, op))
        elif isinstance(op, WeightedSample):
            n = op.num_samples
        elif isinstance(op, REMAKES):
            n = None
    return n


def origin_rows(ds: Dataset, epoch: int, observe: Observe | None) -> list[int]:
    if isinstance(ds, Source):
        return [i for shard in ds.shards for i in shard]
    sources = [rows(p, epoch, observe) for p in ds.parts]
    if isinstance(ds, Concatenate):
        return [i for part in sources for i in part]
    if (why := construction_error(ds, [len(s) for s in sources])) is not None:
        raise Refused("interleave built", why)
    if ds.probabilities is None:
        return round_robin(sources, ds.stopping)
    if observe is None:
        raise NotExact("an interleave with probabilities draws by chance; pass observe=")
    drawn = observe(replace(ds, ops=()), epoch)
    check_mix(ds, sources, drawn)
    return drawn


# ---------------------------------------------------------------------------------------
# Mixing (interleave).


def drawable(ds: Interleave) -> list[bool]:
    """Which parts can be drawn: all of them in turn, or those of positive probability."""
    if ds.probabilities is None:
        return [True] * len(ds.parts)
    return [p > 0 for p in ds.probabilities]


def construction_error(ds: Interleave, sizes: list[int]) -> str | None:
    """Why ``interleave`` refuses these parts when it is built (as HF does): under the
    all_exhausted strategies an empty part or a zero probability could never run out."""
    if ds.stopping == "first_exhausted":
        return None
    for i, n in enumerate(sizes):
        if n == 0:
            return f"dataset {i} is empty"
        if ds.probabilities is not None and ds.probabilities[i] == 0:
            return f"dataset {i} has probability 0"
    return None


def round_robin(shares: Sequence[Sequence[int]], stopping: str, *, length: int | None = None) -> list[int]:
    """THE round-robin rule (``probabilities=None``), in one place: the sequence of HF's
    ``IterableDataset`` interleave. One row from each part in turn:

    - ``first_exhausted``: the mix ends on the row that runs out a part
      (``[a0 a1 a2]`` and ``[b0]`` give ``a0 b0``), or at the turn of a part that has no
      rows;
    - ``all_exhausted``: a part that runs out starts over from its first row, and the mix
      ends on the row that completes the last part's first pass (``a0 b0 a1 b0 a2``); a
      part with no rows at all is left out of the turns;
    - ``all_exhausted_without_replacement``: a part that runs out is no longer drawn;
      every row exactly once (``a0 b0 a1 a2``).

    ``length`` (all_exhausted only) continues the mix, parts restarting as they run out,
    to exactly that many rows."""
    parts = len(shares)
    pos = [0] * parts
    out: list[int] = []
    if stopping == "first_exhausted":
        for i in itertools.cycle(range(parts)) if parts else ():
            if pos[i] == len(shares[i]):
                return out
            out.append(shares[i][pos[i]])
            pos[i] += 1
            if pos[i] == len(shares[i]):
                return out
        return out
    if stopping == "all_exhausted_without_replacement":
        live = [len(s) > 0 for s in shares]
        turn = 0
        while any(live):
            i, turn = turn % parts, turn + 1
            if live[i]:
                out.append(shares[i][pos[i]])
                pos[i] += 1
                live[i] = pos[i] < len(shares[i])
        return out
    turns = [i for i in range(parts) if shares[i]]
    done: set[int] = set()
    for i in itertools.cycle(turns) if turns else ():
        if length is None and len(done) == len(turns):
            break
        if length is not None and len(out) >= length:
            break
        out.append(shares[i][pos[i]])
        pos[i] += 1
        if pos[i] == len(shares[i]):
            pos[i] = 0
            done.add(i)
    return out


def check_mix(ds: Interleave, sources: list[list[int]], drawn: list[int]) -> None:
    """What a mix with probabilities may draw, read as one part: each part's rows in
    its own order (starting over under all_exhausted), never a zero-probability part's;
    first_exhausted stops when a drawn part has run out (so some part ran out), the
    all_exhausted strategies run every part out (without replacement: exactly once)."""
    can = drawable(ds)
    owner = {i: k for k, part in enumerate(sources) for i in part}
    if any(i not in owner or not can[owner[i]] for i in drawn):
        raise Violation(f"{ds.stopping} mix drew a row of no drawable part: {drawn}")
    for k, part in enumerate(sources):
        got = [i for i in drawn if owner[i] == k]
        cyclic = ds.stopping == "all_exhausted"
        expected = [part[j % len(part)] for j in range(len(got))] if part and cyclic else part[: len(got)]
        if got != expected:
            raise Violation(f"part {k}'s rows out of order in the mix: {got}")
        if ds.stopping != "first_exhausted" and can[k] and len(got) < len(part):
            raise Violation(f"{ds.stopping}: part {k} not run out ({len(got)} of {len(part)} rows)")
    if ds.stopping == "all_exhausted_without_replacement" and Counter(drawn) != Counter(
        i for k, part in enumerate(sources) if can[k] for i in part
    ):
        raise Violation("without replacement every row comes exactly once")
    # Where the mix ends: on the row that runs out the first part (first_exhausted), or
    # that completes the last part's first pass (all_exhausted).
    if ds.stopping != "all_exhausted_without_replacement" and drawn:
        used: Counter[int] = Counter()
        done_at = []
        for at, i in enumerate(drawn):
            used[owner[i]] += 1
            done = [can[k] and bool(part) and used[k] >= len(part) for k, part in enumerate(sources)]
            if any(done) if ds.stopping == "first_exhausted" else all(d or not can[k] for k, d in enumerate(done)):
                done_at.append(at)
        # (first_exhausted also ends at the first draw of a dataset with no rows.)
        empty = ds.stopping == "first_exhausted" and any(c and not p for c, p in zip(can, sources))
        if (done_at and done_at[0] != len(drawn) - 1) or (not done_at and not empty):
            raise Violation(f"{ds.stopping} mix does not end where a part runs out: {drawn}")


# ---------------------------------------------------------------------------------------
# Division among ranks and workers.


@dataclass(frozen=True)
class Division:
    """How a reading is divided: ``world_size`` ranks of ``num_workers`` workers.
    ``pad=None`` is the default: on with several ranks and without drop_last (as
    ``DistributedSampler(drop_last=False)``); it never pads between workers."""

    world_size: int = 1
    num_workers: int = 1
    drop_last: bool = False
    pad: bool | None = None

    @property
    def padded(self) -> bool:
        pad = self.world_size > 1 if self.pad is None else self.pad
        return pad and not self.drop_last

    def keys(self) -> list[tuple[int, int]]:
        return [(r, w) for r in range(self.world_size) for w in range(self.num_workers)]


def cut(n: int, pieces: int, rotation: int = 0) -> list[int]:
    """``n`` rows cut into ``pieces`` runs: each ``n // pieces`` rows, and the ``n % pieces``
    left over one each to the pieces from ``rotation`` on, cyclically."""
    each, extra = divmod(n, pieces)
    return [each + (1 if (j - rotation) % pieces < extra else 0) for j in range(pieces)]


def runs(items: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """``items`` cut into consecutive runs of these sizes."""
    out, at = [], 0
    for n in sizes:
        out.append(list(items[at : at + n]))
        at += n
    return out


def cycled(items: Sequence[int], n: int) -> list[int]:
    """The first ``n`` items of ``items`` repeated (wrapping around when it is short)."""
    return [items[j % len(items)] for j in range(n)] if items else []


def contiguous(epoch: Sequence[int], div: Division) -> dict[tuple[int, int], list[int]]:
    """The epoch's rows in contiguous runs. With ``T`` rows and ``R`` ranks,
    ``q, rem = divmod(T, R)``: rank ``k`` gets ``q + (1 if k < rem else 0)`` rows, ranks in
    order; with drop_last every rank gets ``q`` (rank ``k``: rows ``[k*q, (k+1)*q)``, the
    last ``rem`` rows dropped); padded, a rank short of ``ceil(T/R)`` rows gets the epoch's
    first rows again at its end (at most one row when ``T >= R``). The rank's list (its
    share, then its padding) is then cut between its workers the same way, in order,
    never padded or trimmed: worker ``j`` of ``n`` rows gets ``n // W + (1 if j < n % W)``."""
    R, W, T = div.world_size, div.num_workers, len(epoch)
    q = T // R
    out = {}
    for k, rank_rows in enumerate(runs(epoch, [q] * R if div.drop_last else cut(T, R))):
        if div.padded:
            rank_rows = rank_rows + cycled(epoch, math.ceil(T / R) - len(rank_rows))
        for w, part in enumerate(runs(rank_rows, cut(len(rank_rows), W))):
            out[(k, w)] = part
    return out


def dealt(stream: Sequence[int], div: Division) -> dict[tuple[int, int], list[int]]:
    """Round-robin: what follows a filter, flat_map, buffered shuffle, concatenate or
    interleave before a take/skip (every part reads the stream up to the last take/skip
    and keeps its own rows). Row ``j`` goes to rank ``j % R``; a rank's ``k``-th row to
    worker ``k % W``. With drop_last only the first ``R * (T // R)`` rows are dealt;
    padded, a rank short of ``ceil(T/R)`` rows gets the stream's first row once more, at
    its end (so to the worker whose turn it is)."""
    R, W, T = div.world_size, div.num_workers, len(stream)
    if div.drop_last:
        stream = stream[: R * (T // R)]
    out = {}
    for k in range(R):
        rank_rows = list(stream[k::R])
        if div.padded:
            rank_rows += cycled(stream, math.ceil(T / R) - len(rank_rows))
        for w in range(W):
            out[(k, w)] = rank_rows[w::W]
    return out


def shares(sizes: Sequence[int], div: Division) -> dict[tuple[int, int], list[range]]:
    """Each part's share of each dataset of a concatenate/interleave (as index ranges into
    that dataset's rows). Dataset ``i`` of ``n_i`` rows is cut among ranks on its own,
    contiguous, ranks in order, its left-over rows going to the ranks from
    ``r_i = (n_0 + ... + n_{i-1}) % R`` on; a rank's rows of dataset ``i`` are cut among
    its workers likewise, from ``w_i = (c_0 + ... + c_{i-1}) % W`` on (``c_j``: the rank's
    rows of dataset ``j``). So across the datasets rank ``k`` gets ``T // R + (1 if k <
    T % R)`` rows and its workers a cut of that, as if it were one dataset."""
    R, W = div.world_size, div.num_workers
    out: dict[tuple[int, int], list[range]] = {key: [] for key in div.keys()}
    before = 0
    rank_before = [0] * R
    for n in sizes:
        start = 0
        for k, c in enumerate(cut(n, R, before % R)):
            at = start
            for w, m in enumerate(cut(c, W, rank_before[k] % W)):
                out[(k, w)].append(range(at, at + m))
                at += m
            start += c
            rank_before[k] += c
        before += n
    return out


def balanced(
    part: list[int], key: tuple[int, int], total: int, rank_rows: int, first: Sequence[int], div: Division
) -> list[int]:
    """A combined dataset's part brought to its target, so that padding is at most one
    row per rank and drop_last drops fewer than ``world_size`` rows in all: the rank's
    target is ``T // R`` with drop_last, ``ceil(T/R)`` padded, else its own rows; a
    worker's is its cut of it. A worker above its target drops its last rows; one below
    gets the first rows of the whole concatenation (``first``) appended."""
    R, W = div.world_size, div.num_workers
    t = total // R if div.drop_last else math.ceil(total / R) if div.padded else rank_rows
    target = cut(t, W)[key[1]]
    if len(part) >= target:
        return part[:target]
    return part + cycled(first, target - len(part))


def starved(ds: Interleave, cuts: dict[tuple[int, int], list[range]]) -> None:
    """Refuses a first_exhausted mix divided among several parts in which some part has
    no rows of a dataset it can draw from (fewer rows than parts, or none at all): that
    part's mix would end at once, and cutting every part to it would silently stop every
    rank. (Read as one part, such a mix just ends at that dataset's first turn.)"""
    can = drawable(ds)
    if len(cuts) > 1 and ds.stopping == "first_exhausted" and any(
        can[i] and len(r) == 0 for parts_cuts in cuts.values() for i, r in enumerate(parts_cuts)
    ):
        raise Refused("too few rows for the readers", "first_exhausted: a part has no rows of a dataset it must draw from")


def stranded(own: dict[tuple[int, int], list[list[int]]]) -> None:
    """Refuses an all_exhausted mix in which some part has no rows at all (of the
    datasets it can draw from) while others have: it could not be carried on to the
    longest mix. (A dataset a part has no rows of is only left out of its turns.)"""
    if any(not any(s) for s in own.values()) and any(any(s) for s in own.values()):
        raise Refused("too few rows for the readers", "all_exhausted: a part has no rows at all, so it cannot carry on")


def combined_parts(
    ds: Concatenate | Interleave, div: Division, epoch: int, observe: Observe | None
) -> dict[tuple[int, int], list[int]]:
    """A concatenate or interleave read as it is (no take/skip or index op after it).

    concatenate: each part reads its share (:func:`shares`) of dataset 0, then of
    dataset 1, ..., then is :func:`balanced`. A :func:`nested` dataset is one dataset
    here: its rows as one part reads them, cut like any other's.

    interleave: each part mixes its own shares. Round-robin parts are brought to one
    length, so every rank takes as many steps: ``first_exhausted`` cuts every part's mix
    to the shortest natural mix of all parts (see :func:`starved`); ``all_exhausted``
    continues every part's mix (datasets starting over as they run out) to the longest
    (see :func:`stranded`); without replacement every row comes once and parts are
    :func:`balanced` as for a concatenation.

    Where a part's rows are not known to the division (:func:`plan_known`; on a division
    that does not equalize its ranks, or :func:`anatomy` deals them), each part is
    divided as if read alone, without padding (:func:`unplanned_shares`), and nothing
    brings the parts' mixes to one length."""
    if not all(plan_known(p) for p in ds.parts):
        own = unplanned_shares(ds, div, epoch, observe)
        if isinstance(ds, Concatenate):
            return {key: [i for s in own[key] for i in s] for key in own}
        if ds.probabilities is not None:
            raise NotExact("each part draws its own mix by chance")
        return {key: round_robin(own[key], ds.stopping) for key in own}
    e = origin_epoch(ds, epoch)
    sources = [rows(p, e, observe) for p in ds.parts]
    sizes = [len(s) for s in sources]
    total = sum(sizes)
    first = [i for s in sources for i in s]
    cuts = shares(sizes, div)
    own = {key: [[sources[i][j] for j in r] for i, r in enumerate(cuts[key])] for key in cuts}
    rank_rows = {k: sum(len(r) for w in range(div.num_workers) for r in cuts[(k, w)]) for k in range(div.world_size)}
    if isinstance(ds, Concatenate):
        return {
            key: balanced([i for s in own[key] for i in s], key, total, rank_rows[key[0]], first, div) for key in own
        }
    if (why := construction_error(ds, sizes)) is not None:
        raise Refused("interleave built", why)
    starved(ds, cuts)
    if ds.probabilities is not None:
        raise NotExact("each part draws its own mix by chance")
    natural = {key: round_robin(own[key], ds.stopping) for key in own}
    if ds.stopping == "first_exhausted":
        shortest = min(len(m) for m in natural.values())
        return {key: m[:shortest] for key, m in natural.items()}
    if ds.stopping == "all_exhausted":
        stranded(own)
        longest = max(len(m) for m in natural.values())
        return {key: round_robin(own[key], ds.stopping, length=longest) for key in own}
    return {key: balanced(m, key, total, rank_rows[key[0]], first, div) for key, m in natural.items()}


def unplanned_shares(
    ds: Concatenate | Interleave, div: Division, epoch: int, observe: Observe | None
) -> dict[tuple[int, int], list[list[int]]]:
    """Each part's rows of each dataset of a combination whose rows the division does
    not know: every dataset divided as if read alone (contiguous, no padding, nothing
    dropped), its ops run on each part's share; a :func:`nested` combination whose rows
    are known, as one dataset."""
    plain = Division(div.world_size, div.num_workers, drop_last=False, pad=False)
    e = origin_epoch(ds, epoch)
    own: dict[tuple[int, int], list[list[int]]] = {key: [] for key in div.keys()}
    for p in ds.parts:
        if nested(p) and plan_known(p):
            divided = contiguous(rows(p, e, observe), plain)
        else:
            divided = parts(p, plain, e, observe)
        for key in own:
            own[key].append(divided[key])
    return own


# ---------------------------------------------------------------------------------------
# Putting it together.


@dataclass(frozen=True)
class Anatomy:
    """Where a dataset's ops divide: ``ds.ops[:global_ops]`` run on the whole epoch,
    divided by ``how`` ("contiguous", "dealt", "combined" or "kept"); the rest run per
    part. "kept": the filters in ``ds.ops[global_ops:through]`` decide the division (it
    is contiguous over the rows they keep, see :func:`anatomy`)."""

    global_ops: int
    how: str
    through: int = 0

    @property
    def per_part(self) -> int:
        """Where the ops begin that change each part's rows after it is divided."""
        return max(self.global_ops, self.through)


def equalizes(div: Division | None) -> bool:
    """Whether a division gives every rank as many rows (padding or drop_last, on
    several ranks), so that no rank runs out of steps before the others."""
    return div is not None and div.world_size > 1 and (div.padded or div.drop_last)


def anatomy(ds: Dataset, div: Division | None = None) -> Anatomy:
    """Where ``ds`` divides; with ``div``, as that division reads it. A division that
    equalizes its ranks (:func:`equalizes`) cannot let a filter or flat_map after the
    split decide each part's count as it runs: filters over files (a source, or a
    concatenation read by index), after nothing else that changes the rows' number,
    are run once over the epoch and the division is contiguous over the rows they keep
    ("kept"); anything else is dealt round-robin after the last such op ("dealt")."""
    ops = ds.ops
    indexed = [i for i, op in enumerate(ops) if reads_by_index(op)]
    head = indexed[-1] + 1 if indexed else 0
    combined = not isinstance(ds, Source) and not indexed
    counts = [i for i in range(head, len(ops)) if isinstance(ops[i], (Take, Skip))]
    if not counts:
        base = Anatomy(head, "combined" if combined else "contiguous")
    else:
        last = counts[-1]
        in_place = all(isinstance(op, (Take, Skip, Map)) for op in ops[head : last + 1])
        base = Anatomy(last + 1, "contiguous" if in_place and not combined else "dealt")
    changes = [i for i in range(base.global_ops, len(ops)) if isinstance(ops[i], (Filter, *REMAKES))]
    if equalizes(div) and base.how == "combined" and not all(plan_known(p) for p in ds.parts):
        # Shares of parts whose rows are not known cannot come out equal: dealt.
        return Anatomy(changes[-1] + 1 if changes else 0, "dealt")
    if not equalizes(div) or not changes:
        return base
    # (Skipped records have no row for the filters' pass to run on: dealt.)
    files = isinstance(ds, Source) and not ds.skip or isinstance(ds, Concatenate) and all(addressable(p) for p in ds.parts)
    if base.how == "contiguous" and files and all(isinstance(ops[i], Filter) for i in changes):
        return Anatomy(base.global_ops, "kept", changes[-1] + 1)
    return Anatomy(changes[-1] + 1, "dealt")


def parts(
    ds: Dataset, div: Division, epoch: int = 0, observe: Observe | None = None
) -> dict[tuple[int, int], list[int]]:
    """The exact rows of every part ``(rank, worker)`` in epoch ``epoch``, before
    batching. Raises :class:`NotExact` where chance decides them per part,
    :class:`Refused` where the engine must raise."""
    a = anatomy(ds, div)
    if isinstance(ds, Source) and ds.skip:
        readable, where = skipping(ds, div)
        if where == "before":
            good = tuple(tuple(i for i in shard if i not in ds.bad) for shard in ds.shards)
            divided = dealt(rows(prefix(replace(readable, shards=good), a.global_ops), epoch, observe), div)
        else:
            whole = contiguous(rows(prefix(readable, a.global_ops), epoch, observe), div)
            divided = {key: [i for i in part if i not in ds.bad] for key, part in whole.items()}
    elif a.how == "combined":
        assert not isinstance(ds, Source)
        divided = combined_parts(ds, div, epoch, observe)
    elif a.how == "kept":
        # The filters' pass: the epoch's rows they keep, cut contiguously; each part
        # then runs them (and the shuffles between) on its run of the epoch again.
        kept = rows(prefix(ds, a.global_ops), epoch, observe)
        for op in ds.ops[a.global_ops : a.through]:
            if not isinstance(op, Shuffle):
                kept = per_row(op, kept)
        divided = contiguous(kept, div)
        if any(isinstance(op, Shuffle) for op in ds.ops[a.global_ops : a.through]):
            raise NotExact("a shuffle buffer reorders each part's kept rows by chance")
    else:
        epoch_rows = rows(prefix(ds, a.global_ops), epoch, observe)
        divided = (contiguous if a.how == "contiguous" else dealt)(epoch_rows, div)
    for op in ds.ops[a.per_part :]:
        if isinstance(op, Shuffle):
            raise NotExact(f"{op} reorders each part's rows by chance")
        divided = {key: per_row(op, part) for key, part in divided.items()}
    return divided


def batches(rows: Sequence[int], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    """A part's rows in batches of ``batch_size``; drop_last drops a short last batch."""
    out = [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
    if drop_last and out and len(out[-1]) < batch_size:
        out.pop()
    return out


def torch_batches(per_worker: Sequence[list[list[int]]]) -> list[list[int]]:
    """What a torch ``DataLoader(num_workers=W, batch_size=None)`` over the adapter
    yields for one rank: worker 0's first batch, worker 1's first, ..., round-robin
    (torch's in-order delivery), skipping workers that ran out."""
    out = []
    for turn in range(max((len(b) for b in per_worker), default=0)):
        out += [b[turn] for b in per_worker if turn < len(b)]
    return out


def torch_progress(counts: Sequence[int], steps: int) -> list[int]:
    """How many batches each worker has handed out after ``steps`` steps of that
    round-robin, its workers having ``counts`` batches (a worker that has handed out
    all of its batches has finished its pass)."""
    done = [0] * len(counts)
    for turn in range(max(counts, default=0)):
        for w, n in enumerate(counts):
            if turn < n and sum(done) < steps:
                done[w] += 1
    return done


# ---------------------------------------------------------------------------------------
# What holds whatever the draws.


@dataclass
class Invariants:
    """What every part's delivered rows (after batching) must satisfy in one epoch.

    ``rows``: the epoch's rows, each as often as it comes without padding or dropping
    (None when chance decides them); ``padding`` / ``dropped``: exactly how many rows
    padding adds / drop_last and short batches leave out, across all parts (None: at
    most ``padding_max`` / ``dropped_max``); ``support``: every delivered row is one of
    these; ``counts``: rows per part, where chance cannot change them;
    ``equal_counts``: every part delivers as many rows (the number decided by chance);
    ``orders``: per part, for each dataset of an interleave, the rows that part must
    take from it, in order (cyclic: starting over) — it takes a prefix of them;
    ``whole_batches``: every part delivers a multiple of this many rows; ``ends``: an
    interleave's stopping strategy and each part's shares of its datasets, one part of
    which must have run out as the strategy says (see :func:`_mixed`)."""

    rows: Counter | None
    support: set[int]
    padding: int | None = 0
    dropped: int | None = 0
    padding_max: int = 0
    dropped_max: int = 0
    counts: dict[tuple[int, int], int] | None = None
    equal_counts: bool = False
    orders: dict[tuple[int, int], list[tuple[list[int], bool]]] = field(default_factory=dict)
    whole_batches: int | None = None
    ends: tuple[str, dict[tuple[int, int], list[list[int]]]] | None = None
    ends_each: bool = False

    def check(self, delivered: dict[tuple[int, int], list[int]]) -> list[str]:
        """The rules ``delivered`` breaks (empty: none)."""
        problems = []
        everything = Counter(i for part in delivered.values() for i in part)
        if not set(everything) <= self.support:
            problems.append(f"rows outside the data: {sorted(set(everything) - self.support)[:10]}")
        if self.rows is not None:
            extra = sum((everything - self.rows).values())
            missing = sum((self.rows - everything).values())
            if self.padding is not None and extra != self.padding:
                problems.append(f"{extra} rows beyond the epoch's, expected {self.padding} (padding)")
            if self.padding is None and extra > self.padding_max:
                problems.append(f"{extra} rows beyond the epoch's, at most {self.padding_max} (padding)")
            if self.dropped is not None and missing != self.dropped:
                problems.append(f"{missing} of the epoch's rows missing, expected {self.dropped}")
            if self.dropped is None and missing > self.dropped_max:
                problems.append(f"{missing} of the epoch's rows missing, at most {self.dropped_max}")
        if self.counts is not None:
            counts = {key: len(part) for key, part in delivered.items()}
            if counts != self.counts:
                problems.append(f"rows per part {counts}, expected {self.counts}")
        if self.ends is not None:
            stopping, shares = self.ends
            done = {key: [set(share) <= set(delivered[key]) for share in shares[key]] for key in shares}
            if stopping == "first_exhausted":
                ended = [any(d) for d in done.values() if d]
            else:
                ended = [all(d) for d in done.values() if d]
            if self.ends_each and not all(ended):
                problems.append(f"a part's mix did not end as {stopping} says (shares {shares})")
            # A mix with no empty share to end it at once gives every part a row.
            nonempty = all(len(share) > 0 for key_shares in shares.values() for share in key_shares)
            if not self.ends_each and (not any(ended) or nonempty and not all(delivered.values())):
                problems.append(f"no part's mix ended as {stopping} says (shares {shares})")
        if self.whole_batches and any(len(p) % self.whole_batches for p in delivered.values()):
            problems.append(f"a part delivers a short batch: {[len(p) for p in delivered.values()]}")
        if self.equal_counts and len({len(p) for p in delivered.values()}) > 1:
            problems.append(f"parts differ in rows: {[len(p) for p in delivered.values()]}")
        for key, orders in self.orders.items():
            for rows_of, cyclic in orders:
                mine = set(rows_of)
                got = [i for i in delivered[key] if i in mine]
                want = cycled(rows_of, len(got)) if cyclic else rows_of[: len(got)]
                if got != want:
                    problems.append(f"part {key} takes {got} of a dataset whose rows are {rows_of}")
        return problems


def unshuffled(ds: Dataset, div: Division | None = None) -> Dataset:
    """``ds`` without the shuffles that run per part (they only reorder a part's rows):
    its own, and those of its datasets where each is divided on its own
    (:func:`unplanned_shares`)."""
    a = anatomy(ds, div)
    cut_at = a.global_ops
    kept = ds.ops[:cut_at] + tuple(op for op in ds.ops[cut_at:] if not isinstance(op, Shuffle))
    if a.how == "combined" and not all(plan_known(p) for p in ds.parts):
        plain = None if div is None else Division(div.world_size, div.num_workers, drop_last=False, pad=False)
        return replace(ds, parts=tuple(unshuffled(p, plain) for p in ds.parts), ops=kept)
    return replace(ds, ops=kept)


def invariants(
    ds: Dataset, div: Division, batch_size: int, epoch: int = 0, observe: Observe | None = None
) -> Invariants:
    """What holds for this reading whatever the per-part draws (for an exact reading,
    what :func:`parts` gives, as invariants).

    A per-part shuffle only reorders: the epoch's rows, the rows per part, how many are
    padding and how many drop_last leaves out are those of the same reading without it;
    which rows pad or are dropped depends on the order. An interleave with probabilities
    mixing each part's own shares: without replacement every row comes once and the
    counts are a concatenation's; otherwise every part delivers as many rows and takes
    each dataset's rows of its share in order (all_exhausted: each at least once). After
    a per-part filter or flat_map (on a division that does not equalize its ranks):
    which rows each part gets depends on the order (the loader's shuffle permutes the
    epoch's units), but every row of the epoch goes to one part, so the rows are exact
    (nothing missing, nothing padded) and only the counts per part are free; with
    drop_last each part delivers whole batches and leaves out fewer than a batch."""
    a = anatomy(ds, div)
    per_part_rows = any(isinstance(op, (Filter, *REMAKES)) for op in ds.ops[a.per_part :])
    try:
        return _from_parts(parts(ds, div, epoch, observe), ds, div, batch_size, epoch, observe)
    except NotExact:
        pass
    plain = unshuffled(ds, div)
    if isinstance(ds, Interleave) and a.how == "combined" and ds.probabilities is not None:
        if ds.stopping != "all_exhausted_without_replacement":
            shuffled = any(isinstance(op, Shuffle) for op in ds.ops[a.global_ops :])
            return _mixed(ds, div, batch_size, epoch, observe, per_part_rows, shuffled)
        plain = Concatenate(ds.parts, ops=plain.ops)  # every row once, counts as concatenated
    inv = _from_parts(parts(plain, div, epoch, observe), plain, div, batch_size, epoch, observe)
    if per_part_rows:
        assert not equalizes(div) and inv.padding == 0, "padding only on divisions that equalize"
        inv.counts = None
        inv.whole_batches = batch_size if div.drop_last else None
        if div.drop_last:
            inv.dropped, inv.dropped_max = None, (batch_size - 1) * len(div.keys())
    return inv


def _from_parts(
    divided: dict[tuple[int, int], list[int]], ds: Dataset, div: Division, batch_size: int, epoch: int,
    observe: Observe | None,
) -> Invariants:
    delivered = {key: [i for b in batches(p, batch_size, div.drop_last) for i in b] for key, p in divided.items()}
    a = anatomy(ds, div)
    if a.how in ("kept", "dealt") and equalizes(div):
        # The epoch's rows through every op: what the division pads or trims.
        epoch_rows = rows(prefix(ds, a.global_ops), epoch, observe)
        for op in ds.ops[a.global_ops :]:
            if not isinstance(op, Shuffle):
                epoch_rows = per_row(op, epoch_rows)
        whole = Counter(epoch_rows)
    else:
        flat = Division(div.world_size, div.num_workers, drop_last=False, pad=False)
        whole = Counter(i for part in parts(ds, flat, epoch, observe).values() for i in part)
    got = Counter(i for p in delivered.values() for i in p)
    return Invariants(
        rows=whole,
        support=set(whole) | set(got),
        padding=sum((got - whole).values()),
        dropped=sum((whole - got).values()),
        counts={key: len(p) for key, p in delivered.items()},
    )


def _mixed(
    ds: Interleave, div: Division, batch_size: int, epoch: int, observe: Observe | None, per_part_rows: bool,
    shuffled: bool,
) -> Invariants:
    """first_exhausted / all_exhausted with probabilities, each part mixing its shares."""
    can = drawable(ds)
    planned = all(plan_known(p) for p in ds.parts)
    if planned:
        sources = [rows(p, origin_epoch(ds, epoch), observe) for p in ds.parts]
        cuts = shares([len(s) for s in sources], div)
        starved(ds, cuts)
        own = {key: [[sources[i][j] for j in r] if can[i] else [] for i, r in enumerate(cuts[key])] for key in cuts}
        if ds.stopping == "all_exhausted":
            stranded(own)
    else:
        try:
            unplanned = unplanned_shares(ds, div, epoch, observe)
        except NotExact:
            # Shuffles within the datasets reorder each share: the same rows, in an order
            # of chance.
            unplanned, shuffled = unplanned_shares(unshuffled(ds, div), div, epoch, observe), True
        own = {key: [s if can[i] else [] for i, s in enumerate(shares_)] for key, shares_ in unplanned.items()}
    support = {i for s in own.values() for share in s for i in share}
    for op in ds.ops[anatomy(ds, div).global_ops :]:
        if isinstance(op, Pack):
            # Which rows share a pack depends on each part's order: any may come first.
            support = {PACK_BASE + i for i in support}
        elif isinstance(op, (Filter, FlatMap)):
            support = set(per_row(op, sorted(support)))
    inv = Invariants(rows=None, support=support, padding=None, dropped=None, equal_counts=planned and not per_part_rows)
    if not per_part_rows and not shuffled:
        cyclic = ds.stopping == "all_exhausted"
        inv.orders = {key: [(s, cyclic) for s in own[key] if s] for key in own}
    if not per_part_rows and not div.drop_last:
        # Where the mix ends: every part is cut (first_exhausted) or carried on
        # (all_exhausted) to the length of one part's own mix, which ended as its
        # strategy says: first_exhausted once one of its shares ran out, so that part
        # delivered all of that share (at least one row); all_exhausted once every one
        # of its shares had, so that part delivered all of each.
        # (A dataset of probability 0 is never drawn, so never runs out; an empty share
        # has run out from the start.)
        inv.ends = (ds.stopping, {key: [s for i, s in enumerate(own[key]) if can[i]] for key in own})
        # Unplanned, nothing brings the mixes to one length: each ends on its own.
        inv.ends_each = not planned
    if ds.stopping == "all_exhausted" and not per_part_rows:
        # Every part takes every row of its shares at least once; repeats continue it.
        # How far depends on the draw: where the mix ends (``ends``) bounds them.
        inv.rows = Counter(support)
        inv.padding_max = sys.maxsize
        inv.dropped = 0 if not div.drop_last or batch_size == 1 else None
        inv.dropped_max = (batch_size - 1) * len(div.keys())
    return inv


# ---------------------------------------------------------------------------------------
# Resuming.


def resumable_elsewhere(ds: Dataset, delivered: bool = True, divisions: Sequence[Division] = ()) -> bool:
    """Whether an epoch can resume on another division (elastic): the rows the old
    parts had not delivered are divided anew and come exactly once. That needs the
    delivered rows' positions in the epoch. Rows divided by place (contiguous, kept,
    combined) have their place in the epoch, which a flat_map's rows lack. Rows dealt
    round-robin (:func:`dealt`: every part read the whole stream up to the last
    take/skip, or after a flat_map or filter on a division that equalizes its ranks:
    see :func:`anatomy`) have their place in that stream, the same on every division
    that deals it: such an epoch resumes where the old and new ``divisions`` both deal
    it after the same op, and no flat_map follows (a part's own rows have no place). A
    new division that would not deal it (one rank, or ranks not kept equal) deals the
    rows left all the same, where a division keeping its ranks equal deals them: the
    epoch resumes there if that is after the op the old one dealt it. An epoch the old
    division did not deal does not resume on a division that deals it; one divided by
    place whose :func:`nested` part deals its own rows (a take/skip after a combination
    nested in one, read as one reader reads it) resumes only on the division that saved
    it. A mix that :func:`remixes` resumes only on the division that mixed it. An epoch nothing of which was delivered yet resumes anywhere: it
    starts afresh."""

    def has_flat_map(d: Dataset) -> bool:
        return any(isinstance(op, REMAKES) for op in d.ops) or (
            not isinstance(d, Source) and any(has_flat_map(p) for p in d.parts)
        )

    def nested_deals(d: Dataset) -> bool:
        # A part read as it is, whose own take/skip after a combination deals it.
        return nested(d) and any(anatomy(p).how == "dealt" or nested_deals(p) for p in d.parts)

    if not delivered:
        return True
    if remixes(ds):
        return False
    cuts = {(a.how, a.global_ops) for a in (anatomy(ds, div) for div in divisions)}
    if len(divisions) == 2 and anatomy(ds, divisions[0]).how == "dealt" and not equalizes(divisions[1]):
        # The new division deals the rows left as an equal-ranked one would.
        cuts = {(a.how, a.global_ops) for a in (anatomy(ds, div) for div in (divisions[0], Division(world_size=2)))}
    if any(how == "dealt" for how, _ in cuts):
        if len(cuts) > 1:
            return False  # dealt on one division only, or after another op
        # (A nested part dealing its own rows is within the stream dealt.)
        ((_, after),) = cuts
        return not any(isinstance(op, REMAKES) for op in ds.ops[after:])
    return not has_flat_map(ds) and not nested_deals(ds)


def check_resumed(
    whole: Counter, before: Counter, after: Counter, extra_max: int, support: set[int]
) -> list[str]:
    """Before-resume and after-resume together are the epoch: every row of ``whole``
    delivered, nothing twice but padding (at most ``extra_max`` rows, repeats of rows of
    the data)."""
    got = before + after
    problems = []
    if missing := whole - got:
        problems.append(f"rows never delivered: {sorted(missing.elements())[:20]}")
    extra = got - whole
    if sum(extra.values()) > extra_max:
        problems.append(f"{sum(extra.values())} rows twice (at most {extra_max} padding): {sorted(extra.elements())[:20]}")
    if not set(extra) <= support:
        problems.append(f"rows outside the data: {sorted(set(extra) - support)[:20]}")
    return problems
