"""Shared fixtures: small scenarios built as dicts, and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def small_scenario(**over) -> dict:
    """A small synthetic scenario dict; keyword arguments replace top-level sections."""
    raw = {
        "name": "t", "seed": 1, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "engine": {"policy": "chunked", "max_num_batched_tokens": 512},
        "workload": {"synthetic": {
            "num_requests": 200, "request_rate": 20,
            "input_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.8, "max": 4000},
            "output_tokens": {"dist": "lognormal", "mean": 100, "sigma": 0.8, "max": 1000},
        }},
    }
    raw.update(over)
    return raw


@pytest.fixture
def root() -> Path:
    return ROOT
