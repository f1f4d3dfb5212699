"""One job: turn a model reference into its config files and weight size, through huggingface_hub."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from epyc import argtypes, cli, jsonio, masking
from epyc.errors import ScriptError
from epyc.facts import hubcache

T = TypeVar("T")

# huggingface_hub reads these at import: give every Hub call a real deadline unless the user set one.
os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

SAFETENSORS_DTYPE_BYTES = {
    **dict.fromkeys(("F64", "I64", "U64"), 8),
    **dict.fromkeys(("F32", "I32", "U32"), 4),
    **dict.fromkeys(("F16", "BF16", "I16", "U16"), 2),
    **dict.fromkeys(("I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "E8M0"), 1),
    **dict.fromkeys(("F6_E2M3", "F6_E3M2"), 0.75),
    "F4": 0.5,
}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
SERVE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_WEIGHT_BYTES = 1 << 50


class Unreadable(Exception):
    """The files exist but cannot be read here (gated, offline without cache, Hub down)."""

    def __init__(self, reason: str, message: str, fix: str):
        super().__init__(message)
        self.reason, self.message, self.fix = reason, message, fix


def weight_bytes(tensors: dict[str, tuple[str, int]], serve_dtype: str, tied_embeddings: bool) -> int:
    """Bytes as vLLM holds them: floats at the serving dtype, quantized as stored, a tied lm_head.weight skipped."""
    target = SERVE_DTYPE_BYTES.get(serve_dtype, 2)
    total = 0.0
    for name, (dtype, numel) in tensors.items():
        if not (tied_embeddings and name == "lm_head.weight"):
            total += numel * (target if dtype in FLOAT_DTYPES else SAFETENSORS_DTYPE_BYTES.get(dtype, 2))
    return int(total)


def tensors_from_header(header: dict) -> dict[str, tuple[str, int]]:
    """{tensor name: (dtype, element count)} from a safetensors JSON header."""
    out: dict[str, tuple[str, int]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ValueError(f"tensor {name[:80]!r} is not described by an object")
        if info.get("dtype", "BF16") not in SAFETENSORS_DTYPE_BYTES:  # its size per element would be a guess
            raise ValueError(f"tensor {name[:80]!r} has an unknown dtype {str(info.get('dtype'))[:20]!r}")
        shape = info.get("shape", [])
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape
        ):
            raise ValueError(f"tensor {name!r} has an invalid shape {str(shape)[:80]}")
        n = math.prod(shape)
        if n > 1 << 44:  # 17.6 trillion elements in one tensor: a corrupt header, not a checkpoint
            raise ValueError(f"tensor {name!r} claims more than 2**44 elements")
        out[name] = (str(info.get("dtype", "BF16")), n)
    return out


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file (8-byte little-endian length, then JSON): no weights read."""
    if not path.is_file():  # a FIFO or device would block or never end
        raise ValueError(f"{path.name} is not a regular file")
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > 100 * 1024 * 1024:
            raise ValueError(f"{path.name}: safetensors header claims {size} bytes")
        raw = f.read(size)
        if len(raw) != size:  # a header longer than the file: truncated, not a checkpoint
            raise ValueError(f"{path.name}: safetensors header claims {size} bytes, the file has {len(raw)}")
        try:
            header = json.loads(raw)
        except RecursionError:
            raise ValueError(f"{path.name}: safetensors header nested too deeply")
        if not isinstance(header, dict):
            raise ValueError(f"{path.name}: safetensors header is not a JSON object")
        return header


@dataclass
class ModelFiles:
    ref: str  # what the user passed
    kind: Literal["local", "hub", "hub-cache", "config"]
    revision: str | None
    folder: Path | None  # local or cached snapshot folder, when there is one

    def _local(self, name: str) -> Path | None:
        p = self.folder / name if self.folder else None
        # a FIFO under a known name is there, just not readable: the reader says so ("unknown", never "absent")
        return p if p and (p.is_file() or (os.path.lexists(p) and not p.is_dir())) else None

    def _ask(self, call: Callable[[], T], *absent: type[Exception]) -> T | None:
        """A Hub call; None when it answers with an `absent` error (no such thing: not "could not ask")."""
        try:
            return call()
        except absent:
            return None
        except Exception as exc:  # mapped to a reason the user can act on
            raise hub_error(exc, self.ref, self.revision)

    def _download(self, name: str) -> Path | None:
        """A file from the Hub into the cache; None when the repo has no such file."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import RemoteEntryNotFoundError

        path = self._ask(lambda: hf_hub_download(self.ref, name, revision=self.revision), RemoteEntryNotFoundError)
        return Path(path) if path is not None else None

    def text(self, name: str) -> str | None:
        p = self._local(name) if self.kind != "hub" else self._download(name)
        if p is None:
            return None
        return jsonio.read_input_text(p, f"{self.ref}: {name}", f"repair or re-download {name}", strict=False)

    def json(self, name: str) -> dict | None:
        text = self.text(name)
        if text is None:
            return None
        return jsonio.parse_json_object(text, f"{self.ref}: {name}", f"repair or re-download {name}")

    def config(self) -> dict:
        cfg = self.json("config.json")
        if cfg is None:
            raise ScriptError(
                f"{self.ref}: no config.json",
                "point --model at a Hugging Face model folder or repo (it must hold config.json)",
            )
        jsonio.check_schema(
            cfg,
            "model_config",
            f"{self.ref}: config.json has a value of the wrong type or range",
            "repair config.json (or re-download it): the field named must be what transformers writes there",
        )
        return cfg

    def weights(self, serve_dtype: str, tied_embeddings: bool) -> tuple[int, str] | None:
        """(bytes as vLLM will hold them, source) without downloading weights; None if unknown."""
        return (self._hub_weights if self.kind == "hub" else self._folder_weights)(serve_dtype, tied_embeddings)

    def gated(self) -> bool | str | None:
        """Does its host need HF_TOKEN to download it: the Hub's answer, "unknown" offline, None for a folder."""
        if self.kind != "hub":
            return None if self.kind == "local" else "unknown"
        from huggingface_hub import HfApi

        return bool(self._ask(lambda: HfApi().model_info(self.ref, revision=self.revision)).gated)

    def _index(self, name: str) -> dict:
        """A safetensors index file of the folder, or {} (none, or not a readable JSON object)."""
        index = self._local(name)
        try:
            doc = json.loads(jsonio.read_input_text(index, "index", "re-download it")) if index else {}
        except (ValueError, RecursionError, ScriptError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _served_shards(self) -> list[Path]:
        """What vLLM loads: consolidated*.safetensors if any (Mistral's), else *.safetensors; narrowed by the index."""
        shards, index = sorted(self.folder.glob("consolidated*.safetensors")), "consolidated.safetensors.index.json"
        if not shards:
            shards, index = sorted(self.folder.glob("*.safetensors")), "model.safetensors.index.json"
        weight_map = self._index(index).get("weight_map") if shards else None
        if not isinstance(weight_map, dict) or not weight_map:  # no index names them: every file is the model's
            return shards
        listed = {str(v) for v in weight_map.values()}
        if missing := sorted(listed - {s.name for s in shards}):
            raise ScriptError(
                f"{self.ref}: {index} names {len(missing)} shard(s) the folder does not have "
                f"({masking.clip(', '.join(missing), 200)}): a download cut short, and vLLM "
                "would not load it",
                "re-download the model (or finish the download), or pass --weight-gb N",
            )
        return [s for s in shards if s.name in listed]

    def _folder_weights(self, serve_dtype: str, tied: bool) -> tuple[int, str] | None:
        shards = self._served_shards()
        unreadable = None
        if shards:
            try:
                headers = [tensors_from_header(read_safetensors_header(shard)) for shard in shards]
                total = weight_bytes({k: v for h in headers for k, v in h.items()}, serve_dtype, tied)
                if not total:  # headers with no tensors (only __metadata__): a checkpoint of nothing
                    raise ValueError("the headers hold no tensors")
                return total, "safetensors_headers"
            except (OSError, ValueError, struct.error) as exc:
                unreadable = str(exc) or type(exc).__name__  # truncated or pointer files: the index may still say
        metadata = self._index("model.safetensors.index.json").get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if isinstance(total, int) and not isinstance(total, bool):
            if 0 < total <= MAX_WEIGHT_BYTES:
                return total, "safetensors_index_total_size"
            raise ScriptError(  # a number, but no model's size
                f"{self.ref}: model.safetensors.index.json says total_size {str(total)[:40]}, "
                f"not a size in [1, {MAX_WEIGHT_BYTES:,}] bytes",
                "re-download the model's index, or pass --weight-gb N",
            )
        if unreadable:  # their file sizes would be a guess (a git-lfs pointer is 130 bytes): no number at all
            raise ScriptError(
                f"{self.ref}: the safetensors headers cannot be read ({unreadable[:200]}) and there is "
                "no usable model.safetensors.index.json",
                "re-download the model (git-lfs pointers or truncated files have no header), or pass --weight-gb N",
            )
        files = sorted(p for pat in ("*.safetensors", "*.bin", "*.pt") for p in self.folder.glob(pat))
        total = sum(p.stat().st_size for p in files)  # a dangling link (a removed cache blob): the OSError names it
        return (total, "weight_file_sizes") if total else None

    def _hub_weights(self, serve_dtype: str, tied: bool) -> tuple[int, str] | None:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError

        api = HfApi()
        no_headers = (NotASafetensorsRepoError, SafetensorsParsingError)
        meta = self._ask(lambda: api.get_safetensors_metadata(self.ref, revision=self.revision), *no_headers)
        if meta is not None:
            # the Hub's headers get the checks a local header gets: a known dtype, whole dimensions in range
            files = meta.files_metadata.values()
            try:
                tensors = tensors_from_header(
                    {n: {"dtype": t.dtype, "shape": t.shape} for fm in files for n, t in fm.tensors.items()}
                )
            except ValueError as exc:
                raise ScriptError(
                    f"{self.ref}: a safetensors header on the Hub is not a checkpoint's: {masking.clip(str(exc), 200)}",
                    "check the repo's .safetensors files, or pass --weight-gb N",
                )
            return weight_bytes(tensors, serve_dtype, tied), "safetensors_metadata"
        info = self._ask(lambda: api.model_info(self.ref, revision=self.revision, files_metadata=True))
        sizes = [s.size or 0 for s in info.siblings or [] if s.rfilename.endswith((".safetensors", ".bin", ".pt"))]
        return (sum(sizes), "weight_file_sizes") if sizes else None


def hub_error(exc: Exception, ref: str, revision: str | None) -> Exception:
    """Map huggingface_hub / transport failures to Unreadable (could not look) or ScriptError (wrong input)."""
    from huggingface_hub import errors as e

    chain, cur = [], exc
    while cur is not None and len(chain) < 6:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    names = " ".join(type(c).__name__ for c in chain)
    text = " ".join(str(c) for c in chain)
    if any(isinstance(c, e.GatedRepoError) for c in chain):
        if "403" in text or "authorized list" in text or "restricted" in text or os.environ.get("HF_TOKEN"):
            return Unreadable(
                "gated",
                f"{ref} is gated and this token has not been granted access",
                "accept the model's license on its Hugging Face page with the account of HF_TOKEN",
            )
        return Unreadable(
            "gated",
            f"{ref} is gated: a token is needed",
            "export HF_TOKEN=<a token whose account accepted the license>",
        )
    if any(isinstance(c, e.RevisionNotFoundError) for c in chain):
        return ScriptError(
            f"{ref}: revision {revision!r} not found",
            "pass an existing branch, tag or commit with --revision (default: main)",
        )
    if any(isinstance(c, e.RepositoryNotFoundError) for c in chain):
        return ScriptError(
            f"{ref}: no such model on the Hub (or it is private)",
            "check the id (owner/name); for a private repo export HF_TOKEN",
        )
    if any(isinstance(c, e.OfflineModeIsEnabled) for c in chain):
        return not_cached(ref)
    if "Timeout" in names or "timed out" in text.lower():
        return Unreadable(
            "timeout",
            f"the Hub did not answer in time for {ref}",
            "check network access to the Hub (HF_ENDPOINT), or raise HF_HUB_ETAG_TIMEOUT",
        )
    if "ConnectError" in names or "Connection" in names or "LocalEntryNotFound" in names:
        return Unreadable(
            "network",
            f"cannot reach the Hub for {ref}",
            "check network access to the Hub (HF_ENDPOINT / proxy), or pass a local folder",
        )
    if isinstance(exc, e.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return Unreadable("hub_error", f"the Hub answered HTTP {status} for {ref}", "try again later")
    return Unreadable(
        "hub_error",
        f"Hub request for {ref} failed: {type(exc).__name__}: {exc}",
        "check network access to the Hub, or pass a local folder",
    )


def not_cached(ref: str) -> Unreadable:
    return Unreadable(
        "offline",
        f"{ref} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set",
        "download it once with network access, or pass a local folder",
    )


def with_deadline(fn: Callable[[], T], seconds: float, online: bool = True) -> T:
    """fn (Hub traffic, which huggingface_hub retries for minutes) under one overall deadline; offline it just runs."""
    if not online:
        return fn()
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            result["exc"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        cli.abandon_thread()  # still in the Hub client: the process ends without waiting for it
        raise Unreadable(
            "timeout",
            f"the Hub did not answer within {seconds:g}s",
            "check network access to the Hub (HF_ENDPOINT / proxy), raise --hub-timeout, or pass a local folder",
        )
    if "exc" in result:
        raise result["exc"]
    return result["value"]


def config_only(config: str) -> ModelFiles:
    """A model known by its config.json and the tokenizer and template files beside it, copied into a folder of
    their own (a weight beside them is never read: the config's shapes count the weights)."""
    text = jsonio.read_input_text(config, "--config", "pass the model's config.json")
    folder = jsonio.scratch_dir("epyc-config-")
    (folder / "config.json").write_text(text, encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json"):  # where a template is
        if (beside := jsonio.user_path(config).parent / name).is_file():
            (folder / name).write_bytes(jsonio.read_input_bytes(beside, f"{name} beside --config", f"repair {name}"))
    return ModelFiles(config, "config", None, folder)


def resolve(ref: str, revision: str | None) -> ModelFiles:
    """Local folder, Hub id in the cache (offline), or Hub id. Raises ScriptError on malformed input."""
    if not ref or not ref.strip():
        raise ScriptError("empty --model", "pass a Hub id such as Qwen/Qwen3-0.6B or a local folder")
    if revision is not None and not argtypes.is_revision(revision):
        raise ScriptError(f"malformed --revision {revision!r}", "pass a branch, tag or commit hash")
    p = jsonio.user_path(ref, "--model")
    if p.is_dir():
        # a folder has no revisions (another would be recorded, then never served); SKILL.md's default `main` is none
        if revision not in (None, "main"):
            raise ScriptError(
                f"--revision {revision!r} names a Hub branch, tag or commit, and {ref[:200]!r} is a local "
                "folder: its files are what is served",
                "drop --revision, or pass the Hub id (owner/name) to serve that revision",
            )
        return ModelFiles(ref, "local", None, jsonio.real_path(p))
    if p.exists():
        raise ScriptError(f"{ref} is a file, not a model folder", "pass the folder that holds config.json")
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ScriptError(f"model folder {ref} does not exist", "check the path, or pass a Hub id (owner/name)")
    hubcache.refuse_a_relative_hub_cache(dict(os.environ))  # huggingface_hub fixes its cache folder as it is imported
    try:  # with its prints on stderr (a bad HF_* value is printed; stdout is our JSON's)
        with contextlib.redirect_stdout(sys.stderr):
            import huggingface_hub.file_download  # noqa: F401
    except (ValueError, TypeError) as exc:
        raise ScriptError(
            f"huggingface_hub cannot start with this shell's HF_* settings ({type(exc).__name__})",
            "check HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT (seconds) and HF_ENDPOINT (a URL "
            "such as https://huggingface.co), or unset them",
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as exc:
        raise ScriptError(
            f"malformed model id {ref!r}: {str(exc).splitlines()[0]}",
            "use owner/name as on huggingface.co, e.g. Qwen/Qwen3-0.6B",
        )
    if constants.HF_HUB_OFFLINE:
        try:
            folder = snapshot_download(ref, revision=revision, local_files_only=True)
        except Exception:
            raise not_cached(ref) from None
        return ModelFiles(ref, "hub-cache", revision, Path(folder))
    refuse_an_unreachable_hub()
    return ModelFiles(ref, "hub", revision or "main", None)


HUB_PROBE_S = 5


def refuse_an_unreachable_hub() -> None:
    """One short request first: a Hub nothing answers for is said at once, not after the client's retries."""
    import requests
    from huggingface_hub import constants

    try:  # under a deadline of its own: requests' timeout does not bound a name lookup
        with_deadline(
            lambda: requests.head(constants.ENDPOINT, timeout=HUB_PROBE_S, allow_redirects=False).close(),
            HUB_PROBE_S + 1,
        )
    except (Unreadable, requests.RequestException) as exc:  # Unreadable: with_deadline's own timeout
        slow = isinstance(exc, (Unreadable, requests.Timeout))
        raise Unreadable(
            "timeout" if slow else "network",
            f"the Hub at {constants.ENDPOINT} did not answer "
            + (f"within {HUB_PROBE_S}s" if slow else f"({type(exc).__name__})"),
            "check network access to the Hub (HF_ENDPOINT / proxy); planning offline: pass a local folder, "
            "or --config with the model's config.json",
        ) from None
