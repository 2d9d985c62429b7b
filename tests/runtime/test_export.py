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


@pytest.mark.parametrize("augment", ["fedrdn", "ampnorm"])
def test_export_refuses_a_model_whose_inputs_need_the_runs_state(tmp_path, one_thread, augment):
    """Issue 49: FedRDN's site statistics and HarmoFL's global amplitude transform every
    input at evaluation; the weights alone predict differently, so export writes nothing."""
    run_dir = _run(tmp_path, f"augment=[{augment}]", rounds=2)
    out = tmp_path / "m.pt"
    with pytest.raises(FedshiftError, match=f"augment '{augment}' transforms every input"):
        fedshift.export_model(run_dir, out)
    assert not out.exists() and not out.with_suffix(".json").exists()
