"""The README's Python quickstart and its commands must keep working."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def python_block_after(heading: str) -> str:
    section = README.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quickstart_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(python_block_after("## Quickstart"), "README quickstart", "exec"), {})
    assert (tmp_path / "my-transformer" / "model.safetensors").is_file()


def test_readme_is_at_most_200_lines():
    lines = len(README.splitlines())
    assert lines <= 200, f"README.md has {lines} lines; keep it at most 200 and move details to docs/"


def test_ci_runs_the_readme_test_command():
    commands = re.search(r"## Two commands.*?```bash\n(.*?)```", README, re.S).group(1)
    test_command = next(line.split("#")[0].strip() for line in commands.splitlines() if "test" in line)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci


def test_readme_parameter_counts_are_the_measured_ones():
    from test_modeling import count_parameters

    from vanilla_transformer import VanillaTransformerConfig

    for preset in ("base", "big"):
        count = count_parameters(getattr(VanillaTransformerConfig, preset)(vocab_size=37000))
        assert re.search(rf"\| `{preset}` \|.*\| {count:,} \|", README), (preset, count)
