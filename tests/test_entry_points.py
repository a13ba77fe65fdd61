"""run_spec.py and train_draft.py as a person meets them: a bad value stops the command at once with one line
naming the key (exit status 2, nothing loaded, nothing in the run directory touched); `--help` lists the
script's own groups and keys; SIGINT and SIGTERM keep what finished; progress bars and a closing summary."""

from __future__ import annotations

import json
import logging
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a run of seconds on CPU: tiny random weights, random prompts, a random EAGLE-1 head
TINY_RUN = ["target=random_llama3_8b", "target.random=tiny_llama", "target.name=tiny", "data=synthetic",
            "data.prompt_len=16", "draft=eagle1", "draft.random_init=true", "hardware=cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}


@pytest.fixture(scope="module")
def warm():
    """What a process pays once before its first check of a good config: torch's imports and SmolLM2's GGUF
    header (2.6 s, cached per file). A fresh process's bad value costs neither (the subprocess test below)."""
    from hydra import compose, initialize_config_dir

    from eaglet.runner.config import validate_run_spec

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        validate_run_spec(compose("run_spec", overrides=["hardware=cpu", "gen.batch_size=1"]))


@pytest.fixture
def cli(monkeypatch, capsys, tmp_path, warm):
    """cli(script, *overrides) -> (exit status, stdout, stderr, seconds in the config check) of the script run as
    __main__ in this process, with every model loader made to fail the test, and the machine's memory fixed at
    24 GiB. The whole call (Hydra's composition included) must take under 5 s."""
    from hydra.core.global_hydra import GlobalHydra

    import eaglet.models.llama as llama
    import eaglet.runner.config as config
    import eaglet.runner.run as run
    import eaglet.training.config as train_config

    checking = []
    for module, name in ((config, "validate_run_spec"), (train_config, "validate_train_draft")):
        def timed(*a, _check=getattr(module, name), **k):
            t0 = time.perf_counter()
            try:
                return _check(*a, **k)
            finally:
                checking.append(time.perf_counter() - t0)

        monkeypatch.setattr(module, name, timed)

    def loader(*a, **k):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(llama.Transformer, "from_pretrained", loader)
    monkeypatch.setattr(run, "random_target", loader)
    monkeypatch.setattr(config, "free_memory", lambda device: (24 * 2**30, "this machine has 24.0 GiB available"))

    def call(script: str, *overrides: str):
        monkeypatch.setattr(sys, "argv", [f"{script}.py", *overrides])
        GlobalHydra.instance().clear()
        capsys.readouterr()
        checking.clear()
        root = logging.getLogger()  # Hydra configures its own logging on the root logger while composing
        handlers, level = root.handlers[:], root.level
        t0 = time.perf_counter()
        try:
            with pytest.raises(SystemExit) as e:
                runpy.run_path(str(REPO / f"{script}.py"), run_name="__main__")  # python <script>.py <overrides>
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
        assert time.perf_counter() - t0 < 5.0
        out = capsys.readouterr()
        return e.value.code, out.out, out.err, sum(checking)

    return call


def previous_run(run_dir: Path) -> dict[str, str]:
    """A finished run's files in run_dir -> their contents (a refused run must leave them as they are)."""
    files = {"metrics.json": json.dumps({"finished": True, "tokens_per_s": 1.0}),
             "outputs.jsonl": json.dumps({"prompt_id": "1", "text": "an answer"}) + "\n",
             ".hydra/config.yaml": "seed: 0\n"}
    for name, text in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    return files


def contents(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): p.read_text() for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def empty_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "empty.jsonl"
    path.write_text("\n\n")
    return path


@pytest.fixture(scope="module")
def bad_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "bad.jsonl"
    path.write_text('{"prompt": "hi"}\n{"prompt": \n')
    return path


# (overrides, the key the one line names). The list first, then what already stopped cleanly.
RUN_SPEC_BAD = [
    (["data=jsonl", "data.path={empty_jsonl}"], "data.path"),
    (["data.limit=0"], "data.limit"),
    (["gen.max_new_tokens=0"], "gen.max_new_tokens"),
    (["gen.max_new_tokens=-1"], "gen.max_new_tokens"),
    (["gen.max_new_tokens=abc"], "gen.max_new_tokens"),
    (["gen.batch_size=0"], "gen.batch_size"),
    (["target=random_llama3_8b", "data=synthetic", "draft=none", "hardware=cpu"], "target"),  # ~31 GiB > 24 GiB
    (["gen.max_new_tokens=4096"], "gen.max_new_tokens"),
    (["gen.batch_size=200"], "target"),  # the KV pools do not fit
    (["data=jsonl"], "data.path"),
    (["data=jsonl", "data.path=/no/such/prompts.jsonl"], "data.path"),
    (["data=jsonl", "data.path={bad_jsonl}"], "data.path"),
    (["data.max_turns=0"], "data.max_turns"),
    (["target=llama3_8b", "draft=none"], "target.path"),
    (["target.path=/no/such/model"], "target.path"),
    (["target=random_llama3_8b", "draft=none"], "data"),
    (["target=random_llama3_8b", "target.random=nope", "data=synthetic", "draft=none"], "target.random"),
    (["draft=multi_layer"], "draft.path"),
    (["draft.path=/no/such/head"], "draft.path"),
    (["draft.path={empty_dir}"], "draft.path"),  # a folder without config.json and weights
    (["draft=ngram", "draft.n_min=5"], "draft.n_min"),  # above n_max
    (["target=random_llama3_8b", "data=synthetic", "draft=block"], "draft.path"),  # no block drafter shipped for it
    (["draft=block", "draft.path={empty_dir}"], "draft.path"),
    (["draft=block", "draft.path={shipped_eagle3}"], "draft"),  # an EAGLE-3 head
    (["draft=block", "draft.random_init=true", "draft.block_size=1"], "draft.block_size"),
    (["draft=block", "draft.random_init=true", "tree.steps=8"], "tree.steps"),  # a block of 8 drafts 7 depths
    (["draft=block", "draft.random_init=true", "draft.draft_vocab_size=0"], "draft.draft_vocab_size"),
    (["draft=block", "draft.random_init=true", "draft.draft_vocab_size=50000"], "draft.draft_vocab_size"),  # > 49,152
    (["tree.root_children=0"], "tree.root_children"),
    (["tree.root_children=3"], "tree.root_children"),  # fewer than tree.topk's 4 kept at depth 1
    (["draft=eagle3", "tree.root_children=8"], "tree.root_children"),  # an EAGLE head gives the root topk children
    (["draft.ngram_branches=-1"], "draft.ngram_branches"),
    (["draft.ngram_branches=17"], "draft.ngram_branches"),  # more matches than the n-gram kernel follows
    (["draft=block", "draft.random_init=true", "draft.ngram_branches=17"], "draft.ngram_branches"),  # any drafter's
    (["draft=ngram", "+draft.ngram_branches=2"], "draft.ngram_branches"),  # its tree is n-gram matches already
    (["draft.ngram_depth=0"], "draft.ngram_depth"),
    (["draft.ngram_depth=65"], "draft.ngram_depth"),  # past the trie merge kernel's 64 nodes
    # tree=simulate's chain is 7 deep: at most 8 tokens a step
    (["draft=eagle3", "tree=simulate", "tree.simulate.tau=8.5", "draft.random_init=true"], "tree.simulate.tau"),
    (["draft.drafter=medusa"], "draft.drafter"),
    (["draft=eagle1", "draft.path={shipped_eagle3}"], "draft"),
    (["tree.num_draft_tokens=200"], "tree.num_draft_tokens"),  # 7/4 trees hold 101 at most
    (["tree=simulate", "tree.simulate.tau=17", "draft.random_init=true"], "tree.simulate.tau"),  # depth 15: 16 at most
    (["tree.steps=0"], "tree.steps"),
    (["stream=unsafe_no_sync"], "stream"),
    (["hardware.device=gpu"], "hardware.device"),
    (["hardware.dtype=int8"], "hardware.dtype"),
    (["gen.temperature=-1"], "gen.temperature"),
    (["gen.top_p=0"], "gen.top_p"),
    (["gen.compare_ar=maybe"], "gen.compare_ar"),
    (["kv.page_size=0"], "kv.page_size"),
    (["kv.num_pages=1"], "kv.num_pages"),
    (["logger.mode=sometimes"], "logger.mode"),
    (["seed=abc"], "seed"),
    (["print_answers=-1"], "print_answers"),
]
if not __import__("torch").cuda.is_available():
    RUN_SPEC_BAD.append((["hardware=cuda"], "hardware.device"))


def _fill(overrides: list[str], **paths) -> list[str]:
    return [o.format(**paths) for o in overrides]


@pytest.mark.parametrize("overrides,key", RUN_SPEC_BAD, ids=[" ".join(o) for o, _ in RUN_SPEC_BAD])
def test_a_bad_run_spec_value_stops_at_once_in_one_line(cli, tmp_path, empty_jsonl, bad_jsonl, overrides, key):
    run_dir = tmp_path / "run"
    before = previous_run(run_dir)
    shipped = REPO / "heads" / "smollm2_135m_eagle3"
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    code, out, err, seconds = cli("run_spec", *_fill(overrides, empty_jsonl=empty_jsonl, bad_jsonl=bad_jsonl,
                                                       shipped_eagle3=shipped, empty_dir=empty_dir),
                                  f"hydra.run.dir={run_dir}")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}="), lines[0]
    assert "Traceback" not in err + out
    assert contents(run_dir) == before  # the previous run's results and config, untouched
    assert seconds < 1.0


TRAIN_BAD = [
    (["train.batch_size=0"], "train.batch_size"),
    (["train.steps=0"], "train.steps"),
    (["train.steps=-5"], "train.steps"),
    (["train.steps=abc"], "train.steps"),
    (["train.resume=/no/such/run"], "train.resume"),
    (["train.resume=null"], "train.resume"),  # the run dir holds another run's checkpoints
    (["train/head=multi_layer", "train.head.ttt_length=2"], "train.head.ttt_length"),
    (["train.head.accept_weight=-1"], "train.head.accept_weight"),
    (["train/head=block", "train.head.block_size=1"], "train.head.block_size"),
    (["train/head=block", "train.head.target_layer_ids=[5,2]"], "train.head.target_layer_ids"),
    (["train/head=block", "train.head.block_size=4"], "tree.steps"),  # the evaluation's tree: 5 depths
    (["train/head=block", "train.head.draft_vocab_size=0"], "train.head.draft_vocab_size"),
    (["train/head=block", "train.head.resize_vocab=true"], "train.head.resize_vocab"),  # needs init_from
    (["train.fsdp=true"], "train.fsdp"),
    (["train.head.resize_vocab=true"], "train.head.resize_vocab"),
    (["train/head=eagle1", "+train.head.resize_vocab=true", "train.head.init_from={run}"], "train.head.resize_vocab"),
    (["train.optim.betas=[0.9]"], "train.optim.betas"),
    (["train.optim.lr=-1"], "train.optim.lr"),
    (["train.stop_at_step=5000"], "train.stop_at_step"),
    (["data.source=web"], "data.source"),
    (["data.regen.samples=2"], "data.regen.samples"),
    (["data.limit=0"], "data.limit"),
    (["data.source=synthetic", "data.synthetic.num=2"], "data.synthetic.num"),
    (["target=random_llama3_8b"], "data.source"),
    (["target=random_llama3_8b", "data.source=synthetic", "hardware=cpu"], "target"),  # ~62 GiB > 24 GiB
    (["features.mode=cached"], "features.mode"),
    (["eval.data=gsm8k"], "eval.data"),
    (["eval.every=-1"], "eval.every"),
]


@pytest.mark.parametrize("overrides,key", TRAIN_BAD, ids=[" ".join(o) for o, _ in TRAIN_BAD])
def test_a_bad_train_draft_value_stops_at_once_in_one_line(cli, tmp_path, overrides, key):
    run_dir = tmp_path / "run"
    before = previous_run(run_dir)
    (run_dir / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000010" / "train_state.pt").write_text("x")
    before["checkpoints/step_00000010/train_state.pt"] = "x"
    code, out, err, seconds = cli("train_draft", *_fill(overrides, run=run_dir), f"hydra.run.dir={run_dir}")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}="), lines[0]
    assert "Traceback" not in err + out
    assert contents(run_dir) == before
    assert seconds < 1.0


def test_every_bad_value_of_a_config_is_reported(cli, tmp_path):
    code, _, err, _ = cli("run_spec", "gen.max_new_tokens=0", "gen.batch_size=0", "seed=x",
                          f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 2 and [line.split("=")[0] for line in err.splitlines()] == [
        "error: seed", "error: gen.max_new_tokens", "error: gen.batch_size"]


def test_a_fresh_process_refuses_a_bad_value_before_importing_torch(tmp_path):
    """The real command: status 2, one line, no traceback, no run directory; and with HYDRA_FULL_ERROR=1 the
    traceback. A bad value is refused by pure-Python checks, so the command ends within its start-up."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-X", "importtime", str(REPO / "run_spec.py"), "gen.max_new_tokens=0",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=ENV)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and lines == ["error: gen.max_new_tokens=0: must be an integer >= 1"]
    assert not run_dir.exists()
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())  # torch never imported
    full = subprocess.run(cmd[:1] + cmd[3:], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**ENV, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode not in (0, 2) and "Traceback" in full.stderr and "gen.max_new_tokens=0" in full.stderr


def test_the_parameter_count_is_the_models():
    from eaglet.models.llama import ModelArgs, transformer_configs
    from eaglet.runner.config import meta_model, parameter_count

    for name in transformer_configs:
        args = ModelArgs.from_name(name)
        assert parameter_count(args) == sum(p.numel() for p in meta_model(args).parameters()), name


def test_validation_runs_before_any_loading(monkeypatch, tmp_path):
    """run() itself (what tests and multirun jobs call) checks first: the loader is never reached."""
    from hydra import compose, initialize_config_dir

    import eaglet.models.llama as llama
    from eaglet.runner.checks import ConfigError
    from eaglet.runner.run import run

    monkeypatch.setattr(llama.Transformer, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("run_spec", overrides=["gen.max_new_tokens=0", "logger=none"])
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^gen.max_new_tokens=0: must be an integer >= 1$"):
        run(cfg, tmp_path / "run")
    assert time.perf_counter() - t0 < 1.0


def test_a_reused_run_dir_is_cleared_of_stale_results_before_the_run(monkeypatch, tmp_path):
    """A valid run into a directory with another run's results removes them before it loads anything, so a run
    that then fails leaves no stale metrics.json beside its config."""
    from hydra import compose, initialize_config_dir

    import eaglet.runner.run as run_module

    run_dir = tmp_path / "run"
    previous_run(run_dir)
    (run_dir / "trace.json").write_text("{}")

    def fails(*a, **k):
        assert not any((run_dir / n).exists() for n in ("metrics.json", "outputs.jsonl", "trace.json"))
        raise RuntimeError("out of memory")

    monkeypatch.setattr(run_module, "random_target", fails)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("run_spec", overrides=[*TINY_RUN, "logger=none"])
    with pytest.raises(RuntimeError, match="out of memory"):
        run_module.run(cfg, run_dir)
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "outputs.jsonl").exists()


# ---------------------------------------------------------------------------------------------------
# --help


@pytest.mark.parametrize("script,own,other", [
    ("run_spec", ["stream", "data", "gen.max_new_tokens=256", "tokens generated per user turn", "* smollm2_135m",
                  "+experiment"], ["train/head", "train.steps"]),
    ("train_draft", ["train/head", "train/optim", "train.steps=4000", "optimiser steps", "* eagle3"],
     ["  stream ", "  gen.max_new_tokens=", "+experiment"]),
])
def test_help_lists_this_scripts_groups_and_keys_with_their_comments(script, own, other):
    proc = subprocess.run([sys.executable, str(REPO / f"{script}.py"), "--help"], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in own:
        assert text in proc.stdout, text
    for text in other:
        assert text not in proc.stdout, text
    assert "powered by Hydra" not in proc.stdout


def test_help_shows_the_values_of_this_command():
    proc = subprocess.run([sys.executable, str(REPO / "run_spec.py"), "tree=chain", "gen.batch_size=8", "--help"],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert "* chain" in proc.stdout and "gen.batch_size=8 " in proc.stdout and "tree.topk=1 " in proc.stdout


# ---------------------------------------------------------------------------------------------------
# a whole tiny run: progress, the summary, the job log; interrupts


def _tiny_run(run_dir: Path, *extra: str, **popen) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "run_spec.py"), *TINY_RUN, f"hydra.run.dir={run_dir}", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run_dir.parent,
                            env=ENV, preexec_fn=_signals_delivered, **popen)


def _signals_delivered() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, not ignored as a background job's may be."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def test_a_run_shows_its_passes_and_ends_with_where_everything_went(tmp_path):
    run_dir = tmp_path / "run"
    previous_run(run_dir)
    (run_dir / "trace.json").write_text("{}")  # a stale result this run does not write
    proc = _tiny_run(run_dir, "data.limit=2", "gen.max_new_tokens=24", "logger=wandb")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "speculative: 100%" in err and "plain decoding, for speedup_vs_ar: 100%" in err  # the two bars
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["finished"] and metrics["answers"] == 2 and metrics["ar_identical_fraction"] == 1.0
    assert not (run_dir / "trace.json").exists()
    lines = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    assert sorted(line["prompt_id"] for line in lines) == ["synthetic-0", "synthetic-1"]
    assert all(len(line["token_ids"]) == 24 and line["turn"] == 0 for line in lines)
    [wandb_dir] = (run_dir / "wandb").glob("offline-run-*")
    assert f"metrics: {run_dir / 'metrics.json'}" in out and f"outputs: {run_dir / 'outputs.jsonl'}" in out
    assert f"wandb sync {wandb_dir}" in out and "done: 2 of 2 answers" in out
    log = (run_dir / "run_spec.log").read_text()  # Hydra's job log holds the run's lines
    assert "stream plan: serial" in log and "done: 2 of 2 answers" in log and f"wandb sync {wandb_dir}" in log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_keeps_its_finished_answers_and_partial_metrics(tmp_path, sig):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _tiny_run(run_dir, "data.limit=8", "gen.max_new_tokens=160", "logger=none")
    deadline = time.time() + 240
    while not (run_dir / "outputs.jsonl").is_file() or not (run_dir / "outputs.jsonl").read_text():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    lines = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["finished"] is False and metrics["interrupted"] == sig.name
    assert 1 <= metrics["answers"] == len(lines) < 8 and metrics["answers_total"] == 8
    assert all(len(line["token_ids"]) == 160 and line["finish_reason"] == "length" for line in lines)
    assert metrics["new_tokens"] >= 160 * len(lines) and metrics["tau"] >= 1.0 and "speedup_vs_ar" not in metrics
    assert f"interrupted by {sig.name}" in out and "Traceback" not in err


def test_the_checks_know_the_engines_names():
    """The config checks name the head kinds and stream plans without importing torch: the same names."""
    from eaglet.engine.drafters.eagle_config import HEAD_KINDS
    from eaglet.engine.stream_plan import PLANS
    from eaglet.models.eagle import KINDS
    from eaglet.models.head_checkpoint import KINDS as TRAINABLE
    from eaglet.runner.config import STREAM_PLANS
    from eaglet.training.config import TRAIN_KINDS

    assert HEAD_KINDS == KINDS and STREAM_PLANS == PLANS and TRAIN_KINDS == TRAINABLE


def test_run_task_turns_interrupts_and_config_errors_into_exit_statuses(tmp_path, capsys, caplog):
    """The body of both @hydra.main functions: an interrupted run's metrics -> 128 + the signal; an interrupt
    while setting up -> the same, with a line; a ConfigError raised inside the run -> its lines and 2."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from eaglet.runner.checks import ConfigError
    from eaglet.runner.entry import run_task
    from eaglet.runner.signals import Interrupted

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        full = compose("run_spec", overrides=["logger=none"], return_hydra_config=True)
    with open_dict(full):
        full.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(full)

    def interrupted_while_loading(cfg, out):
        raise Interrupted("SIGTERM")

    def config_error(cfg, out):
        raise ConfigError(["data.skip_too_long=true: no prompt's first turn fits"])

    cases = [(lambda cfg, out: {"finished": False, "interrupted": "SIGINT", "out": out}, 130),
             (interrupted_while_loading, 143), (config_error, 2)]
    for fn, status in cases:
        with pytest.raises(SystemExit) as e:
            run_task(fn, full)
        assert e.value.code == status
    assert "interrupted by SIGTERM while setting up" in caplog.text
    assert capsys.readouterr().err == "error: data.skip_too_long=true: no prompt's first turn fits\n"
    assert run_task(lambda cfg, out: {"finished": True, "out": out}, full) == {"finished": True, "out": str(tmp_path)}


def test_an_interrupt_while_loading_leaves_no_results_and_the_handlers_as_they_were(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir

    import eaglet.runner.run as run_module
    from eaglet.runner.signals import Interrupted

    monkeypatch.setattr(run_module, "random_target", lambda *a: os.kill(os.getpid(), signal.SIGTERM))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("run_spec", overrides=[*TINY_RUN, "logger=none"])
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with pytest.raises(Interrupted, match="SIGTERM"):
        run_module.run(cfg, tmp_path / "run")
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
    assert not (tmp_path / "run" / "metrics.json").exists()
