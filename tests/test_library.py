"""docs/library.md's example runs as written: custom reward and custom loss via the public API."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_library_example_runs(tmp_path, capsys):
    text = (ROOT / "docs" / "library.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    code = code.replace("/tmp/rljax_library_example", str(tmp_path))
    namespace: dict = {}
    exec(compile(code, "docs/library.md", "exec"), namespace)
    out = capsys.readouterr().out.strip().splitlines()[-1].split()
    initial, final, logp = map(float, out)
    assert 0.0 <= initial <= 1.0 and 0.0 <= final <= 1.0
    assert logp < 0.0  # the custom metric flowed through the learner
    assert (tmp_path / "metrics.jsonl").exists()
