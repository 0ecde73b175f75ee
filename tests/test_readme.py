"""The README's code is run, not just read."""

import re
from pathlib import Path

from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_write_your_own_recipe_block_runs(monkeypatch, capsys):
    (block,) = [b for b in python_blocks() if "class Autoencoder" in b]
    assert len([line for line in block.splitlines() if line.strip()]) < 40
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    namespace = {}
    exec(compile(block, str(README), "exec"), namespace)
    history = namespace["result"].history
    assert history["reconstruction"][1] < history["reconstruction"][0]
    assert history["val_reconstruction"][1] < history["val_reconstruction"][0]
    assert "autoencoder" in namespace["beatloop"].recipes()
    # What the block prints: the two figures of the run it trained, one per epoch.
    printed = f"{history['reconstruction']} {history['val_reconstruction']}\n"
    assert capsys.readouterr().out == printed


def test_setup_commands_come_first():
    lines = README.read_text().splitlines()
    commands = [line for line in lines[:12] if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert "beatloop run supervised" in commands[0] and "pytest" in commands[1]
