"""Shared fixtures: where the project's test models and (optionally) the reference models live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODELS = TESTS / "models"

# Models LiteRT cannot run as they are (they exist to be loaded and flagged, not invoked).
NOT_RUNNABLE = {"custom_op"}


def project_model_paths() -> list[Path]:
    """Every .tflite the project ships for its tests."""
    return sorted(MODELS.glob("*.tflite"))


def shared_model_paths() -> list[Path]:
    """The reference models in ../shared/models (or $DNNFUSION_SHARED_MODELS) when present.

    Tests never need them; where they exist, extra cases run on them too.
    """
    folder = Path(os.environ.get("DNNFUSION_SHARED_MODELS", REPO.parent / "shared" / "models"))
    return sorted(folder.glob("*.tflite")) if folder.is_dir() else []


def corpus_model_paths() -> list[Path]:
    """The converter corpus (bench/corpus.py build / build-torch) when $DNNFUSION_CORPUS names its
    folder: opt-in, as fusing 25 architectures takes most of an hour."""
    folder = os.environ.get("DNNFUSION_CORPUS")
    return sorted(Path(folder).glob("*.tflite")) if folder and Path(folder).is_dir() else []


def model_id(path: Path) -> str:
    """A test id: the model's file stem."""
    return path.stem


@pytest.fixture
def model_path():
    """Returns the path of a project test model by stem."""

    def get(stem: str) -> Path:
        path = MODELS / f"{stem}.tflite"
        assert path.exists(), f"missing test model {path}; run tests/models/make_models.py"
        return path

    return get
