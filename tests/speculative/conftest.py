"""Speculative-decoding tests run one torch thread (the CI box is small and shared)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
