"""raycobo.algorithms is pure torch math: it must import neither ray nor mlflow."""

import subprocess
import sys


def test_algorithms_import_neither_ray_nor_mlflow():
    code = (
        "import sys, raycobo.algorithms, raycobo.data, raycobo.engine.local;"
        "bad=[m for m in ('ray','mlflow') if m in sys.modules];"
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, f"imported: {res.stdout} {res.stderr[-500:]}"
