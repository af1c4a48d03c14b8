"""The `fake` fixture: a fake gcloud on PATH (tests/scripts/gcp/fake_gcloud.py)."""

import pytest

from tests.scripts.gcp.fake_gcloud import Fake


@pytest.fixture
def fake(tmp_path):
    f = Fake(tmp_path)
    yield f
    f.kill_leftovers()
