"""Advice in the command line's spelling: beatloop's errors are written for Python
(``pass data=``), and the command says what to type instead (``pass --data KIND:PATH``),
keeping the Python name beside it."""

from __future__ import annotations

import re

#: Python spellings of advice in beatloop's errors, and the command line's words for them.
CLI_SPELLINGS = (
    (
        re.compile(r"\bpass data=(?:\.\.\.)?(?: \(a batched tf\.data\.Dataset[^)]*\))?"),
        "pass --data KIND:PATH (data= in Python)",
    ),
    (
        re.compile(r"\bpass models=\{\.\.\.\} with: "),
        "pass --model NAME=PATH.keras (models={...} in Python) for each of: ",
    ),
    (
        re.compile(r"\bpass models=\{'?(\w+)'?: \.\.\.\}"),
        r"pass --model \1=PATH.keras (models={'\1': ...} in Python)",
    ),
    (
        re.compile(r"\bpass steps_per_execution=(\S*) or 'auto'"),
        r"pass --steps-per-execution \1 or auto (steps_per_execution= in Python)",
    ),
    (
        re.compile(r"\bpass steps_per_execution=(\d+)\b"),
        r"pass --steps-per-execution \1 (steps_per_execution=\1 in Python)",
    ),
    (
        re.compile(r"\bpass accept_changed_data=True\b"),
        "pass --accept-changed-data (accept_changed_data=True in Python)",
    ),
    (
        re.compile(r"\bregistered in module (\S+): import that module first\b"),
        r"registered in module \1: pass --import \1",
    ),
    (
        re.compile(r"\bregistered in script (\S+): register it in this process first \([^)]*\)"),
        r"registered in script \1: pass --import \1 if that script trains only under "
        r'if __name__ == "__main__": (importing it runs the rest), or move the recipe into a '
        r"module of its own and pass --import MODULE",
    ),
    (
        re.compile(
            r"\bregistered in an interactive session: register it in this process first \([^)]*\)"
        ),
        "registered in an interactive session: move it into a module of its own and pass "
        "--import MODULE",
    ),
    (
        re.compile(r"^(no recipe named '[^']*'; known recipes: .*)$", re.DOTALL),
        r"\1; for a recipe of your own, pass --import MODULE (the module that registers it)",
    ),
    (
        re.compile(r"\bpass steps_per_epoch=N\b"),
        "end it, or pass steps_per_epoch=N to beatloop.fit in Python (the command line "
        "reads data sources to their end)",
    ),
)


#: ``fit``'s keywords that are ``run``'s flags, as errors about their values begin.
FLAG_VALUE = re.compile(
    r"^(?:invalid engine option: )?(?:\w+\()?'?(epochs|seed|checkpoint_every|max_to_keep"
    r"|max_rollbacks|divergence|divergence_window|steps_per_execution)'?(?: must |=\.\.\.\) takes )"
)


def for_command_line(message: str) -> str:
    """``message`` with its Python advice in the command line's spelling, and an error
    about a value ``run`` takes as a flag headed by that flag."""
    for pattern, replacement in CLI_SPELLINGS:
        message = pattern.sub(replacement, message)
    flag = FLAG_VALUE.match(message)
    if flag:
        message = f"--{flag[1].replace('_', '-')}: {message}"
    return message
