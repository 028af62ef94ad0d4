"""pytest setup for the fault suite: the helpers here and in tests/deploy
import as plain modules; ``--full`` (or ``SWITCHYARD_CHAOS_FULL=1``) selects
the full size instead of the reduced one CI runs; ``--soak MINUTES`` runs the
whole mix continuously for that long."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "deploy"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the fault suite at full size (more tasks, agents and faults; several minutes)",
    )
    parser.addoption(
        "--soak",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help="run the fault suite's whole mix continuously for MINUTES and print the totals",
    )


@pytest.fixture
def soak_minutes(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--soak"))


@pytest.fixture
def full_size(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--full")) or os.environ.get("SWITCHYARD_CHAOS_FULL") == "1"
