import os
import sys
from pathlib import Path

# Before anything imports TensorFlow (DESIGN.md: Keras 2 through tf-keras, no hub).
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# ../shared/data next to the checkout during development and in CI; absent elsewhere.
SHARED = Path(os.environ.get("XTREMEDISTIL_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"
FIXTURES = SHARED / "fixtures"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (real data lives outside the project)")
    return path


@pytest.fixture
def shared_data():
    return _require(SHARED_DATA)


@pytest.fixture
def fixtures_dir():
    return _require(FIXTURES)
