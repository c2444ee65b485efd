"""Test-wide settings: one torch thread (the CI machines have 2 noisy cores)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)

# Importing triton (torchvision pulls it in) after MuJoCo has created its EGL context segfaults the process on these
# machines, so which test files run together decided whether pytest crashed. Import it first, once.
try:  # noqa: SIM105
    import torchvision  # noqa: E402, F401
except ImportError:
    pass
