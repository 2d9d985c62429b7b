# ruff: noqa: E501  (a table of commands: one entry per line reads best)
"""Every command of README.md and docs/*.md, marked: run by tests/test_docs.py (with the small
overrides that make it cheap), run by another named test, or not run and why.

A command a document gains without a mark here fails ``test_every_doc_command_is_marked``,
which prints a stub to paste; a mark whose command left the documents fails too. Marks:

* :class:`Run`: tests/test_docs.py runs it in a scratch folder (``configs/`` and
  ``benchmarks/`` linked in, an empty data cache), in document order, as written plus
  ``add`` (the cheap overrides), with the words of ``sub`` replaced (None: dropped) and
  ``*`` patterns expanded as the shell does; ``before``: commands that make its inputs.
* :class:`ByTest`: another test runs it (``test`` must exist); ``how`` says with what.
* :class:`Long`: not run, it takes ``duration`` on 2 CPU cores, which every code block that
  shows the command states next to it (checked).
* :class:`NotRun`: not run, for ``reason``: a remote SuperLink, data the user keeps, a GPU,
  a download, a server that runs until stopped, or the output of a long command before it.
* :class:`Synopsis`: a syntax summary with placeholders (``DIR``, ``N``, ``<run>``, ``...``;
  checked), never a command as written.
* :class:`Prose`: a command or option named in a sentence, not a command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the Digits benchmark made cheap: its two domains that build from package data in a second,
#: 40 training images per client
DIGITS = (
    "dataset.domains=[mnist,optdigits]",
    "dataset.train_size=40",
    "dataset.val_size=20",
    "dataset.test_size=20",
)
#: a run of one round on the cheap Digits
CHEAP = (*DIGITS, "train.rounds=1")
#: a suite or protocol grid: one seed, one process
CHEAP_GRID = (*CHEAP, "sweep.seed=[0]", "--workers", "1")


@dataclass(frozen=True)
class Run:
    add: tuple[str, ...] = ()
    sub: dict[str, str | None] = field(default_factory=dict)
    before: tuple[str, ...] = ()
    why: str = ""  # why the overrides, where they are more than "cheaper"
    #: a known failure that another change fixes (the test xfails while it fails)
    xfail: str = ""


@dataclass(frozen=True)
class ByTest:
    test: str  # tests/test_x.py::test_name
    how: str


@dataclass(frozen=True)
class Long:
    duration: str  # as the document states it, e.g. "36 min"
    note: str = ""


@dataclass(frozen=True)
class NotRun:
    reason: str


@dataclass(frozen=True)
class Synopsis:
    note: str = ""


@dataclass(frozen=True)
class Prose:
    note: str = ""


Mark = Run | ByTest | Long | NotRun | Synopsis | Prose

# reasons used more than once
REMOTE = "needs a SuperLink and SuperNodes on other machines (tests/flower/test_flower_deploy.py runs the same commands on 127.0.0.1)"
NETWORK = "installs packages from PyPI (CI installs [dev], which holds every extra)"
GPU = "needs a CUDA GPU (benchmarks/gpu_check.sh runs it on one)"
SERVER = "starts a server that runs until stopped"
SETUP = "sets up the shell; the doc test runs fedshift from the environment it runs in"
#: a results run of docs/RESULTS.md whose duration that document does not state yet
LEDGER = (
    "a results run of the claims ledger (tens of minutes to hours on 2 cores; `fedshift bench` "
    "reuses the cells committed in results/, --fresh reruns them); docs/RESULTS.md does not "
    "state its duration yet: when it does, make this a Long mark"
)
#: a duration estimated from measured per-round or per-cell times (docs/RESULTS.md's scaling
#: table, docs/parts/*-claims.md), not from a timed run of the whole command
EST = "estimated from measured per-round times"


def after(command: str) -> NotRun:
    """Reads the output of ``command``, which is too long to run here (a :class:`Long`)."""
    return NotRun(f"reads the runs of `{command}`")


# fmt: off
MARKS: dict[str, Mark] = {
    # ------------------------------------------------------------------------- README.md
    "make demo": NotRun(
        "creates .venv, builds the Digits data (apt-get download) and trains two 40-round runs: "
        "minutes on 2 cores, the time README.md's `make demo` paragraph gives"
    ),
    "make test": NotRun("the whole test suite, which this test is part of (CI runs it)"),
    "python benchmarks/suite_cost.py": ByTest(
        "tests/test_suite_cost.py::test_the_script_charges_each_test_its_cpu",
        "on one test (without arguments it runs the whole suite, which this test is part of)",
    ),
    'python benchmarks/suite_cost.py -m "not process" --write-costly tests/costly.json': ByTest(
        "tests/test_suite_cost.py::test_the_script_charges_each_test_its_cpu",
        "with --write-costly on one test (as written it runs every in-process test twice, "
        "and rewrites the committed list)",
    ),
    ". .venv/bin/activate": NotRun(SETUP),
    # the README's own-data commands, on the tree make_sites.py writes (one round, one seed)
    "python benchmarks/make_sites.py mysites": Run(),
    "fedshift data check dataset.name=folders dataset.root=mysites": Run(
        before=("python benchmarks/make_sites.py mysites",),
        why="the tree the README's prose makes first (inline commands run after the blocks)",
    ),
    "fedshift run dataset.name=folders dataset.root=mysites 'sweep.cell=[{algorithm.name: fedavg}, {algorithm.name: fedavg, augment: [fedrdn]}, {algorithm.name: fedbn}]' 'sweep.seed=[0,1,2]'": Run(
        ("train.rounds=1",), sub={"sweep.seed=[0,1,2]": "sweep.seed=[0]"}
    ),
    "fedshift report runs/run --reference fedavg": Run(),
    "fedshift export runs/run/fedavg-folders-augment=fedrdn-*-seed0-* --client hospital_a --out model.pt": Run(),
    "fedshift predict model.pt2 mysites/hospital_a/disc/0000.png": Run(),
    "fedshift list": Run(),
    "fedshift config show -c configs/demo.yaml": Run(),
    "fedshift privacy show dataset.name=toyshift algorithm.name=fedrdn": Run(),
    "fedshift run dataset.name=toyshift algorithm.name=fedavg federation.secure_aggregation=true": Run(
        ("train.rounds=1",)
    ),
    "fedshift flower simulate dataset.name=toyshift algorithm.name=harmofl federation.secure_aggregation=true --engine in-process": Run(
        ("train.rounds=1",)
    ),
    "fedshift protocol privacy dataset.name=toyshift 'augment=[fedrdn]' train.rounds=2 --sizes 2,4 --trials 10": Run(),
    "fedshift run dataset.name=toyshift 'augment=[fedrdn]' privacy.epsilon=1": ByTest(
        "tests/runtime/test_privacy_budget.py::test_the_released_statistics_differ_from_the_plain_ones_by_noise_of_the_stated_scale",
        "the same run (toyshift, FedRDN, privacy.epsilon) through the Python API; needs Opacus (the privacy extra)",
    ),
    "fedshift privacy show dataset.name=toyshift 'augment=[fedrdn]' privacy.epsilon=1": ByTest(
        "tests/runtime/test_privacy_budget.py::test_privacy_show_says_what_is_protected_and_its_noise",
        "the report and its text for the same config; needs Opacus (the privacy extra)",
    ),
    "fedshift run dataset.name=toyshift privacy.epsilon=8 privacy.updates=client federation.weighting=uniform": ByTest(
        "tests/runtime/test_dp_updates.py::test_a_protected_fedavg_run_reports_the_weights_epsilon",
        "the same run (toyshift, FedAvg, DP-FedAvg, uniform weights) through the Python API; needs Opacus (the privacy extra)",
    ),
    "fedshift privacy show dataset.name=toyshift privacy.epsilon=8 privacy.updates=client federation.weighting=uniform": ByTest(
        "tests/runtime/test_dp_updates.py::test_privacy_show_says_the_weights_are_protected_and_their_noise",
        "the report and its text for the same config; needs Opacus (the privacy extra)",
    ),
    "fedshift run dataset.name=toyshift model.name=lenet5 model.norm=none 'augment=[fedrdn]' train.batch_size=16 train.rounds=2 privacy.epsilon=4 privacy.updates=example privacy.stats_share=0.25": ByTest(
        "tests/runtime/test_dpsgd.py::test_statistics_and_dpsgd_compose_in_one_history_within_the_budget",
        "the same run (toyshift, LeNet-5 without norm layers, FedRDN, DP-SGD) through the Python API; needs Opacus (the privacy extra)",
    ),
    "fedshift privacy show dataset.name=toyshift model.name=lenet5 model.norm=none train.batch_size=16 train.rounds=1 privacy.epsilon=2 privacy.updates=example privacy.update_clip=0.5": ByTest(
        "tests/runtime/test_dpsgd.py::test_privacy_show_says_the_weights_are_protected_by_dpsgd",
        "the report and its text for the same config; needs Opacus (the privacy extra)",
    ),
    "fedshift privacy show -c CONFIG": Synopsis("CONFIG: any run config"),
    "fedshift protocol privacy -c CONFIG": Synopsis("CONFIG: a config or suite whose cells are trained and attacked"),
    "fedshift protocol privacy -c configs/suites/privacy_digits.yaml --sizes 10,50,200,350 --workers 1 --threads 1": Long("about 21 min", "measured 2026-11-29: 27 LeNet-5 runs of 10 rounds (~14 min) + the attacks (~7 min), one worker beside another suite; results/protocols/privacy_digits"),
    "fedshift protocol privacy -c configs/suites/privacy_brain_mri.yaml --sizes 2,4,8,12 --workers 1 --threads 1": Long("about 50 min", "measured 2026-11-29: 18 U-Net-16 runs of 10 rounds (~37 min beside a test suite) + the attacks (~13 min); results/protocols/privacy_brain_mri"),
    "python tests/core/test_disclosure.py": ByTest(
        "tests/core/test_disclosure.py::test_the_privacy_doc_table_is_the_declarations",
        "the test compares the table the script writes with docs/PRIVACY.md's",
    ),
    "fedshift run -c configs/demo.yaml": Run(CHEAP),
    "fedshift run -c configs/demo.yaml --jobs 2": ByTest(
        "tests/cli/test_ux.py::test_long_runs_run_jobs_equal_sequential",
        "`fedshift run --jobs 2` on a two-run sweep (two worker processes: too slow to repeat here)",
    ),
    "fedshift run algorithm.name=fedprox algorithm.mu=0.01 train.rounds=100 model.name=digitmodel":
        Run(DIGITS, {"train.rounds=100": "train.rounds=1"}),
    "fedshift run -c configs/demo.yaml 'sweep.seed=[0,1,2]'": Run((*CHEAP, "--out", "runs-seeds")),
    "fedshift run --resume runs/demo/fedbn-digits-eval.every=2-seed0-41995a81c1": Run(
        sub={"runs/demo/fedbn-digits-eval.every=2-seed0-41995a81c1": "runs/demo/fedbn-*"},
        why="the directory `fedshift run -c configs/demo.yaml` made (its name carries the overrides)",
    ),
    "fedshift run --resume runs/demo/fedbn-digits-eval.every=2-seed0-41995a81c1 train.rounds=80": Run(
        sub={"runs/demo/fedbn-digits-eval.every=2-seed0-41995a81c1": "runs/demo/fedbn-*",
             "train.rounds=80": "train.rounds=2"},
    ),
    "fedshift data show digits --out montage.png": Run(DIGITS),
    "fedshift data check digits": Run(DIGITS),
    "fedshift run dataset.name=digits partition.name=domains partition.clients=10 partition.lam=0.1 train.rounds=2": Run(
        (*DIGITS, "partition.clients=4", "train.rounds=1"), why="two domains: 4 clients"
    ),
    "fedshift data check digits partition.name=domains partition.clients=10 partition.lam=0.1": Run(
        (*DIGITS, "partition.clients=4"), why="two domains: 4 clients"
    ),
    "python benchmarks/domain_partition.py": ByTest(
        "tests/data/test_domain_partition.py::test_the_partition_figure_script",
        "on toyshift, 4 clients, lambda 0 and 1 (the digits default needs the full digits build)",
    ),
    "fedshift data check brain-mri": Run(
        ("dataset.sites=2", "dataset.size=32"), why="two small sites build in seconds"
    ),
    "fedshift data check brain-mri dataset.scanner_strength=0 --out data-check/brain-mri-s0": Run(
        ("dataset.sites=2", "dataset.size=32"), why="two small sites build in seconds"
    ),
    "python benchmarks/ampnorm_zero_start.py": Long(
        "about 2 min", "measured: two 15-round HarmoFL runs on brain-mri at 10 clients (zero vs first start), 1 min 54 s on an idle 2-core AMD EPYC"
    ),
    "python benchmarks/shift_construction.py": Long(
        "about 1 min", "four brain-mri builds (scanner strengths 0-2) and the same slices under six scanners"
    ),
    "fedshift bench configs/suites/fraug_table2.yaml": Run(
        (*CHEAP_GRID, "sweep.algorithm.name=[fedavg,fraug]"), why="two of its eight algorithms"
    ),
    "fedshift report runs/fraug_table2 --reference fedavg --screenshot": Run(
        sub={"--screenshot": None},
        why="--screenshot needs a headless Chromium, which CI does not have",
    ),
    "fedshift data fetch fashion-mnist": NotRun(
        "downloads Debian's dataset-fashion-mnist (~31 MB) with apt-get; tests/data/test_fashion.py "
        "runs the fetch on a package it builds"
    ),
    "fedshift run dataset.name=fashion-mnist partition.name=classes partition.classes_per_client=2 "
    "algorithm.name=distrans train.lr=0.005": Long("about 27 min", "measured: 32 s a round on a busy 2-core machine"),
    "fedshift run dataset.name=brain-mri model.name=unet algorithm.name=fedfa train.optimizer=adam "
    "train.lr=0.001 train.batch_size=16 train.rounds=50": Long("about 18 min", "measured: 22 s a round on a busy 2-core machine"),
    "fedshift bench configs/suites/brain_mri_table.yaml --workers 2 --threads 1": Long("~45 min"),
    "python benchmarks/flows_table.py runs/brain_mri_table": after(
        "fedshift bench configs/suites/brain_mri_table.yaml --workers 2 --threads 1"
    ),
    "python benchmarks/seg_figure.py runs/brain_mri_table/*-seed0-* --channel 1 --out sites.png":
        after("fedshift bench configs/suites/brain_mri_table.yaml --workers 2 --threads 1"),
    "fedshift run dataset.name=prostate dataset.root=/data/ProstateMRI model.name=unet "
    "algorithm.name=harmofl train.optimizer=adam train.lr=0.0001 train.rounds=500": NotRun(
        "needs the prostate MRI data on disk (docs/DATASETS.md)"
    ),
    "fedshift protocol cross-site runs/x/local-digits-seed0-04ae00ffd9": Run(
        sub={"runs/x/local-digits-seed0-04ae00ffd9": "runs/x/local-*"},
        before=("fedshift run name=x algorithm.name=local " + " ".join(CHEAP),),
    ),
    "fedshift protocol loco -c configs/demo.yaml 'sweep.algorithm.name=[fedavg,fedrdn]'":
        Run(CHEAP_GRID),
    "fedshift protocol new-site -c configs/demo.yaml 'sweep.algorithm.name=[fedavg,fedbn]' --epochs 5":
        Run(CHEAP_GRID),
    "fedshift protocol new-site -c configs/suites/new_site_digits.yaml --sites mnistm,synth --workers 2 --threads 1":
        Long("about 1 h 45 min", "measured: 84 cnn runs of 20 rounds on four domains, two at a time on 2 cores (per-method median run 80-145 s, HarmoFL ~190 s, DisTrans ~340 s: 93 min) + 84 adaptations (~10 min); results/protocols/new_site_digits"),
    "fedshift protocol new-site -c configs/suites/new_site_brain_mri.yaml --sites site6 --workers 2 --threads 1":
        Long("about 2 h", "measured: 30 U-Net runs of 50 rounds, two at a time on 2 cores (FedAvg 210-260 s, FedHEAL/FedRDN ~460 s, HarmoFL ~750 s, ELCFS 1160-1570 s: 240 min of runs) + 30 adaptations (~10 min); results/protocols/new_site_brain_mri"),
    "fedshift protocol new-site -c configs/suites/unseen_sites_digits.yaml --sites mnistm,synth --workers 2 --threads 1":
        Long("about 7 h", "measured: 252 cnn runs of 20 rounds (3 client counts x 14 methods x 2 sites x 3 seeds) two at a time on 2 cores, their wall times summing to 14.1 h (8 clients 5.9 h, 20 clients 4.2 h, 80 clients 4.0 h) over four machine sessions on two CPUs, each run adapted as it finished; results/protocols/unseen_sites_digits"),
    "fedshift protocol new-site -c configs/suites/unseen_sites_brain_mri.yaml --sites site6 --workers 2 --threads 1":
        Long("about 6.2 h", "measured: 60 U-Net runs of 50 rounds (2 client counts x 10 methods x 3 seeds) two at a time on 2 cores, their wall times summing to 12.4 h (ELCFS 1700-2600 s a run, the others 300-1200 s; ~45 min of it the runner was paused) with each run adapted as it finished; results/protocols/unseen_sites_brain_mri"),
    "fedshift protocol new-site -c configs/suites/harmofl_start_digits.yaml --sites mnistm,synth --workers 2 --threads 1":
        Long("about 18 min", "measured: 18 cnn runs of 20 rounds at 80 clients (FedAvg ~55 s, HarmoFL ~105 s a run on a 2-core AMD EPYC), two at a time, each adapted as it finished; results/protocols/harmofl_start_digits"),
    "fedshift bench configs/suites/harmofl_start_brain.yaml --workers 2 --threads 1":
        Long("about 15 min", "measured: 9 U-Net runs of 50 rounds (FedAvg 130-160 s, HarmoFL ~210 s a run on a 2-core AMD EPYC), two at a time; results/harmofl_start_brain"),
    "fedshift report results/harmofl_start_brain --reference fedavg":
        NotRun("reads the committed runs of `fedshift bench configs/suites/harmofl_start_brain.yaml --workers 2 --threads 1` in results/, which the doc test's scratch folder does not link; a few CPU seconds"),
    "fedshift protocol rounds results/harmofl_start_brain --thresholds 0.5,0.6,0.7,0.8 --split val":
        NotRun("reads the committed runs of `fedshift bench configs/suites/harmofl_start_brain.yaml --workers 2 --threads 1` in results/, which the doc test's scratch folder does not link; it reads their metrics.jsonl in ~2 CPU s"),
    "fedshift protocol new-site -c configs/suites/harmofl_start_unseen_brain.yaml --sites site6 --workers 2 --threads 1":
        Long("about 27 min", "measured: 18 U-Net runs of 50 rounds at 10 and 25 clients (FedAvg 90-125 s, HarmoFL 165-210 s a run on a 2-core AMD EPYC), two at a time, each adapted as it finished; results/protocols/harmofl_start_unseen_brain"),
    "fedshift report results/harmofl_start_unseen_brain --reference fedavg":
        NotRun("reads the committed runs of `fedshift protocol new-site -c configs/suites/harmofl_start_unseen_brain.yaml --sites site6 --workers 2 --threads 1` in results/, which the doc test's scratch folder does not link; a few CPU seconds"),
    "fedshift protocol rounds results/harmofl_start_unseen_brain --thresholds 0.5,0.6,0.7,0.8 --split val":
        NotRun("reads the committed runs of `fedshift protocol new-site -c configs/suites/harmofl_start_unseen_brain.yaml --sites site6 --workers 2 --threads 1` in results/, which the doc test's scratch folder does not link; it reads their metrics.jsonl in ~2 CPU s"),
    "fedshift protocol rounds results/new_site_brain_mri results/unseen_sites_brain_mri --thresholds 0.5,0.6,0.7,0.8 --split val":
        NotRun("reads the runs of `fedshift protocol new-site -c configs/suites/unseen_sites_brain_mri.yaml --sites site6 --workers 2 --threads 1` (and new_site_brain_mri's), committed in results/, which the doc test's scratch folder does not link; it reads their metrics.jsonl in ~5 CPU s"),
    "fedshift protocol sweep -c configs/demo.yaml --key federation.data_fraction --values "
    "0.1,0.25,0.5,1": Run((*CHEAP_GRID, "sweep.algorithm.name=[fedbn]")),
    "fedshift protocol sweep -c configs/demo.yaml --key train.local_epochs --values 1,2,5,10":
        Run((*CHEAP_GRID, "sweep.algorithm.name=[fedbn]", "--out", "protocol-sweep-epochs")),
    "fedshift protocol rounds runs/distrans_dh --thresholds 0.5,0.6": Run(
        before=("fedshift run -c configs/demo.yaml name=distrans_dh train.rounds=2 eval.every=1 "
                + " ".join(DIGITS),),
        why="a two-round sweep stands in for the suite's runs",
    ),
    "fedshift protocol tsne runs/x/local-digits-seed0-04ae00ffd9 runs/x/fedavg-digits-seed0-575922a992": Run(
        sub={"runs/x/local-digits-seed0-04ae00ffd9": "runs/x/local-*",
             "runs/x/fedavg-digits-seed0-575922a992": "runs/x/fedavg-*"},
        before=("fedshift run name=x algorithm.name=fedavg " + " ".join(CHEAP),),
    ),
    "fedshift flower simulate -c configs/demo.yaml algorithm.name=fedbn": ByTest(
        "tests/flower/test_ray_signals.py::test_sigint_and_sigterm_stop_a_ray_simulation_cleanly",
        "FedBN on Flower's Ray engine on toyshift, stopped and resumed, to the native numbers "
        "(Ray's start-up alone takes about 30 s)",
    ),
    "fedshift flower local -c configs/demo.yaml algorithm.name=fedfa": ByTest(
        "tests/flower/test_flower_deploy.py::test_supernodes_match_native",
        "the same local deployment (TLS, SuperNode authentication, one SuperNode per client) on "
        "toyshift, FedBN with FedFA's FFA layers",
    ),
    "fedshift flower local --resume RUN_DIR --dir DIR": ByTest(
        "tests/flower/test_flower_local_stop.py::"
        "test_sigint_and_sigterm_stop_every_process_and_the_run_continues",
        "flower local stopped by SIGTERM and by SIGINT, each time continued with the command it "
        "printed, to the native run's numbers",
    ),
    "fedshift flower certs certs/ --host superlink.example.org": Run(),
    "fedshift flower keys keys/ site1": Run(),
    "fedshift flower submit -c my.yaml --superlink superlink.example.org:8000 --root-cert "
    "certs/ca.crt --nodes 6": NotRun(REMOTE),
    "apt-get download": Prose(),
    "pip install .": ByTest(
        "tests/test_packaging.py::test_wheel_runs_in_a_clean_venv_without_extras",
        "the wheel `pip install .` builds, installed into a fresh venv",
    ),
    "fedshift run -c demo": Run((*CHEAP, "--out", "runs-by-name")),
    "fedshift bench fedrdn_table1": Run(
        (*CHEAP_GRID, "sweep.augment=[[fedrdn]]"), why="one of its four augment columns"
    ),
    "fedshift --version": Run(),
    "python tests/test_docs.py --list": ByTest(
        "tests/test_docs.py::test_the_list_prints_every_command_and_how_it_is_covered",
        "as written, from the clone's root",
    ),
    "fedshift run --resume DIR": Synopsis(),
    "pip install 'fedshift[tensorboard]'": NotRun(NETWORK),
    "pip install fedshift-*.whl": ByTest(
        "tests/test_packaging.py::test_wheel_runs_in_a_clean_venv_without_extras",
        "the wheel built from this tree, installed into a fresh venv",
    ),
    "fedshift run dataset.name=toyshift train.rounds=5": ByTest(
        "tests/test_packaging.py::test_wheel_runs_in_a_clean_venv_without_extras",
        "as written, in a fresh venv holding the wheel, outside the clone",
    ),
    "fedshift docs": Run(),
    "fedshift docs usage": Run(),
    "fedshift cache list": Run(),
    "fedshift cache clean --dry-run": Run(),
    "apt-get update": Prose("what --apt-update runs"),
    "pip install 'fedshift[digits]'": NotRun(NETWORK),
    "pip install 'fedshift[privacy]'": NotRun(NETWORK),
    "pip install 'fedshift[pretrained]'": NotRun(NETWORK),
    "fedshift data fetch opencv": NotRun(
        "downloads Debian's opencv-doc with apt-get; tests/data/test_digits.py runs the fetch with a "
        "stand-in apt-get"
    ),
    "fedshift data build digits": Run(
        ("domains=[mnist,optdigits]",), why="the two domains that need no download"
    ),
    "fedshift export RUN_DIR --out model.pt": Synopsis(),
    "tensorboard --logdir runs": NotRun(SERVER),
    "fedshift run dataset.name=toyshift model.name=lenet5 train.rounds=30 "
    "'sweep.algorithm.name=[fedavg,scaffold]' 'track=[tensorboard]'": Run(
        sub={"train.rounds=30": "train.rounds=2"}
    ),
    "pip install 'fedshift[wandb]'": NotRun(NETWORK),
    "pip install 'fedshift[mlflow]'": NotRun(NETWORK),
    "wandb sync <run>/wandb/offline-run-*": Synopsis("uploads to W&B's servers"),
    "mlflow ui --backend-store-uri sqlite:///<run>/mlflow/mlflow.db": Synopsis(SERVER),
    "fedshift run --workers N": Synopsis(),
    "bash benchmarks/gpu_check.sh": NotRun(GPU),
    "fedshift run --resume": Prose(),
    "fedshift protocol loco|new-site|sweep": Prose("the protocols that take --fresh"),
    "fedshift claims collect --protocol": Prose(),
    "fedshift run --jobs N": Synopsis(),
    "python benchmarks/faults.py": Long("~6 min"),
    "fedshift run algorithm.name=fedbn 'augment=[fedrdn]'": Run(CHEAP),
    "fedshift run algorithm.name=fedfa 'augment=[fedrdn]'": Run(CHEAP),
    "sudo apt-get install dataset-fashion-mnist": NotRun(
        "installs a Debian package (root, network); `fedshift data fetch fashion-mnist` is the "
        "alternative without installing"
    ),
    "fedshift bench SUITE": Synopsis(),
    # -------------------------------------------------------------------- ARCHITECTURE.md
    "fedshift bench SUITE.yaml": Synopsis(),
    "fedshift report RUN_DIR... [--reference ALGO[/FLOW]] [--screenshot]": Synopsis(),
    "fedshift protocol ...": Synopsis(),
    "fedshift protocol <name>": Synopsis(),
    "fedshift protocol <study>": Synopsis(),
    "example: new-algorithm": ByTest(
        "tests/algorithms/test_halves.py::test_the_architecture_example_is_a_working_algorithm",
        "the snippet executed as written, registered in-process, then checked and built",
    ),
    "example: new-transport": ByTest(
        "tests/runtime/test_transports.py::test_the_architecture_example_is_a_working_transport",
        "the snippet executed as written, registered in-process, then a run selects it",
    ),
    "example: new-study": ByTest(
        "tests/studies/test_studies.py::test_the_architecture_example_is_a_working_study",
        "the snippet executed as written, registered in-process, then its generated command run",
    ),
    # ------------------------------------------------------------------------- DATASETS.md
    # the generic loaders: each snippet makes a tiny tree in the scratch folder, the
    # commands after it run on it (two rounds of a small model: seconds)
    "fedshift data show NAME root=DIR": Synopsis(),
    "example: make-folders": Run(),
    "fedshift data show folders root=mydata size=28": Run(),
    "fedshift run dataset.name=folders dataset.root=mydata train.rounds=2": Run(),
    "fedshift run dataset.name=folders dataset.root=DIR": ByTest(
        "tests/data/test_folders_defaults.py::test_fedshift_run_folders_as_typed_trains",
        "the command as typed on a generated three-site tree (one round)",
    ),
    "example: make-segfolders": Run(),
    "fedshift run dataset.name=segfolders dataset.root=myseg 'dataset.labels=[0,255]' dataset.size=16 model.name=unet model.width=8 train.rounds=2": Run(),
    "example: make-arrays": Run(),
    "fedshift run dataset.name=arrays dataset.root=myarrays model.name=cnn train.rounds=2": Run(),
    "example: arrays-from-python": Run(),
    # -------------------------------------------------------------------------- DEPLOY.md
    "fedshift flower local -c configs/demo.yaml algorithm.name=fedbn": ByTest(
        "tests/flower/test_flower_deploy.py::test_supernodes_match_native",
        "the same local deployment on toyshift, FedBN with FedFA's FFA layers",
    ),
    "fedshift flower certs certs/ --host superlink.example.org --host 10.0.0.5": Run(),
    "flower-superlink --host 0.0.0.0 --port 8000 --ssl-ca-certfile certs/ca.crt --ssl-certfile "
    "certs/server.pem --ssl-keyfile certs/server.key --enable-supernode-auth "
    "--disable-runtime-dependency-installation --database superlink.db": NotRun(REMOTE),
    "flwr supernode register keys/site1.pub fedshift --name site1": NotRun(REMOTE),
    "flwr supernode ls fedshift": NotRun(REMOTE),
    "flower-supernode --superlink superlink.example.org:8000 --root-certificates ca.crt "
    "--auth-supernode-private-key keys/site1 --node-config \"client='BIDMC' "
    "dataset.root='/data/ProstateMRI' state-dir='/var/lib/fedshift'\"": NotRun(
        REMOTE + "; and the site's prostate data"
    ),
    "fedshift flower submit -c configs/my_prostate.yaml train.rounds=100 --superlink "
    "superlink.example.org:8000 --root-cert certs/ca.crt --nodes 6 --out /srv/fedshift/runs":
        NotRun(REMOTE),
    "make install": NotRun("creates .venv and installs [dev] from PyPI (`make test` does it first)"),
    "pip install -e '.[flower]'": NotRun(NETWORK),
    "uv sync": Prose("what Flower would do without --disable-runtime-dependency-installation"),
    "flwr run": Prose(),
    "fedshift flower app DIR -c CONFIG --nodes 6": Synopsis(),
    "flwr run DIR fedshift": Synopsis(REMOTE),
    "flwr run ... --run-config \"resume='runs/my/fedfa-prostate-seed0-<digest>'\"": Synopsis(REMOTE),
    "flwr run DIR local --federation-config \"num-supernodes=N\" --stream": Synopsis(
        "runs the generated app on Flower's local simulation (Ray, a background SuperLink): tests/flower/test_flower_app.py checks the app, its README's command and the refusal of another SuperNode count"
    ),
    "flwr federation simulation-config": Prose(),
    "fedshift flower simulate --resume RUN_DIR": Synopsis(),
    "python benchmarks/flower_vs_native.py -c CONFIG": Synopsis(),
    # ----------------------------------------------------------------------- EXTENDING.md
    "example: mymethods.py": ByTest(
        "tests/test_extending.py::test_extending_guide_example_runs_by_name_from_outside_the_package",
        "the module written from this page, run by module:Class name",
    ),
    "example: myaugments.py": ByTest(
        "tests/test_extending.py::test_extending_guide_example_runs_by_name_from_outside_the_package",
        "the module written from this page, run by module:Class name",
    ),
    "python -m fedshift run algorithm.name=mymethods:FadingProx algorithm.mu=0.05 "
    "dataset.name=toyshift train.rounds=2": ByTest(
        "tests/test_extending.py::test_extending_guide_example_runs_by_name_from_outside_the_package",
        "this command, with the method and the augment of this page",
    ),
    "python -m fedshift run 'augment=[\"myaugments:Jitter\"]' dataset.name=toyshift train.rounds=2":
        ByTest(
            "tests/test_extending.py::test_extending_guide_example_runs_by_name_from_outside_the_package",
            "this command, with the method and the augment of this page",
        ),
    "python -m fedshift": Prose(),
    "example: fedshift-mylab/src/mylab/models.py": ByTest(
        "tests/test_extending.py::test_extending_plugin_package_from_the_guide_installs_lists_and_runs",
        "the package built from this page, installed into a fresh venv, run by name",
    ),
    "pip install -e .": ByTest(
        "tests/test_extending.py::test_extending_plugin_package_from_the_guide_installs_lists_and_runs",
        "the package's wheel installed into a fresh venv (what `pip install .` does)",
    ),
    "fedshift run algorithm.name=fadingprox 'augment=[jitter]' model.name=mynet "
    "dataset.name=toyshift train.rounds=2": ByTest(
        "tests/test_extending.py::test_extending_plugin_package_from_the_guide_installs_lists_and_runs",
        "as written, in the venv the package is installed in",
    ),
    "example: mydatasets.py": ByTest(
        "tests/data/test_dataset_plugins.py::test_the_guide_dataset_runs_by_module_class",
        "the module written from this page, run by module:Class name",
    ),
    "python -m fedshift run dataset.name=mydatasets:Stripes dataset.clients=3 model.name=cnn "
    "train.rounds=1": ByTest(
        "tests/data/test_dataset_plugins.py::test_the_guide_dataset_runs_by_module_class",
        "as written, with the module written from this page",
    ),
    "example: fedshift-mylab/tests/test_contract.py": ByTest(
        "tests/test_extending.py::test_extending_plugin_package_from_the_guide_installs_lists_and_runs",
        "run with pytest in the package's venv",
    ),
    "fedshift export runs/demo/fedavg-digits-seed0 --out model.pt": Run(
        sub={"runs/demo/fedavg-digits-seed0": "runs/demo/fedavg-*"},
        before=("fedshift run -c configs/demo.yaml " + " ".join(CHEAP),),
    ),
    "fedshift export runs/demo/fedbn-digits-seed0 --client mnist --out fedbn-mnist.pt": Run(
        sub={"runs/demo/fedbn-digits-seed0": "runs/demo/fedbn-*"}
    ),
    "example: export.py": Run(),
    "example: predictor.py": Run(why="loads the model.pt2 the export above wrote"),
    "fedshift export RUN_DIR --site-stats DIR --out model.pt": ByTest(
        "tests/runtime/test_export.py::test_export_and_predict_a_run_made_with_arrays",
        "fedshift.export_model(..., site_stats=DIR) on a folder of a site's PNG images",
    ),
    "fedshift export RUN_DIR --adabn DIR --out new-site.pt": ByTest(
        "tests/runtime/test_export.py::test_export_adabn_is_protocol_new_sites_answer",
        "fedshift.export_model(..., adabn=images) against protocol new-site's own functions",
    ),
    "fedshift predict model.pt2 IMAGES...": ByTest(
        "tests/runtime/test_export.py::test_export_and_predict_a_run_made_with_arrays",
        "on a folder of a site's test images as PNG files, against the run's evaluation",
    ),
    "fedshift predict --site-stats DIR": ByTest(
        "tests/runtime/test_export.py::test_export_and_predict_a_run_made_with_arrays",
        "another site's predictor given this site's training images as PNG files",
    ),
    "example: from-python": Run(
        sub={
            '"algorithm.name=mymethods:FadingProx"]': '"algorithm.name=mymethods:FadingProx", '
            + ", ".join(f'"{w}"' for w in CHEAP)
            + "]"
        },
    ),
    "PYTHONPATH=/path/to/folder fedshift run ...": Synopsis(),
    "fedshift flower simulate --resume": Prose(),
    # ------------------------------------------------------------------------- RESULTS.md
    "python benchmarks/faults.py --part inputs": Long("~9 min", "59 cases against real processes, 2 of them start Ray"),
    "python benchmarks/pretrained.py --out results/benchmarks/pretrained_sites --seeds 3 --rounds 10 --images 40": Long(
        "~17 min", "21 runs of EfficientNet-Lite0 on three sites, 10 rounds each"
    ),
    "python benchmarks/privacy_price.py --datasets toyshift --methods fedavg,fedrdn --eps 1,inf --seeds 0 --rounds 1 --out /tmp/pp": ByTest(
        "tests/test_privacy_price.py::test_the_grid_runs_refuses_and_resumes_on_toyshift",
        "the script's grid function on toyshift, one round (FedAvg and FedFA at eps 1 and inf): run, refused, resumed, written",
    ),
    "python benchmarks/privacy_price.py --datasets digits --rounds 3 --out results/benchmarks/privacy_price_digits": Long(
        "about 10 min idle", "measured 2026-11-29 (re-run after the BatchNorm variance floor): 75 LeNet-5 runs of 3 rounds whose times sum to 9 min on the idle 2-core machine (two processes sharing --out: about 5 min wall) + 15 refusals; results/benchmarks/privacy_price_digits"
    ),
    "python benchmarks/privacy_price.py --datasets brain-mri --rounds 3 --out results/benchmarks/privacy_price_brain_mri": Long(
        "about 100 min of runs", "measured 2026-11-29: 66 U-Net-16 runs of 3 rounds (9 diverged at round 1) whose times sum to 101 min on the 2-core machine, mostly beside other work (two to three processes sharing --out) + 15 refusals; results/benchmarks/privacy_price_brain_mri"
    ),
    "python benchmarks/privacy_price.py --datasets digits --rounds 3 --updates example --out results/benchmarks/privacy_price_digits_example": Long(
        "about 50 min", "measured 2026-11-29: 42 LeNet-5 runs of 3 rounds (model.norm=none, DP-SGD at a finite eps) whose times sum to 49 min on a 2-core machine at load 6-10 (run as 2 processes sharing --out: 26 min wall) + 48 refusals; results/benchmarks/privacy_price_digits_example"
    ),
    "python benchmarks/privacy_price.py --datasets digits --rounds 3 --updates example --set train.optimizer=adam --set train.lr=0.001 --out results/benchmarks/privacy_price_digits_example_adam": Long(
        "about 40 min", "measured 2026-11-29: 42 LeNet-5 runs of 3 rounds (Adam, model.norm=none, DP-SGD at a finite eps) whose times sum to 38.5 min + 48 refusals, run as 2 processes sharing --out in two steps (eps 1,8,inf, then the rest: 20.5 min wall); results/benchmarks/privacy_price_digits_example_adam"
    ),
    "python benchmarks/privacy_price.py --out runs/privacy_price": Long(
        "about 6 h", "estimated from the 3-round cells' times and privacy_brain_mri's U-Net runs: 150 runs of 10 rounds, digits and brain-mri"
    ),
    "python benchmarks/pretrained.py --seeds 3 --rounds 10 --images 40 --only 'pretrained, lora' --out results/benchmarks/pretrained_sites_lora": Long(
        "~45 min", "3 runs of EfficientNet-Lite0 with LoRA, 10 rounds each, on a loaded machine (~3 CPU minutes)"
    ),
    "python benchmarks/pretrained.py --dataset digits --size 48 --images 20 --eval-images 20 --rounds 3 --seeds 3 --jobs 8 --out results/benchmarks/pretrained_digits": Long(
        "~20 min", "21 runs of EfficientNet-Lite0 on the five digits domains upsampled to 48x48, on a loaded machine"
    ),
    "python benchmarks/pretrained.py --dataset digits --size 48 --images 20 --eval-images 20 --rounds 3 --seeds 3 --jobs 7 --holdout mnistm --out results/benchmarks/pretrained_digits_loo": Long(
        "~20 min", "18 runs of EfficientNet-Lite0 on digits with mnistm held out, on a loaded machine"
    ),
    "python benchmarks/pretrained.py --dataset digits --size 32 --images 100 --eval-images 50 --rounds 5 --seeds 3 --jobs 2 --out results/benchmarks/pretrained_digits_100": Long(
        "40 min", "21 runs of EfficientNet-Lite0 on the five digits domains upsampled to 32x32, 5 rounds, on a loaded machine (755 CPU s, 39 min 41 s measured)"
    ),
    "python benchmarks/make_sites.py runs/sites64 --images 40 --side 64": Run(),
    "fedshift protocol new-site -c configs/suites/pretrained_sites_new_site.yaml dataset.root=runs/sites64 --workers 1 --threads 1": Long(
        "~75 min", "54 EfficientNet-Lite0 runs of 10 rounds (6 variants x 3 held-out sites x 3 seeds) and their adaptations, on a loaded machine (43 min for 27 cells, 13 min for LoRA's 9, ~18 min for scratch's and bn+head's 18); results/protocols/pretrained_sites_new_site"
    ),
    "python benchmarks/data_scale.py": Long(
        "~20 min", "3.3 GB of generated PNGs decoded once, then three one-round runs"
    ),
    "python benchmarks/engine_overhead.py": Long("~4 min", "measured 2026-11-29 on the idle machine: 3 x 2 runs of 32-58 s plus a warm-up"),
    "python benchmarks/scaling.py": Long("~6 min"),
    "python benchmarks/executors.py --clients 10,100 --rounds 2": Long("~2 min", EST),
    "python benchmarks/executors.py --device cuda --clients 10,100 --rounds 3": NotRun(GPU),
    "python benchmarks/executors.py --device cuda --clients 10,100 --rounds 3 --train-size 50000":
        NotRun(GPU),
    "python benchmarks/flower_vs_native.py -c configs/demo.yaml algorithm.name=fedbn "
    "train.rounds=10 'sweep={}'": Long("about 3 min", "the table's three wall times plus warm-ups"),
    "python benchmarks/determinism.py": Long("~3 min", EST),
    "STEPS=profile bash benchmarks/gpu_check.sh": NotRun(GPU),
    "python benchmarks/determinism.py device=cuda dataset.name=fashion-mnist "
    "partition.name=dirichlet partition.clients=10 model.name=cnn train.rounds=40 eval.every=5":
        NotRun(GPU),
    # ---------------------------------------- RESULTS.md: the suites behind the claims ledger
    'make check': NotRun("the test suite without its process-level tests (`make test` is the whole suite, which CI runs)"),
    'fedshift claims collect runs/SUITE --command "..."': Synopsis(),
    'python benchmarks/kernel_paths.py': Long("~15 min", "4 kernel paths x make demo's two runs at once, ~3.5 min each"),
    "fedshift bench configs/demo.yaml 'sweep.seed=[0,1,2]' --workers 2": NotRun(LEDGER),
    'fedshift bench configs/suites/fedbn_digits_paper.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fraug_table2_paper.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedrdn_table1.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedrdn_table1_converged.yaml --workers 2 --threads 1': NotRun(LEDGER),
    'fedshift bench configs/suites/distrans_dh_converged.yaml --workers 2 --threads 1': NotRun(LEDGER),
    'fedshift bench configs/suites/fraug_table2_converged.yaml --workers 2 --threads 1': NotRun(LEDGER),
    'fedshift bench configs/suites/harmofl_table1_converged.yaml --workers 2 --threads 1': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/fedfa_table4_loco_converged.yaml --workers 2 --threads 1': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_table1_converged.yaml device=cuda --workers 6 --threads 1': NotRun(GPU),
    'fedshift bench configs/suites/fedrdn_table2_brain.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedrdn_table3_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol cross-site RUN --kind local': Synopsis(),
    'fedshift bench configs/suites/fedrdn_table4_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol sweep -c configs/suites/fedrdn_fig2_digits.yaml --key train.local_epochs --values 1,2,5 --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_table1.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_table3_labelskew.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/fedfa_table4_loco.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_variants.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_table6_augment.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_table8_stages.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedfa_fig2_fraction.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/brain_mri_table.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/harmofl_table1.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/harmofl_ablation.yaml --workers 2': NotRun(LEDGER),
    "fedshift protocol sweep -c configs/suites/harmofl_ablation.yaml --key algorithm.rho --values 1,0.5,0.05,0.005 'sweep={seed: [0, 1, 2]}' --workers 2": NotRun(LEDGER),
    'fedshift protocol sweep -c configs/suites/harmofl_fig5b.yaml --key train.local_epochs --values 1,4 --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/harmofl_holdout.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol head-finetune -c configs/suites/fraug_table1_digits.yaml --workers 2': Long("about 3 min", "measured: 2 min 41 s on a busy 2-core machine, Digits cached"),
    'fedshift bench configs/suites/fraug_table2.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fraug_ablation.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fraug_fig2_fraction.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/distrans_dh.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/distrans_fig4_alpha.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/distrans_fig5_epochs.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/baselines_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/digits_methods.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/fedsr_loco.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/fediir_loco.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/feddg_ga_loco.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedheal_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/adcol_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fpl_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedwon_digits.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/fedwon_loco.yaml --workers 2': NotRun(LEDGER),
    'fedshift bench configs/suites/fedwon_small_batch.yaml --workers 2': NotRun(LEDGER),
    'fedshift protocol loco -c configs/suites/elcfs_brain_loco.yaml --workers 2': NotRun(LEDGER),
}
# fmt: on
