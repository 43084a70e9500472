"""GPU benchmarks (``python -m bench.gpu --routine ...``; see bench/gpu/__main__.py).

Modules: kernels (write, decode, policy, paging, waves, versions and kernel routines), write_layout
(the write kernel's value orders and row mappings), hf (a transformers model on the packed cache;
``python -m bench.gpu.hf prep|run|merge|report|floor``), peers (FlashInfer and SDPA beside the kernels), tp
(tensor-parallel serving), serve_load (the OpenAI server under load; ``--cpu``: its CPU smoke), plots.
"""


def gpu_missing() -> str | None:
    """Why the GPU benchmarks cannot run here (CuPy not installed, no CUDA GPU for CuPy or
    torch), or None when they can. Cheap: loads no kernel."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed: the GPU benchmarks need CuPy (pip install .[gpu]) and a CUDA GPU"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # CUDARuntimeError without a driver or device
        return f"no CUDA GPU for CuPy ({err}): the GPU benchmarks need a CUDA GPU"
    if n < 1:
        return "no CUDA GPU for CuPy: the GPU benchmarks need a CUDA GPU"
    try:
        import torch
    except ImportError:
        return "torch is not installed: the GPU benchmarks compare against torch with CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU: the GPU benchmarks compare against torch with CUDA"
    return None
