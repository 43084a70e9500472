"""The format study: perplexity of a language model with every cached K and V fake-quantized.

``python -m bench.accuracy --model M`` (bench/accuracy/__main__.py) runs it. Modules: configs
(the study's configurations), kvquant (float baselines, key scales), attention (the fake-quant
attention function), models (model resolver), windows, runs (metrics, calibration), passkey,
report (tables and plots), tasks (task quality: checked greedy answers through the serving
engine, ``python -m bench.accuracy --tasks``), smollm2 (the SmolLM2 wheel and the study text),
device (the whole study in one call on a GPU machine: ``python -m bench.accuracy.device``),
capture_kv (the generator of the test fixture verif/data/smollm2_kv.npz:
``python -m bench.accuracy.capture_kv``).
"""
