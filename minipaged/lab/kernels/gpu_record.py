"""Chapter 10's GPU record: one run of scripts/gpu_check.sh, assembled into
``chapters/10_paged-attention-kernel/results/gpu_check.json``, the file the chapter's "Measured on a
GPU" section is rendered from (``python -m minipaged.lab.records render``).

    python -m minipaged.lab.kernels.gpu_record assemble RUN_DIR [--commit C] [--out PATH] [--command CMD]
    python -m minipaged.lab.kernels.gpu_record plot [--record PATH] [--out PNG]

``assemble`` is gpu_check.sh's last step (on the GPU machine, writing RUN_DIR/gpu_check.json) and can be
run again here on a folder the machine sent back. It reads the folder (``gpu_inputs.read_run``; the
first run's older layout is adapted), keeps what the chapter quotes, and prints a report in parts
(``== name ==`` lines) that the chapter shows with ``<!-- record: gpu_check part=NAME -->``. The record
has the usual keys (command, commit, date, machine, stdout, results); ``results`` holds the versions,
the checks, the end-to-end comparison, the grid, the partition sweeps, the ceilings, Nsight Compute's
figures, ``target``, the auto choice at SmolLM2, batch 64, 2,048 cached tokens, fp16, and ``llama8b``,
the same at one Llama-3-8B layer (None when the run did not time it).

The kernels are whatever the benchmark timed: every key of a grid row's ``us`` (``numba`` is the
backend's own choice, ``numba_v1``, ``numba_v2``, ... a kernel forced), so a new kernel needs no change
here. ``plot`` draws the roofline figure beside the chapter from the record.

Not handled: several runs merged into one record (the newest run replaces the record).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minipaged.lab.kernels.gpu_inputs import ROOT, read_run

CHAPTER = ROOT / "chapters" / "10_paged-attention-kernel"
RECORD = CHAPTER / "results" / "gpu_check.json"
PLOT = CHAPTER / "gpu_roofline.png"
TARGET = ("smollm2", 64, 2048)
LLAMA_LAYER = ("llama8b", 64, 2048)  # the chapter's second prediction: one Llama-3-8B layer
COMMAND = "scripts/gpu_check.sh"


def _r(x, digits=4):
    """Round floats (recursively) so that the record stays small and its diffs readable."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _r(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_r(v, digits) for v in x]
    return x


def kernel_names(rows: list[dict]) -> list[str]:
    """The timed calls, in the order the tables show them: the backend's choice, forced kernels, the rest."""
    seen = list(dict.fromkeys(k for row in rows for k in row["us"]))
    forced = sorted(k for k in seen if k.startswith("numba_"))
    return [k for k in seen if k == "numba"] + forced + [k for k in seen if k != "numba" and k not in forced]


def _grid(bench: dict | None, quick: dict | None) -> tuple[list[dict], list[dict], dict]:
    """The full grid when the full benchmark finished, else the quick one; the sweeps of either."""
    full = bench if bench and not bench.get("partial") and bench.get("rows") else None
    source = full or quick or bench
    if not source or not source.get("rows"):
        raise ValueError("the run has no benchmark rows (bench.json or bench_quick.json)")
    keep = ("shape", "num_heads", "num_kv_heads", "head_dim", "batch", "context", "dtype", "bytes", "auto_kernel",
            "auto_partitions", "v2_partitions", "us", "fraction_of_peak", "speedup_vs_reference", "speed_vs_sdpa",
            "host_us_per_call_numba")
    rows = [{k: row[k] for k in keep if k in row} for row in source["rows"]]
    sweeps = (full or {}).get("partition_sweeps") or (quick or {}).get("partition_sweeps") or []
    return rows, sweeps, source


def _ceilings(c: dict | None, peak: float) -> dict | None:
    if not c:
        return None
    flat = c["flat"]
    return {"torch_copy_gbps": flat["torch_copy_gbps"],
            "flat_read_gbps": flat["read_gbps"],
            "flat_read_fraction": {w: g / peak for w, g in flat["read_gbps"].items()},
            "paged_read": [{k: p[k] for k in ("shape", "batch", "context", "bytes", "best", "us", "gbps",
                                              "fraction_of_peak", "checked")} for p in c["paged"]]}


def _ncu(launches: list[dict]) -> dict | None:
    """Per kernel function: its last profiled launch's figures, and how many launches were profiled."""
    if not launches:
        return None
    out = {}
    for launch in launches:
        out[launch["kernel"]] = {**launch, "launches": out.get(launch["kernel"], {}).get("launches", 0) + 1}
    return out


def _at(key: tuple, rows: list[dict], ceilings: dict | None) -> dict | None:
    """The auto choice at one (shape, batch, context) of the grid, beside its paged-read ceiling
    (None if the benchmark did not time that shape)."""
    head = next((r for r in rows if (r["shape"], r["batch"], r["context"]) == key), None)
    if head is None:
        return None
    ceiling = next((p for p in (ceilings or {}).get("paged_read", [])
                    if (p["shape"], p["batch"], p["context"]) == key), None)
    frac = head["fraction_of_peak"]["numba"]
    return {
        "shape": {"model": key[0], "num_heads": head.get("num_heads"), "num_kv_heads": head.get("num_kv_heads"),
                  "head_dim": head.get("head_dim"), "batch": head["batch"], "context": head["context"],
                  "dtype": head.get("dtype", "float16"), "bytes": head["bytes"]},
        "kernel": head["auto_kernel"], "partitions": head["auto_partitions"], "us": head["us"]["numba"],
        "bandwidth_fraction": frac, "speedup_vs_reference": head["speedup_vs_reference"],
        "us_by_kernel": head["us"], "fraction_by_kernel": head["fraction_of_peak"],
        "host_us_per_call": head.get("host_us_per_call_numba"),
        "paged_read_ceiling_fraction": ceiling["fraction_of_peak"] if ceiling else None,
        "fraction_of_paged_read_ceiling": frac / ceiling["fraction_of_peak"] if ceiling else None,
    }


def build_results(run: dict) -> dict:
    env = run["env"]
    rows, sweeps, source = _grid(run["bench"], run["bench_quick"])
    peak = source["peak_gbps"]
    from minipaged.lab.bench.kernels import device_peaks

    peaks = device_peaks(env.get("device") or "")
    kernels = kernel_names(rows)
    if not any((r["shape"], r["batch"], r["context"]) == TARGET for r in rows):
        raise ValueError(f"the benchmark did not time the target shape {TARGET}")
    ceilings = _ceilings(run["ceilings"], peak)
    check = run["check"] or []
    # host time per call where the host is the bottleneck (it then measures the launch cost, not the GPU)
    hosts = [r["host_us_per_call_numba"] for r in rows
             if r.get("host_us_per_call_numba", 0) > 1.2 * r["us"]["numba"]]
    target, llama = _at(TARGET, rows, ceilings), _at(LLAMA_LAYER, rows, ceilings)
    return _r({
        "device": env.get("device"), "driver": env.get("driver"), "cuda": env.get("cuda"),
        "torch": env.get("torch"), "numba": env.get("numba"), "numba_cuda": env.get("numba_cuda"),
        "numpy": env.get("numpy"), "sms": env.get("sms"), "peak_gbps": peak,
        "peak_fp32_tflops": peaks[1] if peaks else None,
        "commit": env.get("commit"), "source_hash": env.get("source_hash"),
        "steps": run["steps"],
        "checks": {"cases": len(check), "passed": sum(c["ok"] for c in check),
                   "failed": [c["case"] for c in check if not c["ok"]],
                   "max_abs_err": max((c.get("max_abs_err", 0) for c in check), default=None)},
        "pytest": run["pytest"],
        "e2e": [{k: e[k] for k in ("model", "prompt_lens", "same_tokens", "seconds_torch", "seconds_numba")}
                for e in run["e2e"] or []],
        "kernels": kernels,
        "grid": rows, "sweeps": sweeps, "ceilings": ceilings, "ncu": _ncu(run["ncu"]),
        "fraction_of_peak_range": {k: [min(r["fraction_of_peak"][k] for r in rows if k in r["fraction_of_peak"]),
                                       max(r["fraction_of_peak"][k] for r in rows if k in r["fraction_of_peak"])]
                                   for k in kernels},
        "host_us_per_call": ({"min": min(hosts), "max": max(hosts), "host_bound_shapes": len(hosts),
                              "shapes": len(rows)} if hosts else None),
        "target": target,
        "llama8b": llama,
        "adapted_from": run.get("adapted_from"),
    })


# ---------------------------------------------------------------- the report (the record's stdout)


def _label(k: str) -> str:
    return {"numba": "auto", "reference": "ref"}.get(k, k.removeprefix("numba_"))


def report(res: dict) -> str:
    kernels = res["kernels"]
    out = ["== target ==", f"{res['device']} ({res['sms']} SMs, peak {res['peak_gbps']:,.0f} GB/s), code at "
           f"{res['commit']}; SmolLM2 decode attention, one layer, batch 64, 2,048 cached tokens, fp16"]
    t = res["target"]
    for k in kernels:
        frac = t["fraction_by_kernel"].get(k)
        out.append(f"  {_label(k):6} {t['us_by_kernel'][k]:>10,.1f} us  " + (f"{frac:6.1%} of peak" if frac else ""))
    out.append(f"  auto = {t['kernel']}" + (f" with {t['partitions']} partitions" if t["partitions"] > 1 else "")
               + f": {t['speedup_vs_reference']:.1f}x the reference; host time {t['host_us_per_call']:,.0f} us a call")
    if res.get("llama8b"):
        m = res["llama8b"]
        ceiling = (f", {m['fraction_of_paged_read_ceiling']:.0%} of the paged-read ceiling"
                   if m["fraction_of_paged_read_ceiling"] else "")
        out.append(f"  Llama-3-8B layer, batch 64, 2,048 tokens: auto = {m['kernel']} {m['us']:,.1f} us, "
                   f"{m['bandwidth_fraction']:.1%} of peak{ceiling}")
    head = f"{'shape':8} {'batch':>5} {'ctx':>5} {'auto':>5} " + " ".join(f"{_label(k) + ' us':>9} {'%':>5}"
                                                                        for k in kernels if k != "reference")
    out += ["== grid ==", head + f" {'ref us':>9} {'host us':>7}"]
    for r in res["grid"]:
        auto = r["auto_kernel"] + (f"/{r['auto_partitions']}" if r["auto_partitions"] > 1 else "")
        cells = []
        for k in kernels:
            if k == "reference":
                continue
            us, frac = r["us"].get(k), r["fraction_of_peak"].get(k)
            cells.append(f"{us:>9,.1f} {100 * frac:>4.1f}%" if us is not None else f"{'-':>9} {'':>5}")
        out.append(f"{r['shape']:8} {r['batch']:>5} {r['context']:>5} {auto:>5} " + " ".join(cells)
                   + f" {r['us']['reference']:>9,.0f} {r.get('host_us_per_call_numba', 0):>7,.0f}")
    out.append("== sweeps ==")
    for s in res["sweeps"]:
        cells = "  ".join(f"{p}: {us:,.0f}" for p, us in s["us_by_partitions"].items())
        out.append(f"{s['shape']} batch {s['batch']} ctx {s['context']}, us by partitions  {cells}")
    c = res["ceilings"]
    if c:
        out += ["== ceilings ==", f"{'torch device copy':36} {c['torch_copy_gbps']:>6,.0f} GB/s  (read + write)"]
        for w, g in c["flat_read_gbps"].items():
            label = f"numba flat read, {w}-byte words"
            out.append(f"{label:36} {g:>6,.0f} GB/s  {c['flat_read_fraction'][w]:6.1%} of peak")
        for p in c["paged_read"]:
            label = f"numba paged read, {p['shape']} {p['batch']} x {p['context']}"
            out.append(f"{label:36} {p['gbps']:>6,.0f} GB/s  {p['fraction_of_peak']:6.1%} of peak ({p['best']})")
    if res["ncu"]:
        out += ["== ncu ==", f"{'kernel':30} {'us':>7} {'regs':>4} {'theor.':>6} {'achieved':>8} {'DRAM':>5} "
                             f"{'SM':>5} {'grid':>12}"]
        for name, n in res["ncu"].items():
            out.append(f"{name:30} {n.get('duration_us', 0):>7,.1f} {n.get('registers', 0):>4.0f} "
                       f"{n.get('theoretical_occupancy_pct', 0):>5.1f}% {n.get('achieved_occupancy_pct', 0):>7.1f}% "
                       f"{n.get('dram_throughput_pct', 0):>4.1f}% {n.get('compute_throughput_pct', 0):>4.1f}% "
                       f"{'x'.join(map(str, n['grid'])):>12}")
    out.append("== checks ==")
    ch = res["checks"]
    out.append(f"kernels against the reference on the GPU: {ch['passed']} of {ch['cases']} cases agree")
    if res["pytest"]:
        out.append("tests/ch10_paged_attention_kernel on the GPU: "
                   + ", ".join(f"{n} {w}" for w, n in res["pytest"].items()))
    for e in res["e2e"]:
        out.append(f"engine, {e['model']}, prompts of {e['prompt_lens']} tokens: greedy tokens "
                   f"{'the same' if e['same_tokens'] else 'DIFFERENT'} with numba and torch")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the record


def assemble(run_dir, commit: str | None = None, command: str = COMMAND) -> dict:
    run = read_run(run_dir)
    if commit:
        run["env"]["commit"], run["env"]["commit_from"] = commit, "given"
    if not run["env"].get("commit") or run["env"]["commit"] == "unknown":
        raise ValueError("the run does not name its commit: pass --commit (the tree travelled without .git)")
    res = build_results(run)
    env = run["env"]
    machine = {"gpu": env.get("device"), "sms": env.get("sms"), "driver": env.get("driver"), "cuda": env.get("cuda"),
               "torch": env.get("torch"), "numba": env.get("numba"), "numba_cuda": env.get("numba_cuda"),
               "python": env.get("python"), "cpu": env.get("cpu", "unknown"), "cores": env.get("cores")}
    again = " ".join(["python -m minipaged.lab.kernels.gpu_record assemble", str(run_dir),
                      *(["--commit", commit] if commit else []), *(["--command", repr(command)] if command != COMMAND
                                                                   else [])])
    record = {"command": command, "commit": res["commit"], "dirty": False, "date": env.get("date"),
              "machine": machine, "assembled_by": again, "stdout": report(res), "results": res}
    if run.get("adapted_from") == "h200-771ba89":
        record["note"] = ("At 771ba89 gpu_check.sh measured neither the ceilings nor the Nsight Compute profile: "
                          "both come from probes run beside it on the same machine in the same session (the run "
                          "folder's README), read by gpu_inputs.adapt_h200_771ba89.")
    for key in ("device", "driver", "cuda", "torch", "numba", "numba_cuda", "target"):
        record[key] = res[key]  # the headline keys, also at the top for readers of the bare file
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.gpu_record",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="build the record from a run folder")
    a.add_argument("run_dir")
    a.add_argument("--commit", default=None, help="the commit the run measured (default: the one the run names)")
    a.add_argument("--out", default=str(RECORD), help=f"where to write it (default: {RECORD.relative_to(ROOT)})")
    a.add_argument("--command", default=COMMAND, help="the command that made the run, as the chapter shows it")
    p = sub.add_parser("plot", help="draw the roofline figure from the record")
    p.add_argument("--record", default=str(RECORD))
    p.add_argument("--out", default=str(PLOT))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "plot":
            from minipaged.lab.plots.kernels import plot_kernel_roofline

            plot_kernel_roofline(json.loads(Path(args.record).read_text())["results"], args.out)
            print(f"wrote {args.out}")
            return 0
        record = assemble(args.run_dir, args.commit, args.command)
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e!r}" if isinstance(e, KeyError) else f"error: {e}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(record["stdout"], end="")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
