"""Benchmarks. Each prints ratios measured side by side in one run (the machine may be noisy)."""
