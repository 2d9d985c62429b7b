"""The self-contained predictor ``fedshift export`` writes next to the plain ``state_dict``:
``model.pt2``, a :func:`torch.export.export` program of what fedshift's own evaluation
computes for a test image, loadable without fedshift (``torch.export.load``).

What a run's evaluation does to a test batch (``score_client``): raw images in [0, 1] ->
every augment's ``eval_batch`` with the client's augment state, in config order -> the
bilinear resize to ``input.size`` where set -> the run's ``input.mean/std`` (skipped when
an augment normalises itself) -> the evaluated model (wrapped by the algorithm, with the
augments' layers, in eval mode) -> scores. The program is that chain with every piece of
state frozen in as a buffer: the weights, the augments' evaluation state as
:meth:`Augment.eval_module <fedshift.augment.base.Augment.eval_module>` gives it (FedRDN's
site statistics, FedRDN-V's averages, ``norm``'s constants, HarmoFL's global amplitude),
the resize and the normalisation constants. Its input: float32 images in [0, 1],
``(N, C, H, W)`` with any N and the dataset's C, H, W (``input_shape``; the program resizes
them as the run did); its output: the model's scores (``N x classes``, per pixel for
segmentation), whose argmax over dim 1 is the label.

Whose evaluation: a global model's transform may differ per site. Where every augment's
evaluation state is the same for any site (``site_state(server, None)`` is not None: no
augment, ``norm`` with fixed constants, FedRDN-V, HarmoFL's global amplitude) the program
holds it and matches every client that evaluates with it; where an augment needs the site
(FedRDN and ``norm stats=client``: the site's own statistics) the export names one: a client
of the run (``client``) or a new site's images (``site_images``: its statistics computed by
the augment's own rule). A personalised model is one client's, with that client's state.

Why ``torch.export``: on torch 2.13 TorchScript (``torch.jit.trace``) captures HarmoFL's
FFT, complex and float64 ops as exactly, but it is deprecated there (every call warns);
``torch.export`` captures them, forward hooks (stage-level augments) and a dynamic batch
size, fails on what it cannot capture (a generator made inside ``forward``) rather than
recording one call's values, and ``torch.export.save`` stores the metadata
(``fedshift.json``) in the same file (docs/EXTENDING.md, "The predictor").

Never a program that predicts differently: an augment without ``eval_module``, an
algorithm whose :meth:`~fedshift.algorithms.base.Algorithm.export_refusal` gives a reason
(FedSR's sampled prediction), a model ``torch.export`` cannot capture, or a program whose
labels differ from the run's own evaluation on the checked images (the first test images of
each client it claims to match: at most two evaluation batches a client, about 1,024 in
all), or whose scores differ beyond float32 tolerance, is refused with a
:class:`FedshiftError`.

Load it with :func:`load_predictor` (:class:`Predictor`: labels and scores of tensors or
image files, decoded as the ``folders`` dataset decodes them: :func:`decode_rule`), or with
torch alone: ``torch.export.load(path).module()(images)``.
"""

from __future__ import annotations

import copy
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.context import aug_key
from fedshift.core.errors import FedshiftError

__all__ = [
    "PREDICTOR_FORMAT",
    "EvalProgram",
    "Predictor",
    "build_predictor",
    "load_predictor",
    "write_predictor",
]

#: the ``format`` field of the predictor's ``fedshift.json``
PREDICTOR_FORMAT = "fedshift-predictor/1"
#: the metadata file inside the ``.pt2`` (``torch.export.save(extra_files=...)``)
META = "fedshift.json"
#: about how many test images the export's check scores, over the clients it claims
CHECK_IMAGES = 1024


class EvalProgram(nn.Module):
    """Raw images -> the augments' evaluation transforms -> the bilinear resize to
    ``input.size`` (``size``; None: none) -> ``(x - mean) / std`` (unless an augment
    normalised) -> the model: one site's evaluation, every state a buffer."""

    #: the input normalisation's buffers (registered only when ``normalizes``)
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        transforms: list[nn.Module],
        normalize: tuple[torch.Tensor, torch.Tensor] | None,
        model: nn.Module,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.transforms = nn.ModuleList(transforms)
        self.size = None if size is None else (int(size[0]), int(size[1]))
        self.normalizes = normalize is not None
        if normalize is not None:
            self.register_buffer("mean", normalize[0].detach().cpu().clone())
            self.register_buffer("std", normalize[1].detach().cpu().clone())
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            x = t(x)
        if self.size is not None and tuple(x.shape[-2:]) != self.size:  # Resize's rule
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        if self.normalizes:
            x = (x - self.mean) / self.std
        return self.model(x)


@dataclass
class Site:
    """Whose evaluation the program reproduces: the augments' states (by ``aug/<name>``),
    what to call it, and the run's clients whose evaluation uses exactly these states."""

    states: dict[str, Any]
    label: str
    clients: list[str]
    #: augments whose state is the site's own (``--site-stats`` replaces it)
    per_site: list[str]


def _same(a: nn.Module, b: nn.Module) -> bool:
    """Two evaluation transforms that compute the same: same type, attributes and buffers."""
    if type(a) is not type(b) or a.extra_repr() != b.extra_repr():
        return False
    sa, sb = a.state_dict(), b.state_dict()
    dc = getattr(a, "dc_only", None) == getattr(b, "dc_only", None)
    return dc and list(sa) == list(sb) and all(torch.equal(sa[k], sb[k].to(sa[k])) for k in sa)


def _module(augment: Any, state: dict) -> nn.Module:
    module = augment.eval_module(state)
    if module is None:
        raise FedshiftError(
            f"export: augment {augment.name!r} transforms inputs at evaluation but gives no "
            "eval_module (its eval_batch as a torch module), so no predictor can carry it; "
            "none is written (`fedshift docs extending`, 'An augment')"
        )
    return module


def client_states(sim: Any, cid: str) -> dict | None:
    """Client ``cid``'s augment states as its evaluation uses them (``None``: it keeps no
    state, e.g. a client of a central run)."""
    own = sim.states.get(cid)
    if own is None:
        return None
    return {aug_key(a): own[aug_key(a)] for a in sim.exp.augments}


def choose_site(sim: Any, kind: str, client: str | None, site_images: torch.Tensor | None) -> Site:
    """The evaluation the predictor reproduces (module docstring)."""
    augs = sim.exp.augments
    server = {aug_key(a): sim.server.get(aug_key(a), {}) for a in augs}
    states: dict[str, Any] = {}
    per_site: list[str] = []
    for a in augs:
        key = aug_key(a)
        state = a.site_state(server[key], None)
        if state is None:
            per_site.append(a.name)
            state = None if site_images is None else a.site_state(server[key], site_images)
        states[key] = state
    if kind == "personal" or (client is not None and site_images is None):
        assert client is not None
        own = client_states(sim, client) or {}
        return Site(own, f"client {client}", [client], per_site if kind == "global" else [])
    if site_images is not None:
        return Site(states, "the site of --site-stats", [], per_site)
    if per_site:
        raise FedshiftError(
            f"export: augment {per_site[0]!r} normalises each site's images with that site's "
            "own statistics, so the predictor must know the site: name a client of this run "
            f"with --client NAME ({', '.join(sim.fed.client_names)}) or give a new site's "
            "images with --site-stats DIR"
        )
    mods = [_module(a, states[aug_key(a)]) for a in augs]

    def matches(cid: str) -> bool:
        own = client_states(sim, cid)
        if not augs:
            return True
        return own is not None and all(
            _same(m, _module(a, own[aug_key(a)])) for a, m in zip(augs, mods, strict=True)
        )

    matching = [c for c in sim.fed.client_names if matches(c)]
    if augs and not matching:
        raise FedshiftError(
            "export: at this round no client of the run evaluates with the state a new site "
            f"gets (augment {augs[0].name!r}: e.g. HarmoFL's own amplitudes before the global "
            "one arrives); export one client's evaluation with --client NAME, or another "
            "round (--weights last)"
        )
    label = (
        "every client"
        if len(matching) == len(sim.fed.client_names)
        else (f"clients {', '.join(matching)}")
    )
    return Site(states, label, matching, [])


def build_program(sim: Any, weights: dict[str, torch.Tensor], site: Site) -> EvalProgram:
    """The run's model with ``weights``, on the CPU in eval mode, behind ``site``'s input
    transforms and the run's normalisation."""
    model = copy.deepcopy(sim.model).cpu()
    model.load_state_dict(weights)
    model.eval()
    transforms = [_module(a, site.states[aug_key(a)]) for a in sim.exp.augments]
    norm = sim.pipeline.normalize
    pair = None if norm is None else (norm.mean.float(), norm.std.float())
    resize = sim.pipeline.resize
    return EvalProgram(transforms, pair, model, None if resize is None else resize.size).eval()


def _refuse_algorithm(sim: Any) -> None:
    cfg = sim.cfg.algorithm
    why = cfg.factory.export_refusal(cfg.params)
    if why:
        raise FedshiftError(f"export: algorithm {cfg.name!r} cannot be exported faithfully: {why}")


def capture(program: EvalProgram, example: torch.Tensor, what: str) -> Any:
    """``torch.export`` of ``program`` with a dynamic batch size, or the refusal naming why."""
    # Dim.DYNAMIC (torch >= 2.5) allows a batch of one; older torch: a named dimension
    dim = torch.export.Dim
    batch = getattr(dim, "DYNAMIC", None) or dim("batch", min=1, max=1 << 20)
    try:
        with torch.no_grad():
            return torch.export.export(program, (example,), dynamic_shapes={"x": {0: batch}})
    except Exception as e:  # any capture failure: refuse, naming it
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FedshiftError(
            f"export: torch.export cannot capture the evaluation of {what} "
            f"({type(e).__name__}: {first[:200]}; torch {torch.__version__}); no predictor "
            "is written"
        ) from None


def reference_scores(
    sim: Any, weights: dict, states: dict | None, x: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """What the run's evaluation (``score_client``: ``Task.evaluate``'s batches) computes for
    ``x`` with ``weights`` and the augments' ``states``: the scores, on the CPU."""
    model = sim.model
    model.load_state_dict(weights)
    model.eval()
    outs = []
    with torch.no_grad():
        for s in range(0, len(x), batch_size):
            xb = sim.pipeline.eval(x[s : s + batch_size].to(sim.device), states)
            outs.append(model(xb).float().cpu())
    return torch.cat(outs)


def program_scores(program: Any, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The exported program's scores for ``x`` in batches of ``batch_size``."""
    with torch.no_grad():
        return torch.cat([program(x[s : s + batch_size]) for s in range(0, len(x), batch_size)])


def _check(
    sim: Any, program: Any, weights: dict, site: Site, example: torch.Tensor, what: str
) -> int:
    """Compare the exported program with the run's evaluation: the first test images of each
    client ``site`` matches (at most two evaluation batches a client, about
    :data:`CHECK_IMAGES` in all, at least 16 a client; for a new site, ``example``: its
    images, up to two evaluation batches);
    refuse on any label that differs or any score beyond float32 tolerance. Returns the
    number of images checked."""
    bs = sim.exp.eval_batch_size
    # at most two evaluation batches a client, about CHECK_IMAGES images in all
    per_client = min(2 * bs, max(16, CHECK_IMAGES // max(1, len(site.clients))))
    checks = []
    for cid in site.clients:
        data = next(c for c in sim.fed.clients if c.name == cid)
        x = data.split("test").x[:per_client]
        if len(x):
            checks.append((cid, torch.as_tensor(x).float().cpu(), client_states(sim, cid)))
    if not checks:  # a new site: its own images where given, else the example
        checks.append(("the new site", example[: 2 * bs], site.states))
    # float32 tolerances (torch.testing's defaults) where the run evaluates on this CPU too;
    # the CPU program against a GPU's kernels: the labels, and scores to 1e-3
    rtol, atol = (1.3e-6, 1e-5) if torch.device(sim.device).type == "cpu" else (1e-3, 1e-3)
    n = 0
    for cid, x, states in checks:
        want = reference_scores(sim, weights, states, x, bs)
        got = program_scores(program, x, bs)
        same = torch.equal(got.argmax(1), want.argmax(1))
        if not same or not torch.allclose(got, want, rtol=rtol, atol=atol):
            diff = float((got - want).abs().max())
            raise FedshiftError(
                f"export: the captured program of {what} predicts differently from the run's "
                f"evaluation on {cid}'s test images (labels {'equal' if same else 'differ'}, "
                f"scores differ by up to {diff:.3g}); no predictor is written"
            )
        n += len(x)
    return n


def build_predictor(
    sim: Any,
    weights: dict[str, torch.Tensor],
    kind: str,
    client: str | None,
    site_images: torch.Tensor | None = None,
) -> tuple[Any, dict]:
    """The checked ``torch.export`` program of ``sim``'s evaluation with ``weights`` (module
    docstring) and its metadata's site part."""
    _refuse_algorithm(sim)
    site = choose_site(sim, kind, client, site_images)
    program = build_program(sim, weights, site)
    what = f"algorithm {sim.cfg.algorithm.name!r}" + "".join(
        f" + augment {a.name!r}" for a in sim.exp.augments
    )
    first = (
        sim.fed.clients[0]
        if not site.clients
        else next(c for c in sim.fed.clients if c.name == site.clients[0])
    )
    example = torch.as_tensor(first.split("test").x[:2]).float().cpu()
    if len(example) < 2:
        example = torch.rand(2, *sim.fed.input_shape, generator=torch.Generator().manual_seed(0))
    exported = capture(program, example, what)
    new_site = site_images if site_images is not None and not site.clients else example
    checked = _check(sim, exported.module(), weights, site, new_site, what)
    meta = {
        "site": site.label,
        "clients": site.clients,
        "per_site": site.per_site,
        "checked_images": checked,
        "transforms": [
            {"augment": a.name, "module": type(m).__name__, "index": i}
            for i, (a, m) in enumerate(zip(sim.exp.augments, program.transforms, strict=True))
        ],
    }
    return exported, meta


def write_predictor(path: Path, exported: Any, meta: dict) -> None:
    """``torch.export.save`` of ``exported`` with ``meta`` as ``fedshift.json`` inside."""
    from fedshift.core.files import atomic_output

    buf = io.BytesIO()  # torch.export.save warns about a file name not ending in .pt2
    torch.export.save(exported, buf, extra_files={META: json.dumps(meta, indent=2)})
    with atomic_output(path) as tmp:
        Path(tmp).write_bytes(buf.getvalue())


def read_meta(path: str | Path) -> tuple[Any, dict]:
    """The loaded program and its ``fedshift.json`` (checked to be a fedshift predictor)."""
    extra = {META: ""}
    try:
        program = torch.export.load(str(path), extra_files=extra)
    except Exception as e:  # not a .pt2 file, or a broken one
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise FedshiftError(
            f"{path}: not a torch.export program ({type(e).__name__}: {first}); give the "
            ".pt2 file fedshift export wrote"
        ) from None
    meta = json.loads(extra[META] or "{}")
    if meta.get("format") != PREDICTOR_FORMAT:
        raise FedshiftError(
            f"{path}: not a fedshift predictor (its {META} has format {meta.get('format')!r}, "
            f"expected {PREDICTOR_FORMAT!r}); write one with fedshift export"
        )
    return program, meta


def decode_rule(input_shape: tuple[int, ...]) -> dict | None:
    """How ``fedshift predict`` turns image files into the program's input (the ``folders``
    dataset's decoding): Pillow ``convert("RGB")`` (3 channels) or ``convert("L")`` (1),
    a bilinear antialiased resize to ``size x size`` (none when already that size), / 255.
    ``None`` for inputs no image file gives (other channel counts, non-square images)."""
    c, h, w = (tuple(input_shape) + (0, 0, 0))[:3]
    if h != w or c not in (1, 3):
        return None
    return {"mode": "rgb" if c == 3 else "gray", "size": int(h), "range": [0.0, 1.0]}


def read_image_files(paths: list[Path], input_shape: tuple[int, ...]) -> torch.Tensor:
    """Image files decoded as the ``folders`` dataset decodes them (:func:`decode_rule`):
    float32 ``(N, C, H, W)`` in [0, 1]."""
    from fedshift.data.common.image_files import read_images
    from fedshift.data.common.images import to_float

    rule = decode_rule(input_shape)
    if rule is None:
        raise FedshiftError(
            f"this model takes {'x'.join(map(str, input_shape))} inputs, which no image file "
            "decodes to; give it tensors through fedshift.load_predictor(...)"
        )
    return to_float(read_images(paths, rule["size"], rule["mode"]))


def image_paths(items: list[str | Path]) -> list[Path]:
    """Files as given and, for a folder, every image file under it (sorted)."""
    from fedshift.data.common.images import IMAGE_SUFFIXES
    from fedshift.data.common.walk import list_files

    out: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            out.extend(list_files(item, IMAGE_SUFFIXES).files)
        elif item.is_file():
            out.append(item)
        else:
            raise FedshiftError(f"{item}: no such file or folder")
    if not out:
        raise FedshiftError(f"no image files in {', '.join(map(str, items))}")
    return out


class Predictor:
    """A loaded ``.pt2`` predictor (:func:`load_predictor`): ``scores(x)`` the program's
    output for float32 images in [0, 1] ``(N, C, H, W)``, ``predict(x)`` the labels (class
    indices: argmax over dim 1) and those scores; ``predict_files`` decodes image files as
    the ``folders`` dataset does first. Batches of the run's ``eval.batch_size``, in the
    order given: a model that normalises with batch statistics at evaluation
    (``meta["batch_dependent"]``) gives the run's scores for the run's batches only."""

    def __init__(self, program: Any, meta: dict, path: Path) -> None:
        self.program = program
        self.meta = meta
        self.path = path
        self.classes: list[str] = list(meta["classes"])

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x).float()
        shape = tuple(self.meta["input_shape"])
        if x.ndim != 4 or tuple(x.shape[1:]) != shape:
            raise FedshiftError(
                f"{self.path}: expects images of shape (N, {', '.join(map(str, shape))}), "
                f"got {tuple(x.shape)}"
            )
        return program_scores(self.program, x, int(self.meta["batch_size"]))

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels, scores): class indices (per pixel for segmentation) and raw scores."""
        scores = self.scores(x)
        return scores.argmax(1), scores

    def predict_files(
        self, paths: list[str | Path]
    ) -> tuple[list[Path], torch.Tensor, torch.Tensor]:
        """The image files (folders expanded), their labels and scores."""
        files = image_paths(paths)
        labels, scores = self.predict(read_image_files(files, tuple(self.meta["input_shape"])))
        return files, labels, scores

    def use_site(self, images: torch.Tensor) -> None:
        """Replace the per-site state (FedRDN's site statistics: ``meta["per_site"]``) by that
        of a new site whose images (float32 in [0, 1], ``(N, C, H, W)``) are ``images``,
        computed by each augment's own rule (``site_state``)."""
        from fedshift.augment import build_augments

        per_site = list(self.meta.get("per_site") or [])
        if not per_site:
            raise FedshiftError(
                f"{self.path}: this predictor has no per-site statistics to replace (its "
                "evaluation is the same for every site, or one client's personal model); "
                "drop --site-stats"
            )
        seed = int(self.meta["source"]["seed"])
        augs = build_augments(self.meta["augment"], seed, len(self.classes))
        buffers = dict(self.program.named_buffers())
        for t in self.meta["transforms"]:
            if t["augment"] not in per_site:
                continue
            a = next(a for a in augs if a.name == t["augment"])
            state = a.site_state({}, images)
            assert state is not None  # None only without images
            module = a.eval_module(state)
            assert module is not None  # the export wrote this augment's transform
            for name, value in module.state_dict().items():
                buffers[f"transforms.{t['index']}.{name}"].copy_(value)
        self.meta = {**self.meta, "site": "the site of --site-stats", "clients": []}


def load_predictor(
    path: str | Path, site_images: torch.Tensor | str | Path | None = None
) -> Predictor:
    """The predictor ``fedshift export`` wrote (``model.pt2``). ``site_images``: a new site's
    images (a tensor, or a folder of image files) whose statistics replace the per-site
    state (FedRDN); see :meth:`Predictor.use_site`."""
    path = Path(path)
    program, meta = read_meta(path)
    pred = Predictor(program.module(), meta, path)
    if site_images is not None:
        if not isinstance(site_images, torch.Tensor):
            site_images = read_image_files(image_paths([site_images]), tuple(meta["input_shape"]))
        pred.use_site(site_images)
    return pred
