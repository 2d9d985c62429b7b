"""Weights out (issue 27): ``fedshift export`` / ``fedshift.export_model`` write the model a
run's tables evaluate as a plain ``state_dict`` that ``torch.load(weights_only=True)`` reads,
plus a JSON description; a model built fresh from that description, loaded with the
weights, computes what the run's own model computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import toy_cfg

import fedshift
from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.models import build_model
from fedshift.runtime.simulation import load_finished, run_experiment


def _run(tmp_path: Path, *over: str, rounds: int = 3) -> Path:
    cfg = toy_cfg("eval.every=1", *over, rounds=rounds)
    return run_experiment(cfg, run_dir=tmp_path / "run", progress=False).run_dir


def _inputs(desc: dict) -> torch.Tensor:
    """Normalised inputs as the run's pipeline gives them to the model."""
    x = torch.rand(5, *desc["input_shape"], generator=torch.Generator().manual_seed(0))
    mean = torch.tensor(desc["input"]["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(desc["input"]["std"]).view(1, -1, 1, 1)
    return (x - mean) / std


def _run_model(run_dir: Path, weights: str, client: str | None, kind: str) -> torch.nn.Module:
    """The run's own model (as the protocols rebuild it) with the exported round's weights."""
    sim = load_finished(run_dir, weights=weights)
    sim.model.load_state_dict(sim.weights_for(client or sim.fed.client_names[0], kind))
    return sim.model.eval()


def test_export_is_a_plain_state_dict_that_a_fresh_model_loads(tmp_path, one_thread):
    """FedAvg: the file is torch.save's format without fedshift's header, read with
    weights_only=True; build_model from the description + load_state_dict gives the run
    model's outputs exactly (the same weights through the same operations)."""
    run_dir = _run(tmp_path)
    out = tmp_path / "out" / "model.pt"
    done = fedshift.export_model(run_dir, out)
    assert done.path == out and done.config_path == tmp_path / "out" / "model.json"
    assert out.read_bytes()[:2] == b"PK"  # a torch.save zip file, no integrity header
    state = torch.load(out, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    desc = json.loads(done.config_path.read_text())
    assert desc["plain"] is True and desc["format"] == "fedshift-export/1"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert desc["source"]["round"] == summary["best_round"]
    assert desc["source"]["kind"] == "global" and desc["source"]["client"] is None
    assert desc["classes"] and desc["num_classes"] == len(desc["classes"])
    model = build_model(desc["model"], desc["num_classes"], desc["input_shape"], desc["task"])
    model.load_state_dict(state)
    model.eval()
    x = _inputs(desc)
    with torch.no_grad():
        assert torch.equal(model(x), _run_model(run_dir, "selected", None, "global")(x))
        assert torch.equal(fedshift.load_exported(out)(x), model(x))


def test_export_last_and_selected_are_the_rounds_they_name(tmp_path, one_thread):
    """--weights last: the final round's weights (those of checkpoint.pt); selected: the
    round model selection picked; both equal the run model at that round."""
    run_dir = _run(tmp_path, rounds=4)
    best = json.loads((run_dir / "summary.json").read_text())["best_round"]
    for weights, rnd in (("selected", best), ("last", 4)):
        out = tmp_path / f"{weights}.pt"
        desc = fedshift.export_model(run_dir, out, weights=weights).config
        assert desc["source"]["round"] == rnd and desc["source"]["weights"] == weights
        want = _run_model(run_dir, weights, None, "global").state_dict()
        got = torch.load(out, weights_only=True)
        assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_export_personal_models_need_a_client(tmp_path, one_thread):
    """FedBN keeps a model per client: without --client the export lists the clients; each
    client's export carries its own BN statistics and computes what that client's model does."""
    run_dir = _run(tmp_path, "algorithm.name=fedbn", rounds=2)
    with pytest.raises(FedshiftError, match=r"choose one with --client NAME: client0, client1"):
        fedshift.export_model(run_dir, tmp_path / "m.pt")
    with pytest.raises(FedshiftError, match="no client 'nobody'"):
        fedshift.export_model(run_dir, tmp_path / "m.pt", client="nobody")
    states = {}
    for cid in ("client0", "client1"):
        done = fedshift.export_model(run_dir, tmp_path / f"{cid}.pt", client=cid)
        assert done.config["source"] == {**done.config["source"], "client": cid, "kind": "personal"}
        states[cid] = torch.load(done.path, weights_only=True)
        model = fedshift.load_exported(done.path)
        x = _inputs(done.config)
        with torch.no_grad():
            assert torch.equal(model(x), _run_model(run_dir, "selected", cid, "personal")(x))
    bn = next(k for k in states["client0"] if k.endswith("running_mean"))
    assert not torch.equal(states["client0"][bn], states["client1"][bn])


def test_export_of_a_wrapped_model_loads_through_fedshift(tmp_path, one_thread):
    """MOON wraps the model with a projection head: the export is not plain, and
    load_exported builds the wrapped model and gives the run model's outputs."""
    run_dir = _run(tmp_path, "algorithm.name=moon", rounds=2)
    done = fedshift.export_model(run_dir, tmp_path / "moon.pt")
    assert done.config["plain"] is False and "ProjectedModel" in done.config["module"]
    x = _inputs(done.config)
    with torch.no_grad():
        got = fedshift.load_exported(done.path)(x)
        assert torch.equal(got, _run_model(run_dir, "selected", None, "global")(x))


def test_export_cli_and_its_errors(tmp_path, capsys, one_thread):
    """`fedshift export RUN_DIR --out model.pt` says what it wrote and how to load it; a
    .json --out, a run that did not finish, a --client on a global model and a weights file
    that is not the one its description names are errors that say what to do."""
    run_dir = _run(tmp_path, rounds=2)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "m.pt")]) == 0
    out = capsys.readouterr().out
    assert "global model of round" in out and "weights_only=True" in out
    assert main(["export", str(run_dir), "--out", str(tmp_path / "m.json")]) == 2
    assert "name the weights file" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--client", "client0", "--out", "x.pt"]) == 2
    assert "drop --client client0" in capsys.readouterr().err
    (tmp_path / "unfinished").mkdir()
    assert main(["export", str(tmp_path / "unfinished"), "--out", str(tmp_path / "u.pt")]) == 2
    assert "not a finished fedshift run" in capsys.readouterr().err
    other = tmp_path / "other.pt"
    torch.save({"x": torch.zeros(1)}, other)
    (tmp_path / "other.json").write_text((tmp_path / "m.json").read_text())
    with pytest.raises(FedshiftError, match="do not belong together"):
        fedshift.load_exported(other)


def _run_scores(run_dir: Path, cid: str, kind: str = "global", client: str | None = None):
    """The scores the run's evaluation gives ``cid``'s test images (its input pipeline with
    the client's augment state, its batches), from the rebuilt run."""
    from fedshift.runtime.predictor import client_states, reference_scores

    sim = load_finished(run_dir)
    x = sim.fed.client(cid).split("test").x
    weights = sim.weights_for(client or cid, kind)
    return x, reference_scores(sim, weights, client_states(sim, cid), x, sim.exp.eval_batch_size)


def test_export_of_ampnorm_carries_the_global_amplitude(tmp_path, one_thread):
    """Issue 49: HarmoFL's amplitude normalisation transforms every test image with the
    global amplitude; the plain weights alone score differently, the predictor (model.pt2)
    gives the run's scores for every client, and says so."""
    run_dir = _run(tmp_path, "augment=[ampnorm]", rounds=2)
    done = fedshift.export_model(run_dir, tmp_path / "m.pt")
    assert done.predictor_path == tmp_path / "m.pt2" and done.config["predictor"] == "m.pt2"
    pred = fedshift.load_predictor(done.predictor_path)
    assert pred.meta["site"] == "every client"
    assert pred.meta["clients"] == ["client0", "client1", "client2"]
    plain = fedshift.load_exported(done.path)
    for cid in pred.meta["clients"]:
        x, want = _run_scores(run_dir, cid)
        labels, scores = pred.predict(x)
        assert torch.equal(labels, want.argmax(1))
        torch.testing.assert_close(scores, want)
        mean = torch.tensor(done.config["input"]["mean"]).view(1, -1, 1, 1)
        std = torch.tensor(done.config["input"]["std"]).view(1, -1, 1, 1)
        with torch.no_grad():  # what issue 49's user ran: the weights on normalised images
            assert not torch.allclose(plain((x - mean) / std), want)


def test_export_of_fedrdn_needs_the_site(tmp_path, one_thread):
    """FedRDN normalises each site with its own statistics (Eq. 8): a global model's export
    asks for the site; --client NAME gives that client's evaluation; a new site's images
    (load_predictor(site_images=...), or --site-stats DIR at export) give statistics
    computed by the augment's own rule: client1's training images reproduce client1."""
    run_dir = _run(tmp_path, "augment=[fedrdn]", rounds=2)
    with pytest.raises(FedshiftError, match=r"name a client of this run with --client NAME"):
        fedshift.export_model(run_dir, tmp_path / "m.pt")
    assert not list(tmp_path.glob("m.*"))
    done = {
        c: fedshift.export_model(run_dir, tmp_path / f"{c}.pt", client=c)
        for c in ("client0", "client1")
    }
    x1, want1 = _run_scores(run_dir, "client1")
    x0, want0 = _run_scores(run_dir, "client0")
    p0, p1 = (fedshift.load_predictor(done[c].predictor_path) for c in ("client0", "client1"))
    assert p1.meta["per_site"] == ["fedrdn"] and p1.meta["clients"] == ["client1"]
    torch.testing.assert_close(p1.scores(x1), want1)
    torch.testing.assert_close(p0.scores(x0), want0)
    assert not torch.allclose(p0.scores(x1), want1)  # client0's statistics on client1's images
    train1 = load_finished(run_dir).fed.client("client1").split("train").x
    moved = fedshift.load_predictor(done["client0"].predictor_path, site_images=train1)
    assert moved.meta["site"] == "the site of --site-stats"
    torch.testing.assert_close(moved.scores(x1), want1)


def test_export_refuses_what_the_predictor_cannot_carry(tmp_path, one_thread, monkeypatch):
    """An augment that transforms inputs at evaluation without an eval_module (a plug-in's
    eval_batch), a captured program that computes something else than the run's evaluation
    (HarmoFL's rebuild dropped) and FedSR's sampled prediction: one error naming the method
    and what is missing; nothing is written."""
    from fedshift.augment.base import Augment
    from fedshift.augment.fedrdn import FedRDNV

    run_dir = _run(tmp_path / "v", "augment=[fedrdn_v]", rounds=2)
    monkeypatch.setattr(FedRDNV, "eval_module", Augment.eval_module)
    gives_none = "augment 'fedrdn_v' transforms inputs at evaluation but gives no eval_module"
    with pytest.raises(FedshiftError, match=gives_none):
        fedshift.export_model(run_dir, tmp_path / "v.pt")
    monkeypatch.undo()
    # a program that does not compute the run's evaluation: refused by the export's check
    from fedshift.augment.ampnorm import AmplitudeRebuild

    run_dir = _run(tmp_path / "amp", "augment=[ampnorm]", rounds=2)
    monkeypatch.setattr(AmplitudeRebuild, "forward", lambda self, x: x)
    with pytest.raises(FedshiftError, match="predicts differently from the run's evaluation"):
        fedshift.export_model(run_dir, tmp_path / "amp.pt")
    run_dir = _run(tmp_path / "sr", "algorithm.name=fedsr", rounds=2)
    sampled = "algorithm 'fedsr' cannot be exported faithfully: its sampled prediction"
    with pytest.raises(FedshiftError, match=sampled):
        fedshift.export_model(run_dir, tmp_path / "sr.pt")
    assert not list(tmp_path.glob("*.pt*")) and not list(tmp_path.glob("*.json"))


def _site(seed: int, n: int = 24) -> dict:
    """A site of 28x28 uint8-valued images (in [0, 1]) whose red channel carries the label."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randint(0, 256, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    x[:, 0] = (60 + 80 * y)[:, None, None].to(torch.uint8) + x[:, 0] // 8
    x = x.float() / 255
    cut = {"train": (0, 12), "val": (12, 18), "test": (18, n)}
    return {k: (x[a:b], y[a:b]) for k, (a, b) in cut.items()}


def _pngs(folder: Path, x: torch.Tensor) -> Path:
    """``x`` (float images whose values are k / 255) as PNG files, in order."""
    from PIL import Image

    folder.mkdir(parents=True)
    for i, img in enumerate(x):
        rgb = (img * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        Image.fromarray(rgb).save(folder / f"img_{i:03d}.png")
    return folder


def test_export_and_predict_a_run_made_with_arrays(tmp_path, capsys, one_thread):
    """Issue 49: a run made with fedshift.run(config, federation=...) exports with the same
    arrays again; `fedshift predict` on a site's test images as PNG files (decoded as the
    folders dataset decodes) gives the labels of the run's own evaluation; `--site-stats DIR`
    with a site's training images gives that site's FedRDN statistics, at export and at
    prediction."""
    from fedshift.runtime.predictor import client_states, reference_scores

    data = {"a": _site(0), "b": _site(1)}
    config = {
        "model": {"name": "cnn", "width": 4},
        "augment": ["fedrdn"],
        "train": {"rounds": 2, "batch_size": 6, "local_steps": 2},
    }
    res = fedshift.run(config, federation=data, out=tmp_path / "runs")
    with pytest.raises(FedshiftError, match=r"fedshift.export_model\(run_dir, out, federation="):
        fedshift.export_model(res.run_dir, tmp_path / "x.pt", client="b")
    done = fedshift.export_model(res.run_dir, tmp_path / "b.pt", client="b", federation=data)
    sim = fedshift.load_run(res.run_dir).rebuild(federation=data)
    x = sim.fed.client("b").split("test").x
    want = reference_scores(
        sim, sim.weights_for("b", "global"), client_states(sim, "b"), x, sim.exp.eval_batch_size
    )
    images = _pngs(tmp_path / "b_test", x)
    capsys.readouterr()  # what the run printed (its logger writes to stdout after a CLI test)
    assert main(["predict", str(done.predictor_path), str(images), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["file"] for r in rows] == [str(p) for p in sorted(images.iterdir())]
    assert [r["label"] for r in rows] == [sim.fed.classes[i] for i in want.argmax(1)]
    torch.testing.assert_close(torch.tensor([r["scores"] for r in rows]), want)
    assert main(["predict", str(done.predictor_path), str(images)]) == 0
    assert capsys.readouterr().out.count("img_0") == len(x)
    # client a's predictor with b's training images as the site: b's predictions
    train_b = _pngs(tmp_path / "b_train", sim.fed.client("b").split("train").x)
    a = fedshift.export_model(res.run_dir, tmp_path / "a.pt", client="a", federation=data)
    capsys.readouterr()
    moved = main(["predict", str(a.predictor_path), str(images), "--site-stats", str(train_b)])
    assert moved == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[1] for line in lines] == [r["label"] for r in rows]
    new = fedshift.export_model(
        res.run_dir, tmp_path / "new.pt", site_stats=train_b, federation=data
    )
    assert new.config["source"]["site"] == "the site of --site-stats"
    torch.testing.assert_close(fedshift.load_predictor(new.predictor_path).scores(x), want)


@pytest.mark.parametrize(
    ("algorithm", "over"),
    [("fedbn", ()), ("fedavg", ("augment=[fedrdn]",))],
    ids=["fedbn", "fedrdn"],
)
def test_export_adabn_is_protocol_new_sites_answer(tmp_path, capsys, one_thread, algorithm, over):
    """--adabn: the model a held-out site takes (FedBN: shared layers + the sources' mean BN
    tensors; a global model as it is) with its BN statistics re-estimated on the site's
    training images, through the site's input pipeline (FedRDN: the site's own statistics):
    the predictor scores the site's test images as `fedshift protocol new-site`'s adabn
    variant does (its own functions, applied here)."""
    from fedshift.protocols.new_site import adabn, new_site_weights
    from fedshift.testing import tiny_cfg

    cfg = tiny_cfg(algorithm, "dataset.clients=3", "federation.holdout=[client2]", *over)
    run_dir = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).run_dir
    sim = load_finished(run_dir)
    site = sim.fed.client("client2")
    done = fedshift.export_model(run_dir, tmp_path / "new.pt", adabn=site.train.x)
    assert done.config["source"]["kind"] == "adabn"
    state = sim.states["client2"]
    sim.exp.algo.eval_receive(sim.exp.algo.eval_broadcast(sim.server, "client2"), state)
    if sim.exp.algo.has_global_model:
        base = sim.weights_for("client0", "global")
    else:
        base = new_site_weights(sim)
    sim.model.load_state_dict(base)

    def prep(x):
        return sim.pipeline.eval(x, state)

    assert adabn(sim.model, site.train.x, prep, sim.exp.eval_batch_size, sim.device)
    sim.model.eval()
    with torch.no_grad():
        want = sim.model(prep(site.test.x))
    got = fedshift.load_predictor(done.predictor_path).scores(site.test.x)
    assert torch.equal(got.argmax(1), want.argmax(1))
    torch.testing.assert_close(got, want)
    with pytest.raises(FedshiftError, match="drop --client"):
        fedshift.export_model(run_dir, tmp_path / "x.pt", adabn=site.train.x, client="client0")
    pngs = _pngs(tmp_path / "site", site.train.x)  # the same images as files (8-bit)
    argv = ["export", str(run_dir), "--adabn", str(pngs), "--out", str(tmp_path / "c.pt")]
    assert main(argv) == 0
    assert "(BN statistics re-estimated on its images: AdaBN)" in capsys.readouterr().out


def test_export_adabn_needs_batch_norm(tmp_path, capsys, one_thread):
    """AdaBN re-estimates BN statistics: a model without them is refused, nothing written."""
    from fedshift.testing import tiny_cfg

    cfg = tiny_cfg("fedavg", "model.norm=none")
    run_dir = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).run_dir
    x = load_finished(run_dir).fed.client("client0").train.x
    with pytest.raises(FedshiftError, match="no BatchNorm layer with running statistics"):
        fedshift.export_model(run_dir, tmp_path / "m.pt", adabn=x)
    images = _pngs(tmp_path / "site", x[:4])
    argv = ["export", str(run_dir), "--adabn", str(images), "--out", str(tmp_path / "m.pt")]
    assert main(argv) == 2
    assert "no BatchNorm layer" in capsys.readouterr().err
    assert not list(tmp_path.glob("m.*"))


def test_export_of_ampnorm_after_round_one_is_one_clients(tmp_path, one_thread):
    """After round 1 each client still rebuilds its images with its own running amplitude
    (the global one arrives with round 2's broadcast): no client evaluates as a new site
    would, so the export asks for the client, and --client gives that client's evaluation."""
    run_dir = _run(tmp_path, "augment=[ampnorm]", rounds=1)
    with pytest.raises(FedshiftError, match="no client of the run evaluates with the state"):
        fedshift.export_model(run_dir, tmp_path / "m.pt")
    done = fedshift.export_model(run_dir, tmp_path / "m.pt", client="client1")
    pred = fedshift.load_predictor(done.predictor_path)
    assert pred.meta["clients"] == ["client1"]
    x, want = _run_scores(run_dir, "client1")
    torch.testing.assert_close(pred.scores(x), want)


def test_predict_cli_segmentation_and_its_errors(tmp_path, capsys, one_thread):
    """A segmentation predictor: `fedshift predict` counts each image's pixels per class
    (the label map's argmax, as Predictor.predict gives it); a file that is not a predictor
    and --site-stats on a predictor without per-site state are one-line errors."""
    from conftest import SEG

    cfg = toy_cfg(*SEG, rounds=1)
    run_dir = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).run_dir
    done = fedshift.export_model(run_dir, tmp_path / "seg.pt")
    pred = fedshift.load_predictor(done.predictor_path)
    x = load_finished(run_dir).fed.client("client0").split("test").x[:3]
    images = _pngs(tmp_path / "imgs", x)
    labels, scores = pred.predict_files([images])[1:]
    assert scores.shape[:2] == (3, len(pred.classes)) and labels.shape == (3, *x.shape[2:])
    capsys.readouterr()  # what the run printed
    assert main(["predict", str(done.predictor_path), str(images), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row, label in zip(rows, labels, strict=True):
        counts = torch.bincount(label.flatten(), minlength=len(pred.classes)).tolist()
        assert list(row["pixels"].values()) == counts
    assert main(["predict", str(done.path), str(images)]) == 2
    err = capsys.readouterr().err
    assert "not a torch.export program" in err and len(err.strip().splitlines()) == 1
    again = ["predict", str(done.predictor_path), str(images), "--site-stats", str(images)]
    assert main(again) == 2
    assert "drop --site-stats" in capsys.readouterr().err
