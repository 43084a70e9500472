"""Every CUDA source in gpu_ref/ compiles to PTX for sm_90 (CI has nvcc but no GPU).

Skips when nvcc is not on PATH. The sources carry explicit template instantiations (unless
KV_NVRTC is defined), so the PTX contains real kernels, not just declarations: every quantizer
variant the Python side launches -- write kernel MODE (mid-tread 0, mid-rise 1) x RND (scale
rounding up 0, nearest 1) on the fast-quantizer path (fp16, bf16) and on both threshold-compare
paths (fp32 and int32 butterflies); decode kernel MR (mid-tread 0, mid-rise 1) for every N and G
it accepts, for key/value bits K3/V3, K4/V3 and K4/V4, q~ in one and two fp16 parts (QLO), and the
paged variants (pages of 16 and 32 tokens), the vpair value layout (VIL 1; write kernel IL 1), and the
cluster-merge entry (kv_decode_attn_cl, cluster sizes 2, 4, 8), and the 12-warp tune of long splits (MINB 3).
The test reads the template arguments back from the mangled entry names.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

SRC = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "gpu_ref", "*.cu")))


def test_sources_exist():
    names = {os.path.basename(s) for s in SRC}
    assert {"kv_encode.cu", "kv_decode_attn.cu"} <= names


def _template_args(ptx: str, kernel: str) -> list[tuple[int, ...]]:
    """Integer template arguments of every `.entry` of ``kernel`` (Itanium mangling: Li<n>E / Ly<n>E)."""
    out = []
    for m in re.finditer(r"\.entry\s+_Z\d+" + kernel + r"I((?:L[iy]\d+E)+)E", ptx):
        out.append(tuple(int(v) for v in re.findall(r"L[iy](\d+)E", m.group(1))))
    return out


@pytest.mark.parametrize("src", SRC, ids=os.path.basename)
def test_compiles_to_ptx_sm90(src, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    out = tmp_path / (os.path.basename(src) + ".ptx")
    # -Xcicc -O0: NVVM's optimiser adds minutes per source and checks nothing more here
    # (the sources, their instantiations and the PTX they contain); the optimised build is
    # the one the GPU tests compile and run
    r = subprocess.run([nvcc, "-arch=sm_90", "--ptx", "-std=c++17", "-Xcicc", "-O0", "-o", str(out), src],
                       capture_output=True, text=True, timeout=2400)   # a hang guard only
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = out.read_text()
    assert ".entry" in ptx, "no kernel in the PTX"
    if "decode" in os.path.basename(src):
        assert "mma.sync.aligned.m16n8k16" in ptx and "movmatrix" in ptx
        args = _template_args(ptx, "kv_decode_attn")
        # <N, G, KB, VB, PSPLIT, STAGES, SEED, HAS_SIGN, MINB, QLO, ABL, MR, PSUB, VIL>
        assert args and all(len(a) == 14 for a in args), args
        for n in (64, 128, 256):
            for g in (16, 32, 64):
                for kb, vb in ((3, 3), (4, 3), (4, 4)):
                    got = {a[11] for a in args if a[:4] == (n, g, kb, vb) and a[12] == 1 and a[13] == 0}
                    assert got == {0, 1}, f"decode N={n} G={g} K{kb}V{vb}: MR variants {got}"
                    qlo = {a[9] for a in args if a[:4] == (n, g, kb, vb) and a[11] == 1 and a[12] == 1}
                    assert qlo == {0, 1}, f"decode N={n} G={g} K{kb}V{vb}: QLO variants {qlo}"
        assert {a[12] for a in args} == {1, 2, 4}  # contiguous / 64-token pages, 32- and 16-token pages
        # the vpair value layout (VIL 1: 3-bit values, G = 64): every N, K3/V3 and K4/V3, both reconstructions,
        # one and two q parts, paged
        for n in (64, 128, 256):
            for kb in (3, 4):
                got = {(a[11], a[9]) for a in args if a[:4] == (n, 64, kb, 3) and a[12] == 1 and a[13] == 1}
                assert got == {(0, 1), (1, 1), (1, 0)}, f"decode vpair N={n} K{kb}V3: (MR, QLO) {got}"
        assert {a[12] for a in args if a[13] == 1} == {1, 2, 4}
        assert all(a[3] == 3 and a[1] == 64 for a in args if a[13] == 1)
        # the 12-warp tune (decode.py LONG_TUNE: MINB 3, STAGES 2, one q part), K3V3 and K4V3, both value orders
        assert {(a[2], a[13]) for a in args if a[5] == 2 and a[8] == 3 and a[9] == 0 and a[:2] == (128, 64)} == \
            {(3, 0), (4, 0), (3, 1), (4, 1)}
        assert "add.rn.f16x2" in ptx  # the mid-rise + 1/2 of V lanes at bit offset 0
        # cluster-merge entry: the same 14 arguments + the cluster size CL
        cl = _template_args(ptx, "kv_decode_attn_cl")
        for vil in (0, 1):
            assert {a[14] for a in cl if a[:4] == (128, 64, 3, 3) and a[13] == vil} == {2, 4, 8}, cl
        assert ".reqnctapercluster 1, 8, 1" in ptx and "mapa.shared::cluster" in ptx
    if "encode" in os.path.basename(src):
        assert "cp.async" in ptx
        args = _template_args(ptx, "kv_encode")
        # <N, G, BITS, M, DT, SEED, HAS_SIGN, LPTM, MINB, MODE, RND, KEYF, IL>
        assert args and all(len(a) == 13 for a in args), args
        for shape in ((128, 64, 3, 12, 0), (128, 64, 3, 12, 1), (256, 64, 4, 16, 1), (4096, 64, 2, 16, 0)):
            got = {(a[9], a[10]) for a in args if a[:5] == shape and a[11] == 0}
            assert got == {(0, 0), (0, 1), (1, 0), (1, 1)}, f"encode {shape}: (MODE, RND) variants {got}"
        for shape in ((128, 64, 3, 12, 0), (128, 64, 4, 12, 0), (64, 64, 3, 12, 0), (256, 64, 4, 12, 0)):
            got = {a[11] for a in args if a[:5] == shape and a[9:11] == (1, 1)}
            assert {1, 2, 3} <= got, f"encode {shape}: key front-end variants {got}"
        assert {a[1] for a in _template_args(ptx, "kv_key_front")} == {1, 2, 3}
        # the vpair layout of the value codes (IL 1): 3-bit, fp16 and bf16, N 64/128/256
        il = {(a[0], a[4]) for a in args if a[12] == 1}
        assert {(128, 0), (128, 1), (64, 0), (256, 0)} <= il and all(a[2] == 3 for a in args if a[12] == 1)
        assert "fma.rm.f32" in ptx  # mid-rise codes: floor by an FMA rounding toward -inf
        assert "min.relu.s16x2" in ptx and "mul.rn.f16x2" in ptx and "sub.rn.f16x2" in ptx
