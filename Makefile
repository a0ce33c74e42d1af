# Two entry points, each doing its own set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first: the CPU build on this machine's disk, before anything that depends on torch
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	# 1. plan Llama3-8B for a simulated 64-GPU H100 cluster and explain the plan
	$(BIN)/titan-autopar plan --model llama3 --flavor 8B --mesh dp_shard=8,tp=8 --hardware h100 \
		--seq-len 8192 --local-batch-size 1 --out out/llama3_8b_64gpu.plan.json --explain
	# 2. train the llama3 debug model with TorchTitan's trainer on 4 CPU ranks, parallelism.auto = true
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=4 -m titan_autopar.titan.cpu \
		--job.config_file train_configs/llama3_debug_cpu_auto4.toml

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) out
