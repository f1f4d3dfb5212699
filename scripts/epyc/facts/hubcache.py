"""The Hugging Face cache: where it is, and whether it can be mounted into a container."""

from __future__ import annotations

import os
import re
from pathlib import Path

from epyc import jsonio
from epyc.errors import ScriptError
from epyc.jsonio import user_path
from epyc.masking import clip

HF_MOUNT_FIX = "move what is not a model out of that folder, or point HF_HUB_CACHE at a folder of its own (e.g. export HF_HUB_CACHE=~/.cache/huggingface/hub); then run validate.py and plan again"
KEY_FOLDERS = (".ssh", ".gnupg", ".docker", ".kube")
SYSTEM_TREES = ("/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/var/lib/docker")
# What huggingface_hub 2.x (`blobs`: its Xet store), diffusers and a disk's file system put at a hub cache's top: a
# folder holding anything else (/, /usr, a home, a disk's root) is never mounted read-write into a root container.
HUB_CACHE_ENTRIES = frozenset({".locks", "CACHEDIR.TAG", "lost+found", "blobs"})
_HUB_CACHE_ENTRY = re.compile(r"(models|datasets|spaces)--[^/]+|version[\w.-]*\.txt")
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "lustre", "gpfs", "beegfs"}


def hub_cache_env_problem(env: dict) -> str | None:
    """Why the Hugging Face cache this shell names is not one folder, or None: huggingface_hub takes an empty
    or relative HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME relative to wherever it runs."""

    def expand(value: str) -> str:
        return os.path.expandvars(os.path.expanduser(value))

    def said(name: str) -> str:
        return f"{name} is {'empty' if not env[name] else 'a relative path ' + repr(clip(env[name], 80))}"

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if name in env:  # the first one set decides, even empty (the client's os.getenv default chain)
            return None if os.path.isabs(expand(env[name])) else said(name)
    if "HF_HOME" in env:
        return None if os.path.isabs(expand(os.path.join(expand(env["HF_HOME"]), "hub"))) else said("HF_HOME")
    if "XDG_CACHE_HOME" in env and not os.path.isabs(
        expand(os.path.join(expand(os.path.join(env["XDG_CACHE_HOME"], "huggingface")), "hub"))
    ):
        return said("XDG_CACHE_HOME") + " and HF_HOME is unset"
    if "XDG_CACHE_HOME" not in env and "HOME" in env and not os.path.isabs(env["HOME"]):
        # the client takes an empty HOME as / (cache_root takes the account's home), a relative one as relative
        return said("HOME") + " and HF_HOME, HF_HUB_CACHE and XDG_CACHE_HOME are unset"
    return None


def refuse_a_relative_hub_cache(env: dict) -> None:
    if problem := hub_cache_env_problem(env):
        why = "the Hugging Face client would use a cache folder relative to wherever it runs, so the model would be looked for in a different folder by each step"
        raise ScriptError(
            f"{problem}: {why}", "export it as an absolute path (e.g. HF_HOME=$HOME/.cache/huggingface) or unset it"
        )


def cache_root(home: str | None = None) -> Path:
    """The user's cache per the XDG spec: $XDG_CACHE_HOME when absolute, else ~/.cache; another host's: home/.cache."""
    if home:
        return Path(home) / ".cache"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return user_path(xdg, "XDG_CACHE_HOME")
    home = os.environ.get("HOME")
    if not home:  # unset or empty ("" expands to "/"): the account's own home, as a login would set it
        import pwd

        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = ""
    if not os.path.isabs(home):
        raise ScriptError(
            f"HOME {home[:200]!r} is not an absolute path, and XDG_CACHE_HOME names no absolute folder: there is no cache folder to use",
            "export XDG_CACHE_HOME=/an/absolute/folder (or HOME=/your/home), then run it again",
        )
    return user_path(home, "HOME") / ".cache"


def bind_mount(source: str, target: str, read_only: bool = False) -> list[str]:
    """`-v SOURCE:TARGET[:ro]` as two argv elements; a path with ':' or ',' (another mount option to the runtime)
    or an unprintable character (the summary's command would show another folder) is refused, never passed."""
    for path in (source, target):
        if ":" in path or "," in path or not path.startswith("/") or not path.isprintable():
            raise ScriptError(
                f"cannot mount {path!r}: a container mount needs an absolute path of printable characters, without ':' or ','",
                "move or link the folder to a plain path (for the HF cache: export HF_HOME=/a/path)",
            )
    norm = "/" + os.path.normpath(source).lstrip("/")  # POSIX keeps a leading '//'
    # a key folder may be empty or not there yet: the check of what a cache holds would pass it
    if in_system_tree(norm) or not set(KEY_FOLDERS).isdisjoint(norm.split("/")):
        raise ScriptError(
            f"cannot mount {source!r} into the container: it is in a system tree or a key folder (the HF cache is mounted read-write into a root container)",
            "point HF_HOME at a cache folder of its own, e.g. export HF_HOME=~/.cache/huggingface",
        )
    return ["-v", f"{source}:{target}" + (":ro" if read_only else "")]


def in_system_tree(path: str) -> bool:
    """At or below /etc, /proc, /sys, /dev, /run, /var/run, /boot or /var/lib/docker (path normalised)."""
    return any(path == t or path.startswith(t + "/") for t in SYSTEM_TREES)


def foreign_cache_entries(entries: list[str]) -> list[str]:
    """The entries of a would-be hub cache that no Hugging Face library puts there."""
    return [e for e in entries if e not in HUB_CACHE_ENTRIES and not _HUB_CACHE_ENTRY.fullmatch(e)]


def hf_mount_problem(path: str, found: dict | None) -> str | None:
    """Why the hub cache validate.py recorded cannot be mounted read-write into a root container now, or
    None: it must be at that real path and hold only models, datasets and spaces (or nothing yet)."""
    if not found:
        return "was not looked at on this machine"
    if found.get("error"):
        return f"cannot be read ({found['error']})"
    if found["real"] != path:
        return f"is {found['real']} now (a link, or a path not in its plain form), not the folder validate.py checked"
    foreign = foreign_cache_entries(found.get("entries") or [])
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        return f"holds {', '.join(repr(e[:80]) for e in foreign[:5])}{more}, which a hub cache does not hold (only models--*, datasets--*, spaces--* folders)"
    return None


def resolve_hf_cache(env: dict) -> dict:
    """The hub cache a container mounts read-write, found as huggingface_hub finds it (HF_HUB_CACHE, else
    HF_HOME/hub), links followed, NFS flagged. Only the hub: the rest of HF_HOME holds other tools' files."""
    refuse_a_relative_hub_cache(env)
    named = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    # ~ then $VARS, as huggingface_hub expands them: once for a named hub cache, twice for HF_HOME (then HF_HOME/hub)
    if named:
        hub = jsonio.user_path(named, "HF_HUB_CACHE", expand_vars=True)
    else:
        # the client's default, not cache_root: it expands XDG_CACHE_HOME=~/x or $VAR/x, which the XDG spec ignores
        default = os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        home = jsonio.user_path(env.get("HF_HOME") or default, "HF_HOME", expand_vars=True)
        hub = jsonio.user_path(home / "hub", "the Hugging Face cache (HF_HOME/hub)", expand_vars=True)
    return _hf_cache_at(hub)


def _hf_cache_at(home: Path) -> dict:
    notes = []
    real = Path(os.path.realpath(home))
    there = next(p for p in (real, *real.parents) if p.exists())  # what is there now, or the folder it goes in
    if not there.is_dir():  # a file as the cache (or HF_HOME): the runtime cannot mount it, downloads fail
        raise ScriptError(
            f"the Hugging Face cache {str(home)[:300]} is not a folder ({str(there)[:300]} is {'a file' if there.is_file() else 'not a folder: a pipe, socket or device'})",
            "export HF_HUB_CACHE (or HF_HOME) to a folder, or leave both unset for ~/.cache/huggingface",
        )
    fstype = filesystem_type(real)
    nfs = fstype in NETWORK_FS
    if real != Path(os.path.abspath(home).replace("//", "/")):  # "//x" is no link: POSIX keeps a leading //
        notes.append(f"{home} is a link to {real}; the real path is mounted")
    if not real.exists():
        notes.append(f"{real} does not exist yet; it is created on first download")
    if nfs:
        notes.append(
            f"{real} is on {fstype}: root-squash can deny a root container; use a local folder (HF_HOME=/local/path) if the container cannot read it"
        )
    return {"path": str(real), "mount_subdir": "hub", "nfs": nfs, "fstype": fstype, "note": "; ".join(notes) or None}


def cache_listing(path: str) -> dict:
    """The HF cache folder now, for hf_mount_problem: its real path and entries (None: not made yet), or its error."""
    try:
        real = os.path.realpath(path)
        if not os.path.lexists(real):
            return {"real": real, "entries": None, "error": None}
        if not os.path.isdir(real):
            return {"real": real, "entries": None, "error": "not a folder"}
        with os.scandir(real) as found:
            return {"real": real, "entries": sorted(e.name for e in found), "error": None}
    except (OSError, ValueError) as exc:  # ValueError: a NUL in a hand-edited path
        return {"real": path, "entries": None, "error": getattr(exc, "strerror", None) or str(exc)[:200]}


def filesystem_type(path: Path) -> str | None:
    """The file system of the deepest mount that holds path."""
    import psutil

    held = [p for p in psutil.disk_partitions(all=True) if f"{path}/".startswith(p.mountpoint.rstrip("/") + "/")]
    return max(held, key=lambda p: len(p.mountpoint)).fstype if held else None


def state_root(home: str | None = None) -> Path:
    """Where default state dirs go (a plan without --state-dir, up's run folder), here or under another `home`."""
    return cache_root(home) / "serving-llms-on-epyc" / "run"
