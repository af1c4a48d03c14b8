"""docs/agents.md's example runs as written: a research env passed to rljax.run."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_agents_example_runs(tmp_path, capsys):
    text = (ROOT / "docs" / "agents.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    code = code.replace("/tmp/rljax_agents_example", str(tmp_path))
    exec(compile(code, "docs/agents.md", "exec"), {})
    final, tool_calls = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert 0.0 <= float(final) <= 1.0
    assert int(tool_calls) > 0  # the research env's counter reached the run's metrics
    assert (tmp_path / "metrics.jsonl").exists()
