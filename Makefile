# fwht-kv: `make sim` (main job) and `make test` set up .venv on first use.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-sim
OUT    ?= build

.PHONY: sim test verilog lint bench-gpu clean distclean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e ".[sim,test]"
	touch $@

## sim: generate Verilog, run the cocotb/Verilator testbenches against the golden model, print the summary
sim: $(STAMP)
	$(VPY) -m verif.sim --summary $(OUT)/sim_summary.json

## test: golden-model + RTL unit tests, then a short sim (what CI runs)
test: $(STAMP)
	$(VPY) -m pytest tests -q
	$(VPY) -m verif.sim --quick --summary $(OUT)/sim_summary_quick.json

## verilog: write Verilog + manifest for the default configuration to build/verilog
verilog: $(STAMP)
	$(VPY) -m rtl_gen --n 128 --block 64 --bits 3 --latency 2 --out $(OUT)/verilog

## bench-gpu: GPU correctness + benchmarks (needs an NVIDIA GPU with CuPy and torch)
bench-gpu:
	$(PYTHON) bench/gpu_bench.py --out bench/results

clean:
	rm -rf $(OUT) sim_build .pytest_cache .hypothesis

distclean: clean
	rm -rf $(VENV)
