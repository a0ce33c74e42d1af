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
		--seq-len 8192 --local-batch-size 1 --out out/llama3_8b_64gpu.plan.json --explain --force
	$(BIN)/titan-autopar show out/llama3_8b_64gpu.plan.json --out out/llama3_8b_64gpu.plan.png --force
	# 2. A/B on 4 CPU ranks: TorchTitan's trainer on the llama3 debug model with parallelism.auto = true
	#    against its FSDP recipe, from one seed checkpoint (table here; JSON and PNG in out/ab/);
	#    the auto arm is priced for these ranks, measured first (hardware = "calibrate", about 35 s);
	#    3 rounds, the arms taking turns to go first, so a slow spell on this shared machine weighs on both;
	#    --force: out/ is the demo's own folder, and whatever is there is replaced
	OMP_NUM_THREADS=1 $(BIN)/titan-autopar ab --config train_configs/llama3_debug_cpu_auto4.toml \
		--twin train_configs/llama3_debug_cpu_fsdp4.toml --nproc 4 --steps 10 --rounds 3 --force

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) out
