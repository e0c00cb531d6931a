"""Engine tests run one torch thread: the CI box is small and shared, and it keeps steps fast."""

from __future__ import annotations

import pytest
import torch

from tests.engine.tiny import tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_model():  # vocab 512: fast, for scheduling and batching tests
    return tiny_model(512, seed=0)


@pytest.fixture(scope="session")
def qwen_vocab_model():  # the real vocabulary size, for prompts made with the real tokenizer
    from tests.engine.tiny import QWEN_VOCAB

    return tiny_model(QWEN_VOCAB, seed=1)


@pytest.fixture(scope="session")
def tokenizer():
    from tests.unit.conftest_text import ours

    return ours()
