"""mmgrpo: Group Relative Policy Optimization for multimodal models.

Two front-ends share one library (``mmgrpo.core``, ``mmgrpo.engine``, ``mmgrpo.utils``, ``mmgrpo.video``,
``mmgrpo.synthetic``):
  * ``mmgrpo.vlm`` - Qwen2/2.5/3-VL video and image policies (temporal grounding, video QA, REC);
  * ``flow_grpo`` - SD3 / FLUX flow-matching generators with exact per-step SDE log-probs.
"""
from setuptools import find_packages, setup

# No torch pin: users install the CUDA build that matches their cluster.
INSTALL_REQUIRES = [
    "torch>=2.4",
    "torchvision",
    "transformers>=4.57",
    "diffusers>=0.35",
    "accelerate>=1.0",
    "peft>=0.17",
    "qwen-vl-utils>=0.0.14",
    "open_clip_torch>=3.0",
    "decord>=0.6; platform_machine == 'x86_64'",
    "av>=12",
    "safetensors",
    "pyyaml",
    "tqdm",
    "matplotlib",
    "tensorboard",
    "pillow",
    "numpy",
    "requests",
]

EXTRAS = {
    "dev": [
        "pytest>=8",
        "pytest-timeout",
        "hypothesis>=6",
        "trl>=1.0",  # side-by-side benchmark against TRL's GRPOTrainer (eval/perf)
        "rapidocr-onnxruntime>=1.4",  # ships real OCR weights: exercised by the OCR-reward test
        "dashscope",  # ships Qwen's BPE ranks (resources/qwen.tiktoken): the real-tokenizer tests, never imported
        "tiktoken",  # read by transformers' tiktoken converter for the real Qwen tokenizer (tests only)
        # the user guide: `mkdocs build --strict` (tests/test_docs.py), API pages from docstrings
        "mkdocs>=1.6",
        "mkdocs-material>=9.5",
        "mkdocstrings>=0.26",
        "mkdocstrings-python>=1.12",
    ],
    "gpu": ["xformers"],
    "ocr": ["rapidocr-onnxruntime>=1.4"],
    "vllm": ["vllm>=0.33"],  # the public V1 API mmgrpo.vlm.models.vllm_backend was checked against (0.33.0)
}

setup(
    name="mmgrpo",
    version="0.1.0",
    description="GRPO for multimodal models: Qwen-VL video/image policies and SD3/FLUX flow-matching generators",
    long_description=__doc__,
    packages=find_packages(include=["mmgrpo", "mmgrpo.*", "flow_grpo", "flow_grpo.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "mmgrpo=mmgrpo.vlm.cli:main",
            "flow_grpo=flow_grpo.cli:main",
        ]
    },
)
