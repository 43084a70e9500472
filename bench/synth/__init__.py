"""Synthesis reports: ``python -m bench.synth report|mantissa`` (bench/synth/__main__.py)."""
