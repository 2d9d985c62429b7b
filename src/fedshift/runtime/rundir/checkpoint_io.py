"""The one file format of every saved state: ``checkpoint.pt``, ``selected.pt`` and the
Flower nodes' client snapshots (``r<round>.pt``).

A file is a fixed 52-byte header followed by the payload::

    bytes 0-7    magic b"FSHCKPT\\n"
    bytes 8-11   format version, unsigned 32-bit little-endian (currently 1)
    bytes 12-19  payload length in bytes, unsigned 64-bit little-endian
    bytes 20-51  SHA-256 digest of the payload
    bytes 52-    payload: the bytes ``torch.save`` writes for the state (a dict of tensors,
                 numbers, strings, lists, tuples and dicts, nothing else)

:func:`read_checkpoint` checks the header, the length and the digest before anything is
unpickled, so a truncated, empty or bit-flipped file is a :class:`CheckpointError` naming the
file, never garbage state. The payload is then read with ``torch.load(weights_only=True)``
and no extra allow-listed globals: a run directory is data people share, and a pickle that
names any other callable (an object whose ``__reduce__`` runs a command) is refused, even
inside a header whose digest is right (anyone can compute a SHA-256). Files without the
header (written by fedshift before this format, whose RNG state needed
``weights_only=False``) are refused too: there is no way to load them safely, so the run
must be repeated.

:func:`write_checkpoint` writes atomically: header and payload go to ``<name>.tmp``, which is
flushed and fsynced, then renamed over ``<name>`` (the directory is fsynced too, where the
platform allows). If the write fails (disk full) the ``.tmp`` is removed, the previous file is
untouched and the ``OSError`` propagates for the caller to explain.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import torch

from fedshift.core.errors import FedshiftError
from fedshift.core.files import write_bytes_atomic
from fedshift.core.seeding import rng_state_problem

#: a run directory's full state (last round) and the state at its selected round
CHECKPOINT = "checkpoint.pt"
SELECTED = "selected.pt"

MAGIC = b"FSHCKPT\n"
VERSION = 1
_FIELDS = struct.Struct("<IQ32s")  # version, payload length, sha256
HEADER_SIZE = len(MAGIC) + _FIELDS.size

__all__ = [
    "CHECKPOINT",
    "SELECTED",
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "CheckpointError",
    "check_like",
    "check_run_state",
    "check_selected",
    "config_digest",
    "read_checkpoint",
    "read_run_state",
    "state_departure",
    "write_checkpoint",
    "write_failed",
]


class CheckpointError(FedshiftError):
    """A saved state that cannot be used: missing header, truncated, corrupted, unsafe."""


def encode(obj: Any) -> bytes:
    """``obj`` as the bytes of a checkpoint file (header + ``torch.save`` payload)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).digest()
    return MAGIC + _FIELDS.pack(VERSION, len(payload), digest) + payload


def write_checkpoint(obj: Any, path: str | Path) -> None:
    """Write ``obj`` to ``path`` atomically in the checkpoint format (module docstring).
    On an ``OSError`` (disk full, read-only folder) the ``.tmp`` is removed and ``path``
    keeps its previous content; the error propagates."""
    path = Path(path)
    write_bytes_atomic(path, encode(obj))  # a fresh temporary name, never through a link
    _fsync_dir(path.parent)


def write_failed(error: OSError, run_dir: Path, name: str, saved_round: int) -> CheckpointError:
    """The error of a run whose write of ``run_dir/name`` failed with ``error``: which
    round its ``checkpoint.pt`` still holds (``saved_round``, when the file is there) and
    how to continue."""
    on_disk = run_dir / CHECKPOINT
    kept = (
        f"{on_disk} still holds the state of round {saved_round}"
        if on_disk.is_file()
        else "no checkpoint was written yet (a resume starts the run again)"
    )
    return CheckpointError(
        f"could not write {run_dir / name}: {error.strerror or error}; {kept}. Free space (or "
        f"make the folder writable), then continue with: fedshift run --resume {run_dir}"
    )


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _payload(path: Path, data: bytes, fix: str) -> memoryview:
    """The verified payload of the file ``path`` whose bytes are ``data``."""
    if not data:
        raise CheckpointError(f"{path} is empty (a write cut short or a truncated copy); {fix}")
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            raise CheckpointError(f"{path} is truncated ({len(data)} bytes); {fix}")
        raise CheckpointError(
            f"{path} has no fedshift checkpoint header: it was written by an older fedshift "
            "(before checkpoints were checksummed and free of pickled code) or is not a "
            "fedshift checkpoint. Loading it would need torch.load(weights_only=False), which "
            "runs any code the file holds, so fedshift refuses it; " + fix
        )
    if len(data) < HEADER_SIZE:
        raise CheckpointError(f"{path} is truncated ({len(data)} bytes, inside its header); {fix}")
    version, size, digest = _FIELDS.unpack_from(data, len(MAGIC))
    if version != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {version}, this fedshift reads format {VERSION}: "
            "load it with the fedshift version that wrote it"
        )
    payload = memoryview(data)[HEADER_SIZE:]
    if len(payload) < size:
        raise CheckpointError(
            f"{path} is truncated ({len(payload)} of its {size} payload bytes); {fix}"
        )
    if len(payload) > size:
        raise CheckpointError(
            f"{path} is corrupted ({len(payload) - size} bytes past the payload its header "
            f"declares); {fix}"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(
            f"{path} is corrupted (its SHA-256 does not match the one in its header: a "
            f"flipped bit or a damaged copy); {fix}"
        )
    return payload


def _unsafe_reason(error: Exception) -> str:
    """What torch's weights-only unpickler refused (the middle of its long message)."""
    parts = [" ".join(p.split()) for p in str(error).split("\n\n") if p.strip()]
    reason = " ".join(parts[1:-1]) if len(parts) > 2 else " ".join(parts)
    return reason[:200]


def read_checkpoint(
    path: str | Path,
    map_location: str | torch.device | None = None,
    fix: str = "the saved state cannot be used: run the experiment again",
) -> Any:
    """The state saved in ``path`` by :func:`write_checkpoint`, verified (header, length,
    SHA-256) and unpickled with ``torch.load(weights_only=True)``. Anything wrong is a
    :class:`CheckpointError` naming the file, ending with ``fix`` (what the caller's user
    should do)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}; {fix}") from None
    payload = _payload(path, data, fix)
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} was refused: it holds objects other than tensors and plain data "
            f"({_unsafe_reason(e)}), which a fedshift checkpoint never does, so it was not "
            "written by fedshift or was tampered with; nothing in it was run. Do not use "
            "this file or the run directory it came with"
        ) from None
    except Exception as e:  # a payload torch cannot parse despite a matching digest
        raise CheckpointError(
            f"{path} could not be read ({type(e).__name__}: {e}); {fix}"
        ) from None


def read_run_state(
    run_dir: str | Path,
    name: str = CHECKPOINT,
    map_location: str | torch.device | None = None,
    like: tuple[Any, Any] | None = None,
) -> dict:
    """``checkpoint.pt`` or ``selected.pt`` of a run directory (:func:`read_checkpoint`),
    its content checked against the schema fedshift writes (:func:`check_run_state`) and,
    with ``like`` (the server state and the transport's client state the run loading it
    builds before its first round), against that run's model and algorithm
    (:func:`check_like`), with errors that say how to go on."""
    path = Path(run_dir) / name
    if not path.is_file():
        raise CheckpointError(
            f"{path} does not exist: the run stopped before its first checkpoint; "
            "start it again instead"
        )
    config = path.parent / "config.yaml"
    again = f"start the run again from its config: fedshift run --overwrite -c {config}"
    fix = again if name == CHECKPOINT else f"use its last weights (--weights last) or {again}"
    state = read_checkpoint(path, map_location=map_location, fix=fix)
    check_run_state(state, path, selected=name != CHECKPOINT, fix=fix)
    if like is not None:
        check_like(path, state["server"], like[0], state["clients"], like[1], fix)
    return state


# ---------------------------------------------------------------------------- content
#: config keys that may change while a run goes on (a resume, an extension), so not part of
#: the digest that ties ``selected.pt`` to its run (simulation.RESUME_FREE, train.rounds)
_FREE = ("name", "out", "checkpoint", "run.workers", "track", "train.rounds")


def config_digest(config: dict) -> str:
    """SHA-256 (16 hex digits) of a run's resolved config, without the keys that may change
    while it goes on: what ``selected.pt`` records to be known as this run's state."""
    tree = json.loads(json.dumps(config, default=str))
    for key in _FREE:
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


#: field -> (what it must be, check) of a run's ``checkpoint.pt``; ``selected.pt`` holds the
#: first four (and the run's key and config digest)
_FIELDS_CHECKED: dict[str, tuple[str, Any]] = {
    "round": ("a whole number >= 0", lambda v: _is_int(v) and v >= 0),
    "server": ("a dict (the server state)", lambda v: isinstance(v, dict)),
    "clients": (
        "a dict of client states, or None (a run on Flower)",
        lambda v: (
            v is None or (isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()))
        ),
    ),
    "run_key": ("the run's id (text)", lambda v: isinstance(v, str) and v != ""),
    "ledger": (
        "a dict with the list 'rows'",
        lambda v: isinstance(v, dict) and isinstance(v.get("rows"), list),
    ),
    "records": (
        "a list of evaluation rows (dicts with a 'round')",
        lambda v: isinstance(v, list) and all(isinstance(r, dict) and "round" in r for r in v),
    ),
    "rng": (
        "the random generators' state (torch, numpy, python)",
        lambda v: isinstance(v, dict) and {"torch", "numpy", "python"} <= set(v),
    ),
    "wall_s": ("a number of seconds >= 0", lambda v: _is_number(v) and v >= 0),
    "config": (
        "the run's resolved config (a dict with 'train.rounds')",
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("train"), dict)
            and _is_int(v["train"].get("rounds"))
        ),
    ),
    "selected_round": ("a round number or None", lambda v: v is None or (_is_int(v) and v >= 1)),
}
_SELECTED_FIELDS = ("round", "server", "clients", "run_key", "config_digest")


def _non_finite(tree: Any, where: str) -> str | None:
    """The path of the first floating tensor holding NaN or inf in nested dicts / lists."""
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point() and tree.numel() and not bool(torch.isfinite(tree).all()):
            return where
        return None
    items = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list | tuple)
        else ()
    )
    for key, value in items:
        found = _non_finite(value, f"{where}/{key}")
        if found is not None:
            return found
    return None


def check_run_state(state: Any, path: Path, selected: bool = False, fix: str = "") -> None:
    """``state`` (read from ``path``) has the fields fedshift writes, of the right types:
    a :class:`CheckpointError` names the file and the first field that is missing or wrong.
    A header and SHA-256 prove a file is whole, not that fedshift wrote its content (anyone
    can compute a digest), so the content is checked before anything uses it."""
    end = f"; the file was not written by fedshift or was edited. {fix}".rstrip()

    def bad(field: str, want: str, got: Any) -> CheckpointError:
        shown = type(got).__name__ if isinstance(got, dict | list) else repr(got)[:60]
        return CheckpointError(f"{path}: field {field!r} must be {want}, got {shown}{end}")

    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of fields, got {type(state).__name__}{end}")
    names = _SELECTED_FIELDS if selected else tuple(_FIELDS_CHECKED)
    for field in names:
        if field not in state:
            if selected and field in ("run_key", "config_digest"):
                raise CheckpointError(
                    f"{path}: field {field!r} is missing, so it cannot be known as this run's "
                    "selected state (a selected.pt of an older fedshift, or one copied from "
                    f"elsewhere). {fix}"
                )
            raise CheckpointError(f"{path}: field {field!r} is missing{end}")
        if field == "config_digest":
            if not isinstance(state[field], str):
                raise bad(field, "text", state[field])
            continue
        want, ok = _FIELDS_CHECKED[field]
        value = state[field]
        if field == "round" and selected:
            want, ok = "a whole number >= 1", lambda v: _is_int(v) and v >= 1
        if not ok(value):
            raise bad(field, want, value)
    for field in ("server", "clients"):
        where = _non_finite(state[field], field)
        if where is not None:  # a run stops at a non-finite update: it never saves one
            raise CheckpointError(
                f"{path}: field {field!r} holds NaN or inf (at {where}), which no state "
                f"fedshift saves does{end}"
            )
    if not selected:
        rounds = state["config"]["train"]["rounds"]
        if state["round"] > rounds:
            raise bad("round", f"at most the run's train.rounds ({rounds})", state["round"])
        sel = state["selected_round"]
        if sel is not None and sel > state["round"]:
            raise bad("selected_round", f"at most the saved round ({state['round']})", sel)
        problem = rng_state_problem(state["rng"])
        if problem is not None:
            key, _, want = problem.partition(": ")
            raise CheckpointError(f"{path}: key {key!r} {want}{end}")
        _check_rows(state, path, end)


def _check_rows(state: dict, path: Path, end: str) -> None:
    """The evaluation rows (``records``, what ``metrics.jsonl`` is rewritten from on resume)
    and the ledger's rows belong to rounds the checkpoint has run: a row of a later round
    would be merged into the resumed run's metrics as if it had been evaluated."""
    last = state["round"]
    for i, r in enumerate(state["records"]):
        rnd = r["round"]
        if not (_is_int(rnd) and 1 <= rnd <= last):
            raise CheckpointError(
                f"{path}: key 'records/{i}/round' must be an evaluated round in [1, {last}] "
                f"(the saved round), got {rnd!r}{end}"
            )
        if not isinstance(r.get("client"), str):
            raise CheckpointError(f"{path}: key 'records/{i}/client' must be a client name{end}")
    for i, row in enumerate(state["ledger"]["rows"]):
        ok = (
            isinstance(row, list | tuple)
            and len(row) == 5
            and _is_int(row[0])
            and 0 <= row[0] <= last
            and all(isinstance(v, str) for v in row[1:4])
            and _is_int(row[4])
            and row[4] >= 0
        )
        if not ok:
            raise CheckpointError(
                f"{path}: key 'ledger/rows/{i}' must be (round in [0, {last}], client, "
                f"direction, record, bytes >= 0), got {repr(row)[:60]}{end}"
            )


def check_selected(state: dict, path: Path, run_key: str, config: dict) -> None:
    """``selected.pt`` (already :func:`check_run_state`-checked) belongs to the run whose
    ``checkpoint.pt`` holds ``run_key`` and whose config is ``config``: a file copied from
    another run (even of the same config) is refused, naming both ids."""
    fix = "use the run's last weights (--weights last), or run it again"
    if state["run_key"] != run_key:
        raise CheckpointError(
            f"{path} belongs to another run (run id {state['run_key']}, this run's checkpoint.pt "
            f"has {run_key}): it was copied from elsewhere; {fix}"
        )
    digest = config_digest(config)
    if state["config_digest"] != digest:
        raise CheckpointError(
            f"{path} was written with another config (digest {state['config_digest']}, this "
            f"run's config.yaml gives {digest}); {fix}"
        )


# ---------------------------------------------------------------------------- against the run
def _kind(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"a {str(v.dtype).removeprefix('torch.')} tensor of shape {list(v.shape)}"
    if isinstance(v, dict):
        return "a dict"
    if isinstance(v, list | tuple):
        return f"a list of {len(v)}"
    return f"{type(v).__name__} {repr(v)[:40]}"


def state_departure(value: Any, template: Any, where: str) -> str | None:
    """Where ``value`` departs from ``template`` (the state this run builds before its first
    round), or None: every key of a template dict is there, every template tensor is a
    tensor of the same shape and dtype, a dict stays a dict. Keys the template lacks are
    allowed (state an algorithm adds as it goes: momentum, control variates)."""
    if isinstance(template, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            return f"key {where!r} must be {_kind(template)}, got {_kind(value)}"
        if value.shape != template.shape or value.dtype != template.dtype:
            return f"key {where!r} must be {_kind(template)}, got {_kind(value)}"
        return None
    if isinstance(template, dict):
        if not isinstance(value, dict):
            return f"key {where!r} must be a dict, got {_kind(value)}"
        for key, sub in template.items():
            if key not in value:
                return f"key {f'{where}/{key}'!r} is missing"
            found = state_departure(value[key], sub, f"{where}/{key}")
            if found is not None:
                return found
    return None


def check_like(
    path: Path, server: Any, template_server: Any, clients: Any, template_clients: Any, fix: str
) -> None:
    """The saved ``server`` and ``clients`` state (read from ``path``) fit the run that loads
    them: the keys, tensor shapes and dtypes of the state its model and algorithm build
    (``template_server``; ``template_clients``, ``None`` for a transport whose clients keep
    their own state), and state for exactly its clients. A :class:`CheckpointError` names the
    file and the first key that does not (a checkpoint of another model or config, or an
    edited one), before anything is loaded."""
    end = f"; it is not a state of this run's model and config (or was edited). {fix}".rstrip()
    found = state_departure(server, template_server, "server")
    if found is None and template_clients is not None and isinstance(clients, dict):
        extra = sorted(set(clients) - set(template_clients))
        if extra:
            found = f"key {'clients/' + str(extra[0])!r} is a client this run does not have"
        else:
            found = state_departure(clients, template_clients, "clients")
    if found is not None:
        raise CheckpointError(f"{path}: {found}{end}")
