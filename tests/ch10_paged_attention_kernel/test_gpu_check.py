"""scripts/gpu_check.sh's pieces that run without a GPU: the record's assembly from a run folder, the
code hash that names what a run measured, the numpy shim, and the end-to-end prompts' lengths."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from minipaged.lab import records
from minipaged.lab.kernels import gpu_inputs, gpu_record

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"numba": 250.0, "numba_v1": 700.0, "numba_v2": 250.0, "numba_v3": 60.0, "sdpa": 40.0, "reference": 20000.0}
NCU = """==PROF== Connected to process 1
  v1_group::paged_attention_v1[abi:v1,xyz](Array<__fp16, 3, C, mutable, aligned>, float) (64, 3, 1)x(128, 1, 1), \
Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Throughput                   %         2.97
    Duration                         us       721.41
    Registers Per Thread             register/thread             127
    Achieved Occupancy                        %         9.11
"""


def _row(shape, batch, context, scale=1.0):
    nbytes = 2 * batch * context * 3 * 64 * 2
    us = {k: v * scale for k, v in KERNELS.items()}
    return {"shape": shape, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64, "batch": batch, "context": context,
            "dtype": "float16", "bytes": nbytes, "auto_kernel": "v2", "auto_partitions": 6, "v2_partitions": 6,
            "us": us, "fraction_of_peak": {k: nbytes / (t * 1e3) / 4800 for k, t in us.items()},
            "speedup_vs_reference": us["reference"] / us["numba"], "speed_vs_sdpa": us["sdpa"] / us["numba"],
            "host_us_per_call_numba": 500.0}


def make_run(folder: Path, packed=False) -> Path:
    """A run folder as gpu_check.sh leaves it, with made-up numbers and a kernel the chapter has not met."""
    raw = folder / "raw"
    raw.mkdir(parents=True)
    env = {"commit": "abc1234", "source_hash": "0123456789abcdef", "date": "2026-12-05 10:00 UTC",
           "device": "NVIDIA H200", "sms": 132, "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
           "numba": "0.68.0", "numba_cuda": "0.30.4", "python": "3.12.3", "cpu": "x86_64", "cores": 16}
    bench = {"device": "NVIDIA H200", "peak_gbps": 4800, "sms": 132,
             "rows": [_row("smollm2", 64, 2048), _row("smollm2", 1, 512, 0.2), _row("llama8b", 64, 2048, 2.0)],
             "partition_sweeps": [{"shape": "smollm2", "batch": 64, "context": 2048,
                                   "us_by_partitions": {"1": 700.0, "2": 260.0}, "fraction_of_peak": {}}]}
    flat = {"bytes": 2**31, "torch_copy_gbps": 4200.0, "read_gbps": {"2": 1300.0, "4": 3900.0, "8": 4150.0}}
    ceilings = {"flat": flat,
                "paged": [{"shape": "smollm2", "batch": 64, "context": 2048, "bytes": 100663296, "checked": True,
                           "best": "P6_T128", "us": 45.0, "gbps": 2237.0, "fraction_of_peak": 0.466, "us_tried": {}}]}
    files = {"env.json": env, "bench_quick.json": bench, "check.json": [{"case": "a", "ok": True, "max_abs_err": 1e-6}],
             "ceilings.json": ceilings,
             "e2e.json": [{"model": "tiny", "prompt_lens": [5, 488], "same_tokens": True,
                           "first_difference_per_prompt": [None, None], "seconds_torch": 0.1, "seconds_numba": 0.1}]}
    for name, content in files.items():
        (raw / name).write_text(json.dumps(content))
    (folder / "ncu.txt").write_text(NCU)
    (folder / "summary.txt").write_text("env          ok                        6s  bash -c ...\n"
                                        "SKIP bench: 10s left of the 480s budget\n")
    (folder / "gpu_check.log").write_text("==> pytest: python -m pytest\n150 passed, 2 skipped in 40.0s\n"
                                          "==> bench: x\n")
    if packed:
        with tarfile.open(folder / "raw.tar.gz", "w:gz") as tar:
            tar.add(raw, arcname="raw")
        for p in raw.iterdir():
            p.unlink()
        raw.rmdir()
    return folder


@pytest.mark.parametrize("packed", [False, True])
def test_the_record_has_the_keys_the_chapter_and_outside_checks_read(tmp_path, packed):
    record = gpu_record.assemble(make_run(tmp_path / "run", packed))
    res = record["results"]
    for key in ("device", "driver", "cuda", "torch", "numba", "numba_cuda", "commit", "checks", "e2e", "grid",
                "sweeps", "ceilings", "target"):
        assert res[key] not in (None, [], {}), key
    assert record["commit"] == res["commit"] == "abc1234" and res["source_hash"] == "0123456789abcdef"
    t = res["target"]
    assert t["shape"]["batch"] == 64 and t["shape"]["context"] == 2048 and t["shape"]["dtype"] == "float16"
    assert t["bandwidth_fraction"] == pytest.approx(t["shape"]["bytes"] / 250e3 / 4800, rel=1e-3)
    assert t["speedup_vs_reference"] == pytest.approx(80.0)
    assert t["fraction_of_paged_read_ceiling"] == pytest.approx(t["bandwidth_fraction"] / 0.466, rel=1e-3)
    llama = res["llama8b"]  # the chapter's second prediction, from its own row of the grid
    assert llama["shape"]["model"] == "llama8b" and llama["us"] == pytest.approx(500.0)
    assert llama["fraction_of_paged_read_ceiling"] is None  # the ceilings did not read that shape here
    assert "Llama-3-8B layer" in records.stdout_part(record["stdout"].splitlines(), "target")[-1]
    assert res["pytest"] == {"passed": 150, "skipped": 2}
    assert res["ncu"]["paged_attention_v1"]["registers"] == 127
    assert [s["name"] for s in res["steps"]] == ["env", "bench"] and res["steps"][1]["verdict"] == "skipped"
    # the kernels are whatever the benchmark timed: a new one shows up in the tables unasked
    assert "numba_v3" in res["kernels"] and "v3 us" in record["stdout"]
    # the same conventions as every other chapter's record
    for key in ("command", "commit", "date", "machine", "stdout", "results"):
        assert record[key], key
    assert record["command"] == "scripts/gpu_check.sh" and not record["dirty"]
    assert {"cpu", "cores", "torch", "gpu", "sms", "driver", "cuda", "numba_cuda"} <= set(record["machine"])
    assert record["target"] == t and record["numba_cuda"] == "0.30.4"
    assert "*Measured at commit `abc1234`" in records.measured_line(record)


def test_the_report_is_cut_into_the_parts_the_chapter_shows(tmp_path):
    record = gpu_record.assemble(make_run(tmp_path / "run"))
    lines = record["stdout"].splitlines()
    for part in ("target", "grid", "sweeps", "ceilings", "ncu", "checks"):
        assert records.stdout_part(lines, part), part
    grid = records.stdout_part(lines, "grid")
    assert len(grid) == 1 + 3 and grid[0].split()[:4] == ["shape", "batch", "ctx", "auto"]


def test_assemble_writes_the_record_and_says_what_is_missing(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    out = tmp_path / "gpu_check.json"
    assert gpu_record.main(["assemble", str(run), "--out", str(out), "--commit", "def5678"]) == 0
    assert json.loads(out.read_text())["commit"] == "def5678"
    (run / "raw" / "bench_quick.json").unlink()
    assert gpu_record.main(["assemble", str(run), "--out", str(out)]) == 2
    assert "no benchmark rows" in capsys.readouterr().err
    (run / "raw" / "env.json").unlink()
    assert gpu_record.main(["assemble", str(run), "--out", str(out)]) == 2


def test_the_plot_is_drawn_from_the_record(tmp_path):
    pytest.importorskip("matplotlib")
    record = gpu_record.assemble(make_run(tmp_path / "run"))
    path = tmp_path / "roof.png"
    from minipaged.lab.plots.kernels import plot_kernel_roofline

    plot_kernel_roofline(record["results"], str(path))
    assert path.stat().st_size > 10_000


def test_the_source_hash_follows_the_files(tmp_path):
    (tmp_path / "minipaged" / "sub").mkdir(parents=True)
    (tmp_path / "minipaged" / "a.py").write_text("x = 1\n")
    (tmp_path / "minipaged" / "sub" / "b.cpp").write_text("int y;\n")
    (tmp_path / "minipaged" / "notes.txt").write_text("not source")
    first = gpu_inputs.source_hash(tmp_path)
    (tmp_path / "minipaged" / "notes.txt").write_text("still not source")
    assert gpu_inputs.source_hash(tmp_path) == first
    (tmp_path / "minipaged" / "sub" / "b.cpp").write_text("int z;\n")
    assert gpu_inputs.source_hash(tmp_path) != first


def test_the_source_hash_of_a_commit_is_that_of_its_tree():
    status = subprocess.run(["git", "status", "--porcelain", "--", "minipaged"], cwd=ROOT, capture_output=True,
                            text=True)
    if status.returncode or status.stdout.strip():
        pytest.skip("minipaged/ differs from HEAD here (or this is no git checkout)")
    assert gpu_inputs.source_hash(commit="HEAD") == gpu_inputs.source_hash()


def test_the_shim_gives_numpy_row_stack_back(tmp_path):
    fake = tmp_path / "fake" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def vstack(tup, dtype=None, casting='same_kind'):\n    return ('v', tup)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts" / "gpu_shim"), str(tmp_path / "fake")])}
    proc = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.row_stack([1]))"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "('v', [1])", proc.stderr


def test_gpu_check_is_valid_bash_and_leaves_at_most_8_files():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
    written = {"summary.txt", "gpu_check.log", "gpu_check.json", "ncu.txt", "raw.tar.gz"}
    assert all(name in script for name in written) and len(written) <= 8
    assert "rm -rf \"$RAW\"" in script  # the step files travel back inside raw.tar.gz only


def test_gpu_check_lets_auto_pick_the_kernel_no_gpu_has_run_yet():
    """auto leaves v3 out until a GPU has run it; the GPU check asks for it, so that its run measures v3
    as the backend's choice too."""
    from minipaged.attention.kernels.config import ALLOW_UNTESTED_ENV

    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert f"export {ALLOW_UNTESTED_ENV}=1" in script


def test_the_end_to_end_prompts_fit_the_model():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_e2e
    finally:
        sys.path.pop(0)
    from minipaged import LLM

    limit = LLM("tiny", device="cpu", progress=False).max_model_len
    lens = gpu_e2e.prompt_lens_for(limit, 24)
    assert max(gpu_e2e.PROMPT_LENS) + 24 > limit  # the cut is needed: tiny allows fewer tokens
    assert all(n + 24 <= limit for n in lens) and lens[:3] == list(gpu_e2e.PROMPT_LENS[:3])
    with pytest.raises(ValueError, match="max_tokens"):
        gpu_e2e.prompt_lens_for(16, 16)
