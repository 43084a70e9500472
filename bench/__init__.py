"""Benchmarks and the generated docs, run from the repository root as modules:

  python -m bench.gpu --routine ROUTINE   GPU kernels and a transformers model on the packed cache
  python -m bench.accuracy                the format study (perplexity with fake-quantized K/V)
  python -m bench.synth report|mantissa   synthesis report and the BFP mantissa study
  python -m bench.docs [--check]          the generated blocks of README.md and docs/

Results: bench/results/ (committed: what bench.docs reads; raw logs and profiler output in
bench/results/raw/, ignored by git).
"""
