"""The Python API: run a config and read a finished run, as ``fedshift run`` does.

    import fedshift

    result = fedshift.run({"dataset": {"name": "toyshift"}}, ["train.rounds=2"])
    print(result.summary["test_mean"], result.run_dir)
    run = fedshift.load_run(result.run_dir)
    run.summary, run.metrics, run.config
    saved = run.rebuild()  # a fedshift.SavedRun: the model and state, to evaluate

    # your own arrays, one (x, y) per site (numpy or torch): the dataset "arrays"
    result = fedshift.run({"model": {"name": "cnn"}}, federation={"a": (xa, ya), "b": (xb, yb)})
    fedshift.resume(result.run_dir, federation={"a": (xa, ya), "b": (xb, yb)})

:func:`run` takes the config as a nested dict (what a YAML config file holds), the path of a
YAML file, or a :class:`~fedshift.core.config.RunConfig`, plus ``key=value`` overrides as on
the command line, and checks it the same way (a :class:`~fedshift.core.errors.ConfigError`
names the key and the fix). :func:`load_run` reads a run directory's text files only
(``config.yaml``, ``summary.json``, ``metrics.jsonl``): nothing is unpickled and no plug-in
is imported; :meth:`LoadedRun.rebuild` builds the model and state for evaluation (a
:class:`~fedshift.runtime.rundir.saved.SavedRun`, ``fedshift.SavedRun``). :func:`run` returns a
:class:`~fedshift.runtime.rundir.results.RunResult` (``fedshift.RunResult``).
:func:`run` and :func:`resume` take ``federation=``: a mapping of site name -> arrays
(:func:`~fedshift.data.domains.arrays.read_mapping` lists the forms), checked and converted
as the ``arrays`` dataset does with files (docs/DATASETS.md). The run's config then names the
dataset ``arrays`` with ``source: python`` and ``fingerprint``, the sha256 of the arrays, so
``config.yaml`` and ``summary.json`` say the data came from Python and which data it was.
The arrays are not saved: resuming such a run (:func:`resume`) or rebuilding it
(:meth:`LoadedRun.rebuild`) needs them again, and checks them against the fingerprint;
``fedshift run --resume`` on the command line cannot, and says so.
:func:`export_model` writes a run's trained model as a plain ``state_dict`` (loadable with
``torch.load(path, weights_only=True)``) plus a JSON description; :func:`load_exported`
builds that model again and loads the weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshift.core.errors import ConfigError, FedshiftError

if TYPE_CHECKING:
    from fedshift.core.config import RunConfig
    from fedshift.runtime.rundir.results import RunResult
    from fedshift.runtime.rundir.saved import SavedRun

__all__ = ["LoadedRun", "export_model", "load_exported", "load_run", "resume", "run"]


def _raw_config(config: Any, overrides: list[str]) -> tuple[dict, str]:
    """The raw nested config of ``config`` with ``overrides`` applied, and its source name."""
    from fedshift.core.config import RunConfig, apply_overrides, load_config

    if config is None or isinstance(config, str | Path):
        source = str(config) if config is not None else "defaults"
        return load_config(config, overrides), source
    if isinstance(config, RunConfig):
        base, source = config.to_dict(), "the RunConfig given to fedshift.run"
    elif isinstance(config, dict):
        base, source = copy.deepcopy(config), "the config dict given to fedshift.run"
    else:
        raise ConfigError(
            "fedshift.run(config): expected a dict of config keys, the path of a YAML config "
            f"file or a RunConfig, got {type(config).__name__}"
        )
    # the overrides as on the command line: a value given for a swept key replaces its sweep
    return apply_overrides(base, overrides), source


def _with_arrays(raw: dict, federation: object) -> tuple[dict, list]:
    """``raw`` with its dataset section naming the arrays given to :func:`run` (``arrays``,
    ``source: python``, their fingerprint, their task unless the config sets one), and the
    sites read from ``federation``."""
    from fedshift.data.domains.arrays import fingerprint, read_mapping

    sites = read_mapping(federation)
    section = raw.get("dataset")
    section = {"name": section} if isinstance(section, str) else dict(section or {})
    name = section.get("name", "arrays")
    if name != "arrays":
        raise ConfigError(
            f"fedshift.run(federation=...) trains on the arrays given, but the config names "
            f"dataset {name!r}; drop dataset.name (or set it to arrays: its keys, e.g. "
            "dataset.fractions or dataset.size, apply to the arrays)"
        )
    for key, why in (("root", "the arrays come from Python"), ("source", "set by fedshift.run")):
        if section.get(key) not in (None, "python"):
            raise ConfigError(f"fedshift.run(federation=...): drop dataset.{key} ({why})")
    if "task" not in section:
        section["task"] = "segmentation" if sites[0].y.ndim == 3 else "classification"
    section.update(name="arrays", source="python", fingerprint=fingerprint(sites))
    return {**raw, "dataset": section}, sites


def _arrays_federation(cfg: RunConfig, federation: object, run_dir: str | Path):
    """The federation of a run started with ``federation=``, from the same arrays again."""
    from fedshift.data.domains.arrays import build_federation, read_mapping

    if cfg.dataset.name != "arrays" or cfg.dataset.params.source != "python":
        raise ConfigError(
            f"federation=: the run in {run_dir} was started from dataset "
            f"{cfg.dataset.name!r} (its config.yaml), not from arrays given in Python; "
            "leave federation out"
        )
    return build_federation(read_mapping(federation), cfg.dataset.params)


def run(
    config: dict | str | Path | RunConfig | None = None,
    overrides: list[str] | None = None,
    *,
    federation: object = None,
    out: str | Path | None = None,
    progress: bool = False,
    workers: int | str | None = None,
    exists: str = "error",
) -> RunResult:
    """Run one experiment to the end; returns its
    :class:`~fedshift.runtime.rundir.results.RunResult` (``run_dir`` and ``summary``, the
    content of ``summary.json``).
    ``config``: a nested dict, the path of a YAML file or a ``RunConfig`` (None: the defaults);
    ``overrides``: ``key=value`` strings applied on top (``["train.rounds=2"]``; as on the
    command line, a value for a key the config sweeps replaces that key's sweep); ``out``: the
    root folder of run directories (default: the config's ``out``); ``progress``: progress
    bars on stderr; ``workers``: processes running the clients (``run.workers``). A config
    whose ``sweep`` grid still makes several runs is refused: run its cells one by one (or
    ``fedshift run -c``).

    The run directory is named as ``fedshift run`` names it
    (:func:`~fedshift.runtime.rundir.results.run_dir_name`), and a directory that holds a run
    already is handled as there: ``exists="error"`` (the default) raises
    :class:`~fedshift.runtime.rundir.ownership.RunDirExists` saying what it holds and how its config
    differs; ``"overwrite"`` deletes it and runs again (``--overwrite``); ``"new"`` runs into
    the next free ``-2``, ``-3``... (``--new``).

    ``federation``: your own data instead of the config's dataset, a mapping of site name ->
    ``(x, y)``, ``{"x": x, "y": y, "split": split}`` or ``{"train": (x, y), "val": (x, y),
    "test": (x, y)}`` of numpy arrays or torch tensors (the ``arrays`` dataset: its
    ``dataset.*`` keys apply, its checks run; the module docstring says what the run records
    and how it resumes)."""
    from fedshift.catalog import resolve
    from fedshift.core.config_tree import single_cell
    from fedshift.data.domains.arrays import build_federation
    from fedshift.runtime.rundir.ownership import clear_run_dir, hold_run
    from fedshift.runtime.rundir.results import claim_dirs, release
    from fedshift.runtime.simulation import run_experiment

    if isinstance(overrides, str):
        raise ConfigError(
            f"fedshift.run(overrides=...): expected a list of key=value strings, got the "
            f"string {overrides!r}; write [{overrides!r}]"
        )
    raw, source = _raw_config(config, list(overrides or []))
    sites = None
    if federation is not None:
        raw, sites = _with_arrays(raw, federation)
    cell = single_cell(
        raw,
        source,
        lambda n, keys: (
            f"{source}: its sweep grid makes {n} runs ({keys}), and fedshift.run "
            "runs one: give each swept key one value as an override (key=value replaces the "
            "key's sweep), or run the grid with fedshift run -c FILE"
        ),
    )
    cfg = resolve(cell, source)
    fed = None if sites is None else build_federation(sites, cfg.dataset.params)
    [run_dir] = claim_dirs([cfg], out, exists, "fedshift.run")
    try:
        with hold_run(run_dir):
            if exists == "overwrite":
                clear_run_dir(run_dir)
            return run_experiment(
                cfg, run_dir=run_dir, federation=fed, progress=progress, workers=workers
            )
    finally:
        release([run_dir])  # a run that could not even start leaves no empty directory


def resume(
    run_dir: str | Path,
    *,
    federation: object = None,
    rounds: int | None = None,
    progress: bool = False,
    workers: int | str | None = None,
) -> RunResult:
    """Continue a run from its last checkpoint, as ``fedshift run --resume`` does (its config
    is checked first; ``rounds`` extends it); returns its
    :class:`~fedshift.runtime.rundir.results.RunResult`. ``federation``: for a run started with
    ``fedshift.run(..., federation=...)``, the same arrays again (checked against the
    fingerprint the run recorded; a run whose data came from Python cannot resume without
    them)."""
    from fedshift.runtime.simulation import resume_config, resume_experiment

    fed = None
    if federation is not None:
        cfg, _ = resume_config(run_dir, rounds)
        fed = _arrays_federation(cfg, federation, run_dir)
    return resume_experiment(
        run_dir, federation=fed, progress=progress, rounds=rounds, workers=workers
    )


@dataclass
class LoadedRun:
    """A run directory's files, as written (see :func:`load_run`)."""

    run_dir: Path
    #: the run's resolved config (``config.yaml``) as a nested dict
    config: dict
    #: ``summary.json``; None while the run has not finished
    summary: dict | None
    #: ``metrics.jsonl``: one row per evaluated (round, client)
    metrics: list[dict]

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def rebuild(
        self, weights: str = "selected", allow_plugins: bool = False, federation: object = None
    ) -> SavedRun:
        """The run rebuilt for evaluation from its saved state (the federation, the model and
        every client's state at the ``selected`` round, or the ``last``: a
        :class:`~fedshift.runtime.rundir.saved.SavedRun`, as
        :func:`~fedshift.runtime.simulation.load_finished` returns). Its checkpoint is read without
        running code (tensors and plain data only); a plug-in its config names
        (``module:Class``) is code, imported only with ``allow_plugins=True`` (a run
        directory may come from anyone: :mod:`fedshift.core.consent`). ``federation``: the
        arrays of a run started with ``fedshift.run(..., federation=...)``, again (checked
        against its fingerprint)."""
        from fedshift.core.consent import allowed
        from fedshift.runtime.simulation import load_finished, saved_config

        with allowed() if allow_plugins else contextlib.nullcontext():
            fed = None
            if federation is not None:
                fed = _arrays_federation(saved_config(self.run_dir), federation, self.run_dir)
            return load_finished(self.run_dir, federation=fed, weights=weights)


def _read_metrics(path: Path) -> list[dict]:
    """``metrics.jsonl`` rows; a last line without its newline (a run writing it now) is left
    out, any other line that is not a JSON object is an error naming the file and line."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # being written
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise FedshiftError(f"{path}, line {i}: not a JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise FedshiftError(f"{path}, line {i}: expected a JSON object per line")
        rows.append(row)
    return rows


def load_run(run_dir: str | Path) -> LoadedRun:
    """A run directory's ``config.yaml`` (parsed as plain YAML data), ``summary.json`` (None
    if the run has not finished) and ``metrics.jsonl``. Only these text files are read."""
    from fedshift.core.config import load_yaml
    from fedshift.core.files import read_json

    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        what = "does not exist" if not path.exists() else "has no config.yaml"
        raise FedshiftError(f"{path} is not a fedshift run directory: it {what}")
    config = load_yaml(path / "config.yaml")
    summary_path = path / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else None
    return LoadedRun(path, config, summary, _read_metrics(path / "metrics.jsonl"))


def export_model(
    run_dir: str | Path,
    out: str | Path,
    weights: str = "selected",
    client: str | None = None,
    kind: str | None = None,
    federation: object = None,
    site_stats: object = None,
    adabn: object = None,
):
    """Write a finished run's evaluated model (at the ``selected`` round, or the ``last``) as
    a plain ``state_dict`` to ``out`` (``torch.load(out, weights_only=True)`` reads it) and
    its description (model config, classes, input normalisation, where it came from) to
    ``out`` with the suffix ``.json``; ``client`` picks the personalised model of runs that
    keep one per client. ``federation``: for a run started with
    ``fedshift.run(..., federation=...)``, the same arrays again (checked against the run's
    fingerprint). Also writes the self-contained predictor, ``out`` with the suffix ``.pt2``
    (:func:`load_predictor`; ``torch.export.load`` without fedshift): the run's evaluation of
    a test image, the method's input transform and its state included. ``client`` also names
    the site whose transform a global model applies where it is each site's own (FedRDN);
    ``site_stats``: a folder of a new site's images (or a tensor of them) instead;
    ``adabn``: a new site's images, to export the model that site takes with its BatchNorm
    statistics re-estimated on them (AdaBN). Refuses, writing nothing, a
    method the predictor cannot carry faithfully. Returns an
    :class:`~fedshift.runtime.export.ExportedModel`. As ``fedshift export``; see
    :mod:`fedshift.runtime.export` and :mod:`fedshift.runtime.predictor`."""
    from fedshift.runtime.export import export_model as _export

    fed = None
    if federation is not None:
        from fedshift.runtime.simulation import saved_config

        fed = _arrays_federation(saved_config(run_dir), federation, run_dir)
    return _export(
        run_dir, out, weights, client, kind, federation=fed, site_stats=site_stats, adabn=adabn
    )


def load_exported(path: str | Path, device: str = "cpu"):
    """The model :func:`export_model` wrote to ``path``, built again with fedshift and
    loaded with its weights (``weights_only=True``), in eval mode."""
    from fedshift.runtime.export import load_exported as _load

    return _load(path, device)


def load_predictor(path: str | Path, site_images: object = None):
    """The predictor :func:`export_model` wrote (``model.pt2``): ``.predict(images)`` gives
    the labels (class indices, per pixel for segmentation) and scores of float32 images in
    [0, 1] ``(N, C, H, W)``, ``.predict_files(paths)`` of image files, ``.classes`` the class
    names. ``site_images``: a new site's images (a tensor or a folder) whose statistics
    replace the per-site state (FedRDN). See :mod:`fedshift.runtime.predictor`."""
    from fedshift.runtime.predictor import load_predictor as _load

    return _load(path, site_images)
