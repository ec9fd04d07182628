"""The layer contract in pyproject.toml (import-linter): cli > bench > train > accum > models > parallel >
nn > ops > data, each importing only from layers below, so stfast's subpackages hold no import circle.
`make test` runs it too; here it also runs under a plain `pytest`."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), "import-linter is a test dependency: pip install -e '.[test]'"
    r = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout
