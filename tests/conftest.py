from __future__ import annotations

import os

import pytest


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A directory on sys.path (this process and subprocesses) to drop fake plugin dists into."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    import importlib

    importlib.invalidate_caches()
    return tmp_path
