"""fedshift payloads as Flower records, and back, without loss.

A :class:`~fedshift.core.payload.Payload` becomes one Flower ``RecordDict``:

- every named record (``weights``, ``control``, ``fedrdn_stats``, ``ffa_stats``,
  ``amplitude``, ``offset``, ``generator``...) is an ``ArrayRecord`` under its own name, its
  tensors in order under their own keys (numpy ``.npy`` bytes: dtype and shape kept, so a
  round trip is bit-exact);
- ``Payload.metrics`` and ``num_examples`` are the ``MetricRecord`` ``fedshift.metrics``;
- ``Payload.config`` is the ``ConfigRecord`` ``fedshift.core.config``.

Record names starting with ``fedshift.`` are reserved for the adapter's own records (the run's
config, the client's identity, evaluation scores). Flower's built-in strategies accept one
array record per reply; fedshift's ServerApp reads them all.

Nested Python state (a client's state between rounds, a server view for evaluation) travels as
one ``uint8`` array holding ``torch.save`` bytes, read back with ``torch.load(weights_only=
True)``: tensors, numbers, strings, lists and dicts only, never arbitrary objects.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedshift.core.errors import FedshiftError
from fedshift.core.payload import Payload

#: prefix of the adapter's own records; payload record names may not start with it
RESERVED = "fedshift."
METRICS = "fedshift.metrics"
CONFIG = "fedshift.config"
NUM_EXAMPLES = "num-examples"


def payload_to_records(payload: Payload) -> RecordDict:
    """A payload as a ``RecordDict`` (see the module docstring)."""
    out = RecordDict()
    for name, tensors in payload.records.items():
        if name.startswith(RESERVED):
            raise FedshiftError(
                f"payload record {name!r}: names starting with {RESERVED!r} are reserved for "
                "the Flower adapter; rename the record"
            )
        out[name] = tensors_to_record(tensors)
    metrics = {k: _metric_value(k, v) for k, v in payload.metrics.items()}
    metrics[NUM_EXAMPLES] = int(payload.num_examples)
    out[METRICS] = MetricRecord(metrics)
    out[CONFIG] = ConfigRecord(dict(payload.config))
    return out


def records_to_payload(content: RecordDict, device: torch.device | str = "cpu") -> Payload:
    """The payload a ``RecordDict`` from :func:`payload_to_records` carries (tensors on
    ``device``); the adapter's other ``fedshift.*`` records are ignored."""
    records = {}
    for name, rec in content.array_records.items():
        if name.startswith(RESERVED):
            continue
        records[name] = record_to_tensors(rec, device)
    metrics = dict(content.metric_records.get(METRICS, {}))
    num = int(metrics.pop(NUM_EXAMPLES, 0))
    config = dict(content.config_records.get(CONFIG, {}))
    return Payload(records, num_examples=num, metrics=metrics, config=config)


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """Named tensors as one ``ArrayRecord`` (order, dtype and shape kept)."""
    return ArrayRecord(
        {k: Array(t.detach().cpu().contiguous().numpy()) for k, t in tensors.items()}
    )


def record_to_tensors(
    record: ArrayRecord, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """The named tensors of :func:`tensors_to_record`, on ``device``."""
    return {k: torch.from_numpy(a.numpy()).to(device) for k, a in record.items()}


def _metric_value(key: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value)
        raise FedshiftError(
            f"payload metric {key!r} is {type(value).__name__}; metrics must be numbers"
        )
    return value


# -------------------------------------------------------------------------- nested state
def pack(obj: object) -> ArrayRecord:
    """Nested tensors/numbers/strings/lists/dicts as one ``ArrayRecord`` (``blob``)."""
    buf = io.BytesIO()
    torch.save(_to_cpu(obj), buf)
    return ArrayRecord({"blob": Array(np.frombuffer(buf.getvalue(), dtype=np.uint8).copy())})


def unpack(record: ArrayRecord, device: torch.device | str = "cpu") -> object:
    """The object :func:`pack` stored, tensors moved to ``device``."""
    data = record["blob"].numpy().tobytes()
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)


def _to_cpu(obj: object) -> object:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
