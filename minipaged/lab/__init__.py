"""The lab: everything that measures, records, renders, simulates, plots and grades the engine.

The engine (everything in minipaged/ outside this folder) serves requests and never imports the lab;
the lab imports the engine. Delete this folder and the engine still runs (tests/test_layout.py
checks it). What is here, from the bottom up:

    capture.py         write a results record (--record) and read one back: a leaf
    roofline.py        the KV-cache and roofline arithmetic of chapter 00
    simulator/         synthetic workloads run step by step through the engine's own core and KV
                       policies, with a runner that has no model (simulator/runner.py)
    bench/             benchmarks on the real model, each printing ratios measured side by side
    kernels/           chapter 10's instruments: the kernels checked, their ceilings, their resources
                       read at compile time, the GPU run's record
    plots/             figures drawn from simulator results and records
    server_process.py  a server in a child process on a loopback port (tests, benchmark, notebook)
    answers.py         the computations behind the worked answers' numbers
    records.py         the top: the chapters rendered from their records and computations
    exercises/         the graded exercises: student copies, grading, the syllabus
    cli.py             ``python -m minipaged bench ...`` and ``python -m minipaged simulate ...``
"""
