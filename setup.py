"""Packaging for MemScope."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
VERSION = {}
exec((ROOT / "memscope" / "_version.py").read_text(), VERSION)

setup(
    name="memscope",
    version=VERSION["__version__"],
    description="Memory tracing and analysis for Megatron-LM / FlagScale training",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["memscope", "memscope.*"]),
    package_data={
        "memscope": [
            "py.typed",
            "reporters/templates/*",
            "reporters/templates/js/*.js",  # the pages' script, inlined by reporters/html.py
        ]
    },
    install_requires=["torch>=2.7.1", "pyyaml", "jinja2", "plotly"],  # 2.7.1: FlagScale 0.8.0
    extras_require={
        "megatron": ["megatron-core==0.16.1"],
        # The newest release, which CI runs the tests marked megatron_versions on (.ci/run);
        # its wheels are for CPython 3.12 only and ship megatron/training (the args parser).
        "megatron-newest": ["megatron-core==0.19.2"],
        # What the tests need beyond the package: FlagScale's bundled Megatron-LM (the patch
        # and train_step tests run it) imports six and regex; hypothesis for property tests.
        "dev": [
            "pytest",
            "ruff",
            "mypy",
            "types-PyYAML",
            "omegaconf",
            "six",
            "regex",
            "hypothesis",
            "tensorboard",  # a real SummaryWriter for the dashboard tests
            "wandb",  # a real W&B run, offline, for the dashboard tests
            # FlagScale 0.8.0's auto-tuner package imports these (the real AutoTuner test)
            "pandas",
            "psutil",
            "aiohttp",
            "tqdm",
            "einops",  # megatron-core's Megatron-FSDP device meshes (tests/test_static_fsdp.py)
        ],
    },
    entry_points={"console_scripts": ["memscope=memscope.cli:main"]},
)
