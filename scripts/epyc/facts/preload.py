"""Shared libraries for the host path: the LD_PRELOAD list and executable-stack checks."""

from __future__ import annotations

import os
import re
import stat
import struct
from pathlib import Path

from epyc import jsonio, subproc
from epyc.errors import ScriptError

_PRELOAD_PATH = re.compile(r"/[A-Za-z0-9._+/-]+")
PRELOAD_DIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/opt/conda/lib")  # a preload's trees
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu"]
VLLM_FOLDER_CODE = (
    "import importlib.util as u, json; s = u.find_spec('vllm'); "
    "print('@@VLLMDIR@@' + json.dumps({'folder': s.submodule_search_locations[0] if s else None}))"
)
VLLM_FOLDER_SHAPE = {"type": "object", "properties": {"folder": {"type": ["string", "null"], "maxLength": 4095}}}


def preload_value(value: str | None, allowed: list[str]) -> str | None:
    """validate.py's LD_PRELOAD, accepted only as absolute paths to the libraries data/epyc.json names
    (tcmalloc, libiomp5): a plan never preloads anything else into the server."""
    if not value:
        return None
    fix = "re-run validate.py and pass its unmodified output to plan"
    if not isinstance(value, str):
        raise ScriptError(f"LD_PRELOAD {str(value)[:80]} is not text", fix)
    # the loader splits on spaces and colons and expands $LIB: a safe alphabet, each name a pinned library (.so.4.5.9)
    names = re.compile("|".join(re.escape(name.split(".so")[0] + ".so") + r"(?:\.[0-9]+)*" for name in allowed))
    for part in value.split(":"):
        folder = str(Path(part).parent)
        # the library's name AND a system library folder: a file of that name in /tmp is someone else's code
        if not (
            _PRELOAD_PATH.fullmatch(part)
            and names.fullmatch(Path(part).name)
            and ".." not in Path(part).parts
            and "//" not in part
            and (folder in PRELOAD_DIRS or folder.startswith(tuple(d + "/" for d in PRELOAD_DIRS)))
        ):
            raise ScriptError(f"LD_PRELOAD entry {part!r} is not one of {', '.join(allowed)}", fix)
    return value


def elf_has_execstack(data: bytes) -> bool | None:
    """Does this ELF shared object ask for an executable stack (PT_GNU_STACK with PF_X)? None: not ELF."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return None
    end = "<" if data[5] == 1 else ">"
    # where ELF64 / ELF32 keep the program headers' offset, their size and count, and a header's flags
    word, phoff_at, sizes_at, flags_at = ("Q", 32, 54, 4) if data[4] == 2 else ("I", 28, 42, 24)
    (phoff,) = struct.unpack_from(end + word, data, phoff_at)
    phentsize, phnum = struct.unpack_from(end + "HH", data, sizes_at)
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + phentsize > len(data):
            return None
        (p_type,) = struct.unpack_from(end + "I", data, off)
        if p_type == 0x6474E551:  # PT_GNU_STACK
            (p_flags,) = struct.unpack_from(end + "I", data, off + flags_at)
            return bool(p_flags & 1)
    return False


def find_libs(names: list[str], python: str | None) -> dict[str, str]:
    """Real paths of the allocator / OpenMP libraries worth preloading: system dirs, then the env."""
    dirs = [Path(d) for d in LIB_DIRS]
    if python:
        env = jsonio.real_path(python).parent.parent
        dirs += [env / "lib", *(env / "lib").glob("python3*/site-packages/*/lib")]
    found = {name: next((d / name for d in dirs if (d / name).exists()), None) for name in names}
    return {name: os.path.realpath(path) for name, path in found.items() if path}


def ld_preload_value(found: dict[str, str]) -> tuple[str | None, str]:
    """tcmalloc (minimal preferred) + the env's Intel OpenMP when present."""
    tc = found.get("libtcmalloc_minimal.so.4") or found.get("libtcmalloc.so.4")
    note = (
        "tcmalloc preloaded, as vLLM's CPU install guide advises; on the 2-vCPU EPYC runner the gain was within run-to-run noise (see reference.md)"
        if tc
        else "tcmalloc not found: apt-get install libtcmalloc-minimal4 (vLLM's CPU install guide advises preloading it)"
    )
    return ":".join(p for p in (tc, found.get("libiomp5.so")) if p) or None, note


def execstack_libs(python: str | None) -> list[str]:
    """vLLM's compiled extensions that ask for an executable stack (some guest kernels refuse them)."""
    if not python:
        return []
    # the user's interpreter answers as any probe does: bounded, shape-checked, and only a folder's name
    found, _why = subproc.run_probe([python], VLLM_FOLDER_CODE, "@@VLLMDIR@@", 60, shape=VLLM_FOLDER_SHAPE)
    folder = (found or {}).get("folder")
    try:
        candidates = sorted(Path(folder).glob("_C*.so")) if folder else []
    except (OSError, ValueError):  # a folder no file system holds (or with a NUL): nothing to scan
        return []
    flagged = []
    for so in candidates:
        try:
            if not stat.S_ISREG(os.stat(so).st_mode):  # a FIFO named _C.so would block the read forever
                continue
            with open(so, "rb") as f:
                head = f.read(1 << 16)
        except OSError:  # one unreadable library: the others are still scanned
            continue
        if elf_has_execstack(head):
            flagged.append(str(so))
    return flagged
