"""diag's benchmark commands, run from a checkout (``python -m bench.X``, docs/benchmarks.md): its own speed,
overhead and robustness, and the lab runs whose verdicts the tests hold. Not part of the installed package."""
