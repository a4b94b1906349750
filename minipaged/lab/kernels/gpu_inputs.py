"""What a GPU run of chapter 10 leaves behind, read back: the machine, the code it measured, and the
files of each step of scripts/gpu_check.sh. ``gpu_record`` turns them into the chapter's record.

    python -m minipaged.lab.kernels.gpu_inputs env [--commit C] [--out env.json]   the machine and the code (on the GPU)
    python -m minipaged.lab.kernels.gpu_inputs hash [--commit C]                  minipaged/'s content hash

The tree copied to a GPU machine may travel without ``.git``, so a run names its code twice: the commit
it was given (``COMMIT=...``, else git's), and a content hash of minipaged/'s source files (``source_hash``),
which ``hash --commit C`` recomputes here from git for any commit: equal hashes, same code.

A run folder holds, in the layout gpu_check.sh writes (``raw/`` inside it, or ``raw.tar.gz``):
env.json, bench_quick.json, bench.json, check.json, ceilings.json, e2e.json, ncu.txt, gpu_check.log
(every step's output) and summary.txt. ``read_run`` also reads the first run's folder (h200-771ba89:
env.log, pytest.log, ceiling*.json from probes taken beside the script), adapting it to that layout.

Not handled: runs on several GPUs (the first device is described).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE_SUFFIXES = (".py", ".cpp", ".h")


# ---------------------------------------------------------------- the code measured


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{hashlib.sha256(files[path]).hexdigest()}\n".encode())
    return h.hexdigest()[:16]


def _wanted(path: str) -> bool:
    return path.startswith("minipaged/") and path.endswith(SOURCE_SUFFIXES) and "__pycache__" not in path


def source_hash(root: Path = ROOT, commit: str | None = None) -> str:
    """sha256 over minipaged/'s .py/.cpp/.h files (path and content), in the tree or at a git commit."""
    if commit is None:
        files = {}
        for p in (root / "minipaged").rglob("*"):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and _wanted(rel):
                files[rel] = p.read_bytes()
        return _digest(files)
    proc = subprocess.run(["git", "archive", "--format=tar", commit, "minipaged"], cwd=root, capture_output=True)
    if proc.returncode:
        raise ValueError(f"--commit {commit}: git archive failed: {proc.stderr.decode()[-300:]}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        return _digest({m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and _wanted(m.name)})


def git_commit(root: Path = ROOT) -> str | None:
    proc = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def capture_env(commit: str | None = None) -> dict:
    """The machine and the code, as the record names them (run on the GPU machine)."""
    import datetime

    import torch

    env = {"commit": commit or git_commit() or "unknown", "commit_from": "COMMIT" if commit else "git",
           "source_hash": source_hash(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "torch_cuda": torch.version.cuda, "numba": _version("numba"),
           "numba_cuda": _version("numba-cuda"), "numpy": _version("numpy"), "python": platform.python_version(),
           "cores": os.cpu_count(), "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
                   cc=f"{props.major}.{props.minor}")
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        env.update(_from_nvidia_smi(smi))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return env


def _from_nvidia_smi(text: str) -> dict:
    out = {}
    if m := re.search(r"Driver Version:\s*([\d.]+)", text):
        out["driver"] = m.group(1)
    if m := re.search(r"CUDA Version:\s*([\d.]+)", text):
        out["cuda"] = m.group(1)
    return out


# ---------------------------------------------------------------- Nsight Compute's text

NCU_KERNEL = re.compile(r"^  (?:[\w.]+::)?(\w+)\[[^\n]*?\) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", re.M)
NCU_METRIC = re.compile(r"^    ([A-Za-z#(][^\n]*?)\s{2,}([A-Za-z/%]+(?:/[a-z]+)?)?\s+([\d,]+(?:\.\d+)?)\s*$", re.M)
NCU_KEEP = {
    "Duration": "duration_us", "DRAM Throughput": "dram_throughput_pct",
    "Compute (SM) Throughput": "compute_throughput_pct", "Registers Per Thread": "registers",
    "Static Shared Memory Per Block": "static_shared_kb", "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Achieved Occupancy": "achieved_occupancy_pct", "Block Limit Registers": "block_limit_registers",
    "Block Limit Shared Mem": "block_limit_shared", "Waves Per SM": "waves_per_sm",
    "Warp Cycles Per Issued Instruction": "warp_cycles_per_issue", "No Eligible": "no_eligible_pct",
    "L2 Hit Rate": "l2_hit_rate_pct",
}


def parse_ncu(text: str) -> list[dict]:
    """One dict per profiled launch in ``ncu``'s text report: kernel name, grid, block, NCU_KEEP's metrics."""
    heads = list(NCU_KERNEL.finditer(text))
    launches = []
    for i, m in enumerate(heads):
        body = text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        launch = {"kernel": m.group(1), "grid": [int(x) for x in m.group(2, 3, 4)],
                  "block": [int(x) for x in m.group(5, 6, 7)]}
        for name, unit, value in NCU_METRIC.findall(body):
            key = NCU_KEEP.get(name.strip())
            if key and key not in launch:
                number = float(value.replace(",", ""))
                if key == "duration_us" and unit == "ms":
                    number *= 1e3
                launch[key] = number
        launches.append(launch)
    return launches


# ---------------------------------------------------------------- a run folder


def _load(folder: Path, name: str):
    path = folder / name
    if not path.exists():
        return None
    return json.loads(path.read_text()) if name.endswith(".json") else path.read_text(errors="replace")


def _pytest_counts(text: str | None) -> dict | None:
    if not text:
        return None
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ passed|\d+ failed", ln) and " in " in ln]
    if not lines:
        return None
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1])}


def _steps(summary: str | None) -> list[dict]:
    steps = []
    for line in (summary or "").splitlines():
        m = re.match(r"^(\w+)\s+(ok|TIMEOUT after \d+s|FAILED \(rc=\d+\))\s+(\d+)s\s", line)
        if m:
            steps.append({"name": m.group(1), "verdict": m.group(2), "seconds": int(m.group(3))})
        elif m := re.match(r"^SKIP (\w+): (.*)$", line):
            steps.append({"name": m.group(1), "verdict": "skipped", "why": m.group(2)})
    return steps


def read_run(folder: str | Path) -> dict:
    """Everything a run folder holds, in gpu_check.sh's layout (the first run's folder is adapted)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of a GPU run")
    if (folder / "ceiling4.json").exists() and (folder / "env.log").exists():
        return adapt_h200_771ba89(folder)
    if (folder / "raw.tar.gz").exists() and not (folder / "raw").exists():
        tmp = Path(tempfile.mkdtemp(prefix="gpu_run_"))
        with tarfile.open(folder / "raw.tar.gz") as tar:
            tar.extractall(tmp, filter="data")
        raw = tmp / "raw"
    else:
        raw = folder / "raw" if (folder / "raw").is_dir() else folder

    def get(name):
        found = _load(raw, name)
        return found if found is not None else _load(folder, name)

    log = get("gpu_check.log")
    pytest_part = log.split("==> pytest", 1)[1].split("\n==> ", 1)[0] if log and "==> pytest" in log else None
    env = get("env.json")
    if env is None:
        raise ValueError(f"{folder}: no env.json (the env step of gpu_check.sh writes it)")
    return {"env": env, "bench": get("bench.json"), "bench_quick": get("bench_quick.json"), "check": get("check.json"),
            "ceilings": get("ceilings.json"), "e2e": get("e2e.json"), "ncu": parse_ncu(get("ncu.txt") or ""),
            "pytest": _pytest_counts(pytest_part), "steps": _steps(get("summary.txt")), "adapted_from": None}


def adapt_h200_771ba89(folder: Path) -> dict:
    """The first run (../shared/gpu/h200-771ba89) in gpu_check.sh's layout. Its env.log names an unrelated
    commit (the tree travelled without .git), so the caller gives the commit; its ceilings came from
    probes beside the script: ceiling.json (torch's copy, fp16 read as 2-byte elements), ceiling2.json
    (read as int32 and int64 words), ceiling4.json (the paged read with compile-time sizes, two shapes)."""
    env_log = _load(folder, "env.log")
    env = {"commit": None, "commit_from": "given", "source_hash": None, **_from_nvidia_smi(env_log)}
    if m := re.search(r"^torch (\S+) cuda (\S+) (.+)$", env_log, re.M):
        env.update(torch=m.group(1), torch_cuda=m.group(2), device=m.group(3).strip())
    if m := re.search(r"^numba (\S+) simulator", env_log, re.M):
        env["numba"] = m.group(1)
    if m := re.search(r"^numba-cuda\s+(\S+)", env_log, re.M):
        env["numba_cuda"] = m.group(1)
    if m := re.search(r"Compute Capability: (\S+)", env_log):
        env["cc"] = m.group(1)
    summary = _load(folder, "summary.txt")
    if m := re.search(r"^gpu_check (\d{4}-\d\d-\d\d)T(\d\d:\d\d)", summary, re.M):
        env["date"] = f"{m.group(1)} {m.group(2)} UTC"
    bench = _load(folder, "bench.json")
    env["sms"] = bench.get("sms")
    c1, c2, c4 = (_load(folder, f"ceiling{n}.json") for n in ("", "2", "4"))
    paged = []
    for shape, kvh, d in (("smollm2", 3, 64), ("llama8b", 8, 128)):
        tried = {k.split("_", 4)[-1][:-3]: v for k, v in c4.items() if k.startswith(f"c_b64_kvh{kvh}_d{d}_")
                 and k.endswith("_us")}
        best = min(tried, key=tried.get)
        nbytes = 2 * 64 * 2048 * kvh * d * 2
        paged.append({"shape": shape, "batch": 64, "context": 2048, "bytes": nbytes, "checked": False, "best": best,
                      "us": tried[best], "gbps": nbytes / (tried[best] * 1e3),
                      "fraction_of_peak": nbytes / (tried[best] * 1e3) / bench["peak_gbps"], "us_tried": tried})
    ceilings = {"device": c1["device"], "peak_gbps": bench["peak_gbps"],
                "flat": {"bytes": c1["bytes"], "torch_copy_gbps": c1["torch_copy_gbps_read_plus_write"],
                         "read_gbps": {"2": c1["numba_read_fp16_bps8_gbps"],
                                       "4": c2["flat_read_fp16_via_int32_gbps"],
                                       "8": c2["flat_read_fp16_via_int64_gbps"]}},
                "paged": paged}
    return {"env": env, "bench": bench, "bench_quick": _load(folder, "bench_quick.json"),
            "check": _load(folder, "check.json"), "ceilings": ceilings, "e2e": _load(folder, "e2e.json"),
            "ncu": parse_ncu(_load(folder, "ncu.txt") or ""), "pytest": _pytest_counts(_load(folder, "pytest.log")),
            "steps": _steps(summary), "adapted_from": "h200-771ba89"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.gpu_inputs",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env", help="the machine and the code, as JSON")
    e.add_argument("--commit", default=None, help="the commit of the tree (when it travelled without .git)")
    e.add_argument("--out", default=None)
    h = sub.add_parser("hash", help="minipaged/'s content hash, in this tree or at a commit")
    h.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "hash":
            print(source_hash(commit=args.commit))
            return 0
        env = capture_env(args.commit or None)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(env, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
