"""What a compiled SPMD program sends between devices, read from its optimized HLO text.

Every collective (all-reduce, reduce-scatter, all-gather, all-to-all, collective-permute) with the mesh axes
its device groups span, the bytes of its result on one device, and how often it runs per call: the product of
the trip counts of the while loops around it (XLA's `known_trip_count` where it writes one, else the loop
condition's `i < N` against a constant, as lax's loops count from 0; any other loop is counted once and
reported). What goes over the data-centre network in a multi-slice run:
on TPU, libtpu compiles one program per slice, its collectives within the slice, and sends what crosses slices
to the Megascale runtime as host-transfer `send`s tagged `_xla_megascale_transfer_type` (ALL_REDUCE,
ALL_GATHER, ...): those are listed with op "dcn <type>"; on other devices (hosts standing in for slices)
`crossing(...)` keeps the collectives whose groups span more than one slice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4}
_DTYPE_BYTES |= {"s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "ragged-all-to-all", "collective-permute")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_CALLEE = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_REDUCE = re.compile(r'_xla_megascale_reduce_operation="(\w+)"')


@dataclass(frozen=True)
class Collective:
    op: str  # "all-reduce", ...
    axes: tuple[str, ...]  # the mesh axes along which the members of a group differ
    bytes_per_device: int  # the result on one device (an all-reduce of a tuple: all its arrays)
    runs_per_call: int  # product of the known trip counts of the loops around it
    groups: tuple[tuple[int, ...], ...]  # device indices (into the mesh's flat device order)


def _array_bytes(text: str) -> list[int]:
    return [math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dt] for dt, dims in _ARRAY.findall(text)]


def _groups(rest: str, n_devices: int) -> list[list[int]]:
    """replica_groups (listed, or iota form [G,S]<=[dims]T(perm)) or collective-permute's pairs."""
    pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", rest)
    if pairs:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if iota:
        g, size = int(iota.group(1)), int(iota.group(2))
        ids = np.arange(math.prod(int(d) for d in iota.group(3).split(","))).reshape(
            [int(d) for d in iota.group(3).split(",")]
        )
        if iota.group(4):
            ids = ids.transpose([int(p) for p in iota.group(4).split(",")])
        return ids.reshape(g, size).tolist()
    listed = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", rest)
    if listed and listed.group(1):
        return [[int(x) for x in grp.split(",") if x] for grp in re.findall(r"\{([\d,]*)\}", listed.group(1))]
    return [list(range(n_devices))]  # no groups: every device


def _bound(condition: list[str]) -> int | None:
    """The trip count of a loop whose condition is `i < N` (or `N > i`) against a constant: lax's loops count
    from 0 by 1. None for any other condition."""
    consts = {}
    for line in condition:
        c = re.match(r"^\s*%?([\w.\-]+)\s*=\s*s32\[\][^ ]*\s+constant\((\d+)\)", line)
        if c:
            consts[c.group(1)] = int(c.group(2))
    for line in condition:
        cmp = re.search(r"compare\(%?([\w.\-]+), %?([\w.\-]+)\), direction=(LT|GT)", line)
        if cmp and line.lstrip().startswith("ROOT"):
            bound = cmp.group(2) if cmp.group(3) == "LT" else cmp.group(1)
            return consts.get(bound)
    return None


def collectives(hlo: str, mesh_shape: Sequence[int], axis_names: Sequence[str]) -> tuple[list[Collective], int]:
    """The collectives of an optimized HLO module (`compiled.as_text()`) and the number of while loops whose trip
    count XLA did not know (their bodies counted once). Device index i is the mesh's flat device order."""
    n_devices = math.prod(mesh_shape)
    bodies: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        head = _HEADER.match(line)
        if head and not line.startswith(" "):
            current = head.group(2)
            bodies[current] = []
            entry = current if head.group(1) else entry
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            bodies[current].append(line)
    runs: dict[str, int] = {}
    unknown = 0

    def visit(name: str, times: int) -> None:
        nonlocal unknown
        runs[name] = runs.get(name, 0) + times
        for line in bodies.get(name, []):
            m = _INSTR.match(line)
            if not m or m.group(2) in _OPS or m.group(2).removesuffix("-start") in _OPS:
                continue  # a collective's to_apply is its reduction: no collectives inside
            trips = None
            if m.group(2) == "while":
                known = _TRIPS.search(line)
                cond = re.search(r"condition=%?([\w.\-]+)", line)
                trips = int(known.group(1)) if known else _bound(bodies.get(cond.group(1), []) if cond else [])
                unknown += trips is None
            for kind, callee in _CALLEE.findall(line):
                visit(callee, times * ((trips or 1) if kind == "body" else 1))
            for branches in _BRANCHES.findall(line):
                for callee in re.findall(r"%?([\w.\-]+)", branches):
                    visit(callee, times)

    visit(entry, 1)
    found = []
    for name, times in runs.items():
        for line in bodies.get(name, []):
            m = _INSTR.match(line)
            if not m:
                continue
            dcn = _MEGASCALE.search(line)
            if m.group(2) == "send" and dcn:
                reduce = _REDUCE.search(line)
                kind = dcn.group(1).lower().replace("_", "-") + (f" ({reduce.group(1).lower()})" if reduce else "")
                size = (_array_bytes(m.group(1)) or [0])[0]  # (operand, context, token)
                found.append(Collective(f"dcn {kind}", ("slices",), size, times, ()))
                continue
            op = m.group(2).removesuffix("-start")
            if op not in _OPS:
                continue
            sizes = _array_bytes(m.group(1))
            # an async start's result also holds its operand: count the largest array (all-reduce: all of them)
            size = sum(sizes) if op == "all-reduce" else max(sizes, default=0)
            groups = _groups(m.group(3), n_devices)
            coords = [np.unravel_index(g, tuple(mesh_shape)) for g in groups]
            axes = tuple(a for i, a in enumerate(axis_names) if any(len(set(c[i])) > 1 for c in coords))
            found.append(Collective(op, axes, size, times, tuple(tuple(g) for g in groups)))
    return found, unknown


def crossing(found: Sequence[Collective], slice_of: Sequence[int]) -> list[Collective]:
    """The collectives that cross slices: Megascale transfers, and those whose groups hold devices of more than
    one slice (slice_of: device index -> slice)."""
    return [c for c in found if c.op.startswith("dcn ") or any(len({slice_of[i] for i in g}) > 1 for g in c.groups)]


def summary(found: Sequence[Collective]) -> dict[str, object]:
    """Bytes per device per call by (op, axes), and the total: JSON for the plan."""
    by: dict[str, dict[str, float]] = {}
    for c in found:
        key = f"{c.op} over {'+'.join(c.axes) or '-'}"
        e = by.setdefault(key, {"ops": 0, "runs_per_call": 0, "gib_per_device_per_call": 0.0})
        e["ops"] += 1
        e["runs_per_call"] += c.runs_per_call
        e["gib_per_device_per_call"] += c.bytes_per_device * c.runs_per_call / 1024**3
    total = sum(c.bytes_per_device * c.runs_per_call for c in found) / 1024**3
    return {"by_op_and_axes": by, "gib_per_device_per_call": total}
