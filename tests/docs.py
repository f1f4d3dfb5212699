"""Read the commands out of SKILL.md and README.md, so tests can check and run exactly what the docs say."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_RE = re.compile(r"python3 scripts/(?P<script>[a-z_]+\.py)(?P<rest>.*)")


@dataclass
class Command:
    doc: str
    block: int
    line: str
    script: str
    subcommand: str | None
    flags: list[str]
    tag: str | None  # "host path", "stock path", ... from a trailing comment

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line.split(" > ")[0].split("  #")[0])


def code_blocks(text: str, languages=("bash", "sh", "")) -> list[str]:
    """Fenced blocks, opened and closed line by line (a ```json block is skipped, not mis-paired)."""
    blocks, current, lang = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                if lang in languages:
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(doc: str) -> list[Command]:
    out = []
    for i, block in enumerate(code_blocks((ROOT / doc).read_text())):
        for raw in block.splitlines():
            m = SCRIPT_RE.search(raw)
            if not m:
                continue
            tag = raw.split("  # ", 1)[1].strip() if "  # " in raw else None
            words = m.group("rest").split("  #")[0].split(" > ")[0].split()
            sub = words[0] if words and not words[0].startswith("-") and m.group("script") == "launch.py" else None
            flags = [w.split("=")[0] for w in words if w.startswith("--")]
            out.append(Command(doc, i, raw.strip(), m.group("script"), sub, flags, tag))
    return out
