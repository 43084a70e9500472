"""GPU benchmarks (``python -m bench.gpu --routine ...``; see bench/gpu/__main__.py).

Modules: kernels (write, decode, policy, paging, waves, versions and kernel routines), write_layout
(the write kernel's value orders and row mappings), hf (a transformers model on the packed cache;
``python -m bench.gpu.hf prep|run|merge|report|floor``), plots.
"""
