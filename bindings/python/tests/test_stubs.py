"""The type stubs an editor reads (``_native.pyi``) agree with the compiled module: mypy's
``stubtest`` compares every class, method, parameter and default."""

from __future__ import annotations

import subprocess
import sys


def test_the_stubs_match_the_compiled_module() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "prefix_router", "--ignore-missing-stub"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout, run.stdout
