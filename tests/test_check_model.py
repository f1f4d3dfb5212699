"""check_model.py: registry kinds, chat templates, endpoints, exit codes."""

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import (
    _at_revision,
    _interpreter,
    config_only_model,
    facts_for,
    host_plan,
    load_docs,
    plan_from,
    plan_from_4,
)
from epyc import argtypes, bundle
from epyc.decisions import model_check
from epyc.decisions.model_check import classify_template
from epyc.errors import ScriptError
from epyc.facts import architectures
from model_fixtures import FIXTURES, model_folder


def check(script, model, *args, **kw):
    return script("check_model.py", "--model", str(model), *args, **kw)


@pytest.mark.parametrize(
    "model,kind,primary,code",
    [
        ("Qwen3-0.6B", "text", "chat_completions", 0),
        ("Qwen2.5-7B-Instruct", "text", "chat_completions", 0),
        ("Llama-3.1-8B-Instruct", "text", "chat_completions", 0),
        ("DeepSeek-V2-Lite", "text", "chat_completions", 0),
        ("gemma-2-9b-it", "text", "chat_completions", 0),
        ("Mistral-7B-v0.1", "text", "completions", 0),  # base: no template -> raw prompts
        ("OLMo-2-0425-1B", "text", "completions", 0),
        ("Qwen2.5-VL-7B-Instruct", "multimodal", "chat_completions", 0),
        ("bge-base-en-v1.5", "pooling", None, 1),
        ("bert-base-uncased", "pooling", None, 1),  # BertForMaskedLM: pooling in 0.32
        ("resnet-50", "unsupported", None, 1),
        ("chatglm3-6b", "text", None, 1),  # its tokenizer is the repo's own code
        ("falcon-40b", "text", "completions", 0),
    ],
)
def test_fixture_models_against_the_host_stack_registry(script, model, kind, primary, code):
    r = check(script, FIXTURES / model, "--vllm-version", "0.32.0")
    assert (r.doc["kind"], r.doc["primary_endpoint"], r.code) == (kind, primary, code)
    assert r.doc["registry_source"] == "snapshot:data/vllm_registry/0.32.0.json"
    assert r.doc["launchable"] is (code == 0)
    assert r.doc["supported"] is (code == 0)  # a known kind: a yes or a no, never "undetermined"'s None


def test_endpoints_follow_the_template():
    policy = bundle.load_epyc()["model_support_policy"]
    d = model_check.endpoints_for("text", "present", policy)
    assert d["supported_endpoints"] == ["chat_completions", "completions"]
    for status in ("absent", "ambiguous"):
        assert model_check.endpoints_for("text", status, policy)["primary_endpoint"] == "completions"
    # a template that could not be read is not guessed at: verify settles it on the running server
    for kind in ("text", "multimodal", "undetermined"):
        d = model_check.endpoints_for(kind, "unknown", policy)
        assert (d["primary_endpoint"], d["supported_endpoints"], d["launchable"]) == ("unknown", [], True)


def test_registry_version_matters(script):
    # BertForMaskedLM is not in vLLM 0.25.1's registry at all (the container pin)
    r = check(script, FIXTURES / "bert-base-uncased", "--vllm-version", "0.25.1")
    assert r.doc["kind"] == "unsupported" and r.code == 1 and "0.25.1" in r.doc["message"]


def test_no_registry_is_undetermined_and_proceeds(script):
    r = check(script, FIXTURES / "Qwen3-0.6B", "--vllm-version", "9.9.9")
    assert r.code == 0 and r.doc["kind"] == "undetermined" and r.doc["registry_source"] is None
    assert r.doc["primary_endpoint"] == "chat_completions"  # its chat template was read


def test_multimodal_without_template_is_not_launchable(script, tmp_path):
    folder = model_folder("Qwen2.5-VL-7B-Instruct", tmp_path)
    (folder / "chat_template.json").unlink()
    r = check(script, folder, "--vllm-version", "0.32.0")
    assert r.code == 1 and r.doc["launchable"] is False and "--chat-template" in r.doc["message"]


def test_template_file_precedence():
    tok = {"chat_template": "{{ tok }}"}
    assert model_check.classify_template("{{ jinja }}", tok, None)["source"] == "chat_template.jinja"
    assert model_check.classify_template(None, tok, {"chat_template": "x"})["source"] == "tokenizer_config.json"
    assert model_check.classify_template(None, {}, {"chat_template": "x"})["source"] == "chat_template.json"
    assert model_check.classify_template("   ", {}, None)["status"] == "absent"


@pytest.mark.parametrize(
    "value,status,selected,names",
    [
        (
            [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}],
            "present",
            "default",
            ["default", "tool_use"],
        ),
        ([{"name": "rag", "template": "a"}], "present", "rag", ["rag"]),
        (
            [{"name": "rag", "template": "a"}, {"name": "tool_use", "template": "b"}],
            "ambiguous",
            None,
            ["rag", "tool_use"],
        ),
        ([], "absent", None, []),
    ],
)
def test_template_lists(value, status, selected, names):
    t = model_check.classify_template(None, {"chat_template": value}, None)
    assert (t["status"], t["selected_name"], t["names"]) == (status, selected, names)


def test_ambiguous_template_serves_completions_with_choice_named(script, tmp_path):
    folder = model_folder("Qwen3-0.6B", tmp_path)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["chat_template"] = [{"name": "rag", "template": "a"}, {"name": "tool_use", "template": "b"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    r = check(script, folder, "--vllm-version", "0.32.0")
    assert r.code == 0 and r.doc["primary_endpoint"] == "completions"
    assert r.doc["chat_template"]["status"] == "ambiguous" and "rag" in r.doc["message"]


@pytest.mark.parametrize(
    "ref,needle",
    [
        ("owner/na me", "malformed model id"),
        ("a/b/c", "does not exist"),
        ("", "empty"),
        ("./missing-folder", "does not exist"),
    ],
)
def test_bad_model_ids(script, ref, needle):
    r = check(script, ref)
    assert r.code == 1 and needle in r.doc["error"]


def test_folder_problems(script, tmp_path):
    r = check(script, tmp_path)
    assert r.code == 1 and "no config.json" in r.doc["error"]
    (tmp_path / "config.json").write_text("[]")
    assert "not a JSON object" in check(script, tmp_path).doc["error"]
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert "architectures" in check(script, tmp_path).doc["error"]
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    r = check(script, tmp_path)
    assert r.code == 1 and "tokenizer_config.json is not JSON" in r.doc["error"]


def test_bad_revision_string(script):
    r = check(script, "Qwen/Qwen3-0.6B", "--revision", "main; rm -rf /")
    assert r.code == 1 and "revision" in r.doc["error"]


def test_registry_kinds_and_versions():
    """Generation wins over pooling for an architecture in both; a snapshot is keyed by the release."""
    from epyc.facts import architectures

    dicts = {"_EMBEDDING_MODELS": ["LlamaForCausalLM", "BertModel"], "_TEXT_GENERATION_MODELS": ["LlamaForCausalLM"]}
    assert architectures.kinds_from_dicts(dicts) == {"BertModel": "pooling", "LlamaForCausalLM": "text"}
    assert argtypes.normalize_version("0.32.0+cpu") == "0.32.0"


def test_image_registry_probe_via_the_fake_runtime(script, tmp_path):
    """Container path: the registry is probed inside the image only when it is pulled (FAKE runtime)."""
    import os

    from conftest import ROOT

    rt = tmp_path / "rt"
    rt.mkdir()
    env = {"FAKE_RT_DIR": str(rt), "PATH": f"{ROOT / 'tests' / 'fakes' / 'bin'}:{os.environ['PATH']}"}
    image = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"
    r = check(script, FIXTURES / "Qwen3-0.6B", "--image", image, "--vllm-version", "0.25.1", env=env)
    assert r.code == 0 and r.doc["registry_source"] == "snapshot:data/vllm_registry/0.25.1.json"
    assert any("not pulled" in n for n in r.doc["notes"])
    (rt / "images").write_text(image + "\n")
    r = check(script, FIXTURES / "Qwen3-0.6B", "--image", image, "--vllm-version", "0.25.1", env=env)
    assert any("probe failed" in n for n in r.doc["notes"]) and r.doc["kind"] == "text"
    probe = [json.loads(x) for x in (rt / "calls.jsonl").read_text().splitlines() if '"--entrypoint"' in x]
    assert probe and probe[-1]["argv"][:4] == ["run", "--rm", "--network=none", "--entrypoint"]


def test_an_unreadable_hub_model_is_undetermined_and_says_why(script, tmp_path):
    """Offline and not cached: nothing is guessed -- the endpoint waits for verify, the launch confirms."""
    r = script(
        "check_model.py", "--model", "Qwen/NotCached-xyz", env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    )
    d = r.doc
    assert r.code == 0 and (d["source"], d["kind"], d["supported"], d["unreadable_reason"]) == (
        "hub",
        "undetermined",
        None,
        "offline",
    )
    assert (d["primary_endpoint"], d["supported_endpoints"], d["launchable"]) == ("unknown", [], True)
    assert d["chat_template"] == {"status": "unknown", "source": None, "selected_name": None, "names": []}
    assert d["message"] == (
        "Qwen/NotCached-xyz is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
        "support could not be determined -- proceed, the launch confirms"
    )
    assert d["fix"] == "download it once with network access, or pass a local folder" and d["notes"] == []
    assert d["registry_source"].startswith("snapshot:") and d["architectures"] == []


def test_verdict_messages_name_the_choice_to_make(script, tmp_path):
    r = check(script, FIXTURES / "Qwen3-0.6B", "--vllm-version", "9.9.9")
    assert r.doc["supported"] is None and r.doc["notes"] == [
        "no registry snapshot for vLLM 9.9.9 in data/vllm_registry/"
    ]
    assert r.doc["message"] == "support could not be determined here; proceed, the launch confirms"
    folder = model_folder("Qwen3-0.6B", tmp_path / "a")
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["chat_template"] = [{"name": "rag", "template": "a"}, {"name": "tool_use", "template": "b"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    assert check(script, folder, "--vllm-version", "0.32.0").doc["message"] == (
        "Qwen3ForCausalLM serves as text generation in vLLM 0.32.0; use /v1/completions (several chat templates, "
        "no default (rag, tool_use): choose one with --chat-template)"
    )
    mm = model_folder("Qwen2.5-VL-7B-Instruct", tmp_path / "b")
    (mm / "chat_template.json").write_text(
        json.dumps({"chat_template": [{"name": "a", "template": "x"}, {"name": "b", "template": "y"}]})
    )
    r = check(script, mm, "--vllm-version", "0.32.0")
    assert r.code == 1 and r.doc["message"] == (
        "Qwen2_5_VLForConditionalGeneration is multimodal in vLLM 0.32.0 but it has several chat templates and no "
        "default (a, b): pass --chat-template <file> to serve it"
    )


def test_an_interpreter_whose_registry_cannot_be_probed_is_an_error_not_a_snapshot(script):
    r = check(script, FIXTURES / "Qwen3-0.6B", "--python", "/bin/true")
    assert r.code == 1 and r.doc["error"].startswith("--python /bin/true: its vLLM registry could not be probed (")
    assert "drop --python" in r.doc["fix"]


def test_a_model_only_remote_code_loads_is_refused_before_anything_is_planned(script, tmp_path):
    """The thirty-second audit, F2: chatglm3-6b (a tokenizer of the repository's own code) and a config whose
    model_type only its auto_map defines passed as "serves as text generation"; vLLM 0.32 refuses both at load
    without --trust-remote-code, which this bundle never passes: after the confirmation, the pull and the load."""
    r = check(script, FIXTURES / "chatglm3-6b", "--vllm-version", "0.32.0")
    assert r.code == 1 and r.doc["supported"] is False and r.doc["launchable"] is False
    assert (
        r.doc["remote_code"] == "its tokenizer (ChatGLMTokenizer) is the repository's own code (auto_map AutoTokenizer)"
    )
    assert "--trust-remote-code, which this bundle does not pass" in r.doc["error"] and "read its code" in r.doc["fix"]
    folder = tmp_path / "custom"
    folder.mkdir()
    cfg = json.loads((FIXTURES / "Qwen3-0.6B" / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**cfg, "model_type": "my_custom_lm", "auto_map": {"AutoConfig": "configuration_x.MyConfig"}})
    )
    r = check(script, folder, "--vllm-version", "0.32.0")
    assert r.code == 1 and r.doc["remote_code"].startswith("its config (model_type 'my_custom_lm') is the repository's")


def test_remote_code_is_judged_as_transformers_and_vllm_decide():
    own = {
        "config_types": ["qwen3", "chatglm", "phi3", "kimi_k2"],
        "tokenizer_config_types": ["qwen3", "phi3", "kimi_k2"],
        "tokenizer_classes": ["Qwen2Tokenizer", "LlamaTokenizer"],
        "remote_tokenizer_ignored": ["deepseek_v3"],
    }
    custom_tok = {"auto_map": {"AutoTokenizer": ["tok.T", None]}, "tokenizer_class": "MyTokenizer"}
    # an auto_map beside a type transformers has (Phi-3 shipped one): the built-in class loads
    assert model_check.remote_code_needed({"model_type": "phi3", "auto_map": {"AutoConfig": "c.C"}}, None, own) is None
    assert (
        model_check.remote_code_needed(
            {"model_type": "chatglm"}, {**custom_tok, "tokenizer_class": "LlamaTokenizerFast"}, own
        )
        is None
    )  # a class transformers has, its Fast name included
    assert (
        model_check.remote_code_needed({"model_type": "qwen3"}, custom_tok, own) is None
    )  # qwen3's config maps a tokenizer
    assert (
        model_check.remote_code_needed({"model_type": "kimi_k2"}, custom_tok, own) is None
    )  # vLLM's class, mapped too
    assert model_check.remote_code_needed({"model_type": "chatglm"}, custom_tok, own).startswith(
        "its tokenizer (MyTokenizer)"
    )
    assert (
        model_check.remote_code_needed({"model_type": "chatglm"}, {"auto_map": ["tok.T", None]}, own)
        == "its tokenizer is the repository's own code (auto_map AutoTokenizer)"
    )  # the older list form
    assert (
        model_check.remote_code_needed({"model_type": "deepseek_v3"}, custom_tok, own) is None
    )  # transformers ignores it
    # transformers reads the tokenizer's auto_map from tokenizer_config.json only
    assert (
        model_check.remote_code_needed({"model_type": "x", "auto_map": {"AutoTokenizer": ["t.T", None]}}, None, own)
        is None
    )
    assert (
        model_check.remote_code_needed({"auto_map": {"AutoConfig": "c.C"}}, None, own) is None
    )  # no model_type: vLLM maps
    assert (
        model_check.remote_code_needed({"model_type": "x", "auto_map": {"AutoConfig": "c.C"}}, None, None) is None
    )  # no lists


def _remote_code_variants(tmp: Path) -> list[Path]:
    """Shapes no fixture has: what the registry lists and the auto_map forms decide (the review of the
    thirty-second audit's fix: Kimi's configs are vLLM's and map a tokenizer; config.json's AutoTokenizer is
    not read; the older list form is; a config without model_type is mapped by its architecture)."""
    cfg = json.loads((FIXTURES / "Qwen3-0.6B" / "config.json").read_text())
    custom_tok = {"auto_map": {"AutoTokenizer": ["tokenization_x.MyTokenizer", None]}, "tokenizer_class": "MyTokenizer"}
    shapes = {
        "custom": ({**cfg, "model_type": "my_custom_lm", "auto_map": {"AutoConfig": "configuration_x.MyConfig"}}, None),
        "qwen3-with-auto-map": ({**cfg, "auto_map": {"AutoConfig": "configuration_x.MyConfig"}}, None),
        "kimi-k2": (
            {
                "model_type": "kimi_k2",
                "architectures": ["DeepseekV3ForCausalLM"],
                "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
            },
            {
                "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                "tokenizer_class": "TikTokenTokenizer",
            },
        ),
        "falcon-config-tokenizer": (
            {
                "model_type": "falcon",
                "architectures": ["FalconForCausalLM"],
                "auto_map": {"AutoTokenizer": ["tok.MyTok", None]},
            },
            {"tokenizer_class": "MyTok"},
        ),
        "falcon-legacy-list": (
            {"model_type": "falcon", "architectures": ["FalconForCausalLM"]},
            {"auto_map": ["tok.MyTok", None], "tokenizer_class": "MyTok"},
        ),
        "falcon-custom-tokenizer": ({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}, custom_tok),
        "falcon-pretrained-tokenizer": (
            {"model_type": "falcon", "architectures": ["FalconForCausalLM"]},
            {**custom_tok, "tokenizer_class": "PreTrainedTokenizer"},
        ),
    }
    out = []
    for name, (config, tok) in shapes.items():
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(config))
        if tok is not None:
            (tmp / name / "tokenizer_config.json").write_text(json.dumps(tok))
        out.append(tmp / name)
    return out


@pytest.mark.e2e
def test_remote_code_verdicts_agree_with_vllms_own_loading(stack, tmp_path):
    """vLLM 0.32's own loading (its get_config, and its get_tokenizer, both without trust_remote_code) over
    every fixture model and the variants: it refuses for remote code exactly where check_model says so."""
    import subprocess

    folders = [p.parent for p in FIXTURES.glob("*/config.json")] + _remote_code_variants(tmp_path)
    probe = (
        "import json, sys\n"
        "import vllm.config\n"
        "from vllm.transformers_utils.config import get_config\n"
        "from vllm.tokenizers import get_tokenizer\n"
        "out = {}\n"
        "for folder in sys.argv[1:]:\n"
        "    refused = False\n"
        "    for load in (lambda: get_config(folder, trust_remote_code=False),\n"
        "                 lambda: get_tokenizer(folder, trust_remote_code=False)):\n"
        "        try:\n"
        "            load()\n"
        "        except Exception as exc:\n"
        "            refused = refused or 'trust_remote_code' in str(exc)\n"
        "    out[folder] = refused\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run(
        [stack["python"], "-c", probe, *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    own = json.loads((architectures.SNAPSHOT_DIR / "0.32.0.json").read_text())["own_code"]
    ours = {}
    for folder in folders:
        tok = folder / "tokenizer_config.json"
        ours[str(folder)] = (
            model_check.remote_code_needed(
                json.loads((folder / "config.json").read_text()),
                json.loads(tok.read_text()) if tok.exists() else None,
                own,
            )
            is not None
        )
    assert ours == theirs
    refused = {Path(f).name for f, r in theirs.items() if r}
    assert {"chatglm3-6b", "custom", "falcon-legacy-list", "falcon-custom-tokenizer"} <= refused
    assert not {"qwen3-with-auto-map", "kimi-k2", "falcon-config-tokenizer"} & refused


def test_a_relative_model_folder_in_a_very_deep_current_folder_is_a_clear_error(tmp_path):
    """17 nested folders of 240 characters: the absolute path of `--model m` is past PATH_MAX."""
    import os
    import subprocess
    import sys

    from epyc import bundle

    part = "d" * 240
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(17):  # made relative to each parent: no call ever sees the whole path
            os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkdir("m", dir_fd=fd)
    finally:
        os.close(fd)
    walk = " && ".join(["cd " + part] * 17)
    r = subprocess.run(
        [
            "bash",
            "-c",
            walk + ' && exec "$0" "$1" --model m --ram-gb 64',
            sys.executable,
            str(bundle.ROOT / "scripts" / "estimate_memory.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and "internal error" not in doc["error"] and doc["fix"], doc


def test_the_revision_checked_and_sized_is_the_one_served(inputs, live_tune, tmp_path):
    """F4: check_model and estimate_memory took --revision, the plan served main: another architecture, size
    or chat template than the one the human confirmed. It is served, shown, and cross-checked now."""
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=_at_revision("v2.0", "v2.0"))
    served = plan["argv"][plan["argv"].index("serve") + 1 :]
    assert served[0] == "Qwen/Qwen3-0.6B" and served[served.index("--revision") + 1] == "v2.0"
    assert plan["revision"] == "v2.0" and "Qwen/Qwen3-0.6B at revision v2.0" in plan["summary_markdown"]
    _, main = host_plan(tmp_path, inputs, live_tune, edit=_at_revision(None, None))
    assert "--revision" not in main["argv"] and main["revision"] is None
    from epyc.errors import ScriptError

    with pytest.raises(ScriptError) as err:
        host_plan(tmp_path, inputs, live_tune, edit=_at_revision("v2.0", None))
    assert "check_model.py checked revision v2.0, estimate_memory.py sized main" in err.value.error


def test_a_local_folder_is_served_without_a_revision(inputs, live_tune, tmp_path):
    def edit(docs):
        docs["check_model"]["revision"] = docs["estimate_memory"]["revision"] = "v2.0"

    _, plan = host_plan(tmp_path, inputs, live_tune, edit=edit)
    assert plan["model_dir"] and "--revision" not in plan["argv"] and plan["revision"] is None


def test_a_revision_with_a_local_folder_is_refused_not_dropped(script, tmp_path):
    """A note of the twenty-third and twenty-eighth audits: check_model and estimate_memory recorded the
    revision of a local folder, and plan served the folder without it (a folder has no revisions)."""
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(
            name, "--model", str(folder), "--revision", "v2.0", *(["--ram-gb", "64"] if "estimate" in name else [])
        )
        assert r.code == 1 and "is a local folder: its files are what is served" in r.doc["error"], (name, r.doc)
        assert "drop --revision" in r.doc["fix"]
        assert script(name, "--model", str(folder), *(["--ram-gb", "64"] if "estimate" in name else [])).code == 0
        # `main` means no revision: SKILL.md passes --revision "$REV" (default main) whatever MODEL is
        assert (
            script(
                name, "--model", str(folder), "--revision", "main", *(["--ram-gb", "64"] if "estimate" in name else [])
            ).code
            == 0
        )


def test_a_revision_git_would_refuse_is_refused(script, tmp_path):
    """A note of the twenty-first audit: `x.lock` passed as a revision."""
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for rev in ("x.lock", "a/.hidden", "a//b", "release.lock/1"):
        r = script("check_model.py", "--model", str(folder), "--revision", rev)
        assert r.code == 1 and "argument --revision" in r.doc["error"], (rev, r.doc)
        assert "not a branch, tag or commit" in r.doc["error"]


@pytest.mark.parametrize("rev", ["../../../etc/x", "-x", "--trust-remote-code", "a b", "main\n", "x.lock", 7])
def test_a_revision_from_a_document_is_checked_before_it_becomes_an_argument(inputs, live_tune, tmp_path, rev):
    """F1: only the --revision flag was checked: a check_model.json (and estimate) carrying '--entrypoint'
    or '../x' put it into the served command as given."""
    from epyc.errors import ScriptError

    with pytest.raises(ScriptError) as err:
        host_plan(tmp_path, inputs, live_tune, edit=_at_revision(rev, rev))
    assert "is not a branch, tag or commit" in err.value.error or "wrong type" in err.value.error, err.value.error


def test_a_local_folder_is_never_timed_as_a_hub_request(script, tmp_path):
    """--hub-timeout bounded the reading of a local folder too: at 0.0001 s a folder on this disk was "the Hub
    did not answer". Only a Hub id is timed; a folder is read however long it takes."""
    from model_fixtures import model_folder

    folder = str(model_folder("Qwen3-0.6B", tmp_path))  # config, tokenizer, a header-only checkpoint
    r = script("check_model.py", "--model", folder, "--vllm-version", "0.32.0", "--hub-timeout", "0.0001")
    assert r.code == 0 and r.doc["kind"] == "text" and "unreadable_reason" not in r.doc, r.doc
    e = script("estimate_memory.py", "--model", folder, "--ram-gb", "64", "--hub-timeout", "0.0001")
    assert e.code == 0 and e.doc["weight_source"] == "safetensors_headers", e.doc


def test_a_local_folder_is_served_by_its_absolute_path(inputs, tmp_path):
    """A relative folder (even one named like an option) means the same command from any directory."""
    docs = load_docs(inputs)
    docs["validate"].update(
        path="host", runtime="host", image=None, python=sys.executable, ld_preload={"value": None, "note": None}
    )
    real = os.path.realpath(inputs["model"])
    plan = plan_from(docs, {}, facts_for(docs, model_dir=real))
    assert plan["argv"][plan["argv"].index("serve") + 1] == real


def test_a_revision_with_a_final_newline_is_refused(script, tmp_path):
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(name, "--model", str(m), "--revision", "main\n", *(["--ram-gb", "64"] if "estimate" in name else []))
        assert r.code == 1 and "revision" in r.doc["error"], (name, r.doc)


@pytest.mark.parametrize(
    "value,status",
    [
        (5, "unknown"),
        ({"a": 1}, "unknown"),
        ("\x00\x01binary", "unknown"),
        ("{{ messages }}", "present"),
        ("", "absent"),
        (None, "absent"),
    ],
)
def test_a_chat_template_of_another_type_is_unknown_not_absent(value, status):
    assert classify_template(None, {"chat_template": value}, None)["status"] == status
    jinja = classify_template("bad \ufffd bytes", None, None)
    assert (jinja["status"], jinja["source"]) == ("unknown", "chat_template.jinja")


@pytest.mark.parametrize(
    "line",
    [
        '@@REGISTRY@@{"vllm_version": "0.32.0"}',
        '@@REGISTRY@@{"vllm_version": "0.32.0", "dicts": [1]}',
        '@@REGISTRY@@{"vllm_version": 5, "dicts": {}}',
    ],
)
def test_a_registry_probe_of_the_wrong_shape_is_a_clear_error(script, tmp_path, line):
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    r = script("check_model.py", "--model", str(m), "--python", _interpreter(tmp_path, line))
    assert r.code == 1 and "probe output" in r.doc["error"], r.doc


def test_a_model_kind_that_never_launches_is_not_planned(inputs):
    docs = load_docs(inputs)
    docs["check_model"].update(kind="pooling", launchable=True)
    with pytest.raises(ScriptError, match="'pooling' model launchable"):
        plan_from_4(docs)


def test_a_template_file_that_cannot_be_read_is_an_error_not_absent(script, tmp_path):
    """A FIFO under tokenizer_config.json used to be skipped, and the template read as "absent"."""
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    (m / "tokenizer_config.json").unlink(missing_ok=True)
    os.mkfifo(m / "tokenizer_config.json")
    r = script("check_model.py", "--model", str(m), timeout=60)
    assert r.code == 1 and "tokenizer_config.json" in r.doc["error"] and "not a regular file" in r.doc["error"]


@pytest.mark.parametrize("line", ["@@REGISTRY@@x\xff", "@@STACK@@\xfe"])
def test_a_probe_answering_in_bytes_that_are_not_utf8_is_a_clear_error(script, tmp_path, line):
    exe = tmp_path / "py" / "python"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nprintf '{line}\\n'\n")
    exe.chmod(0o755)
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    r = script("check_model.py", "--model", str(m), "--python", str(exe))
    assert r.code == 1 and "probe" in r.doc["error"], r.doc


def test_an_architecture_name_of_100k_characters_is_refused_in_a_short_error(script, tmp_path):
    m = config_only_model(tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "architectures": ["X" * 100_000]}))
    r = script("check_model.py", "--model", str(m), "--vllm-version", "0.32.0")
    assert r.code == 1 and "architectures/0" in r.doc["error"] and len(r.stdout) < 2000


def test_a_chat_template_list_with_non_string_names_is_read_not_crashed(script, tmp_path):
    folder = model_folder("Qwen3-0.6B", tmp_path)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tc = (
        json.loads((folder / "tokenizer_config.json").read_text())
        if (folder / "tokenizer_config.json").exists()
        else {}
    )
    tc["chat_template"] = [{"name": 1, "template": None}, "x"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    r = script("check_model.py", "--model", str(folder), "--vllm-version", "0.32.0")
    # transformers reads the list as {name: template}: one it cannot read is no template we can vouch for
    assert r.code == 0 and r.doc["chat_template"]["status"] == "unknown", r.doc


def test_check_model_refuses_a_python_it_cannot_probe(script):
    r = script("check_model.py", "--model", str(FIXTURES / "Qwen3-0.6B"), "--python", "/bin/false")
    assert r.code == 1 and "could not be probed" in r.doc["error"]


def test_a_folder_of_configs_given_as_config_is_judged_with_the_chat_template_beside_it(script, tmp_path):
    """No weights, the Hub unreachable: --config reads the tokenizer and chat-template files that stand beside
    config.json (the endpoint is known), never the weights' index (the config's shapes count those)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:1"}
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / "Qwen3-0.6B" / "config.json").read_text())
    tok = json.loads((FIXTURES / "Qwen3-0.6B" / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in tok.items() if k != "chat_template"}))
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(folder / "config.json"), env=env)
    # a tokenizer_config.json without a template: the .jinja may not have been copied -> unknown, not absent
    assert r.code == 0 and r.doc["chat_template"]["status"] == "unknown" and r.doc["primary_endpoint"] == "unknown"
    (folder / "chat_template.jinja").write_text(tok["chat_template"])
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(folder / "config.json"), env=env)
    assert r.code == 0 and r.doc["source"] == "config" and r.doc["primary_endpoint"] == "chat_completions"
    assert r.doc["chat_template"] == {
        "status": "present",
        "source": "chat_template.jinja",
        "selected_name": None,
        "names": [],
    }
    assert r.doc["gated"] == "unknown" and "export HF_TOKEN=" in r.doc["warnings"][0]["fix"]
    # a multimodal model is launchable only with its template: the processor's chat_template.json beside it
    vl = FIXTURES / "Qwen2.5-VL-7B-Instruct" / "config.json"
    r = script(
        "check_model.py",
        "--model",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "--config",
        str(vl),
        "--vllm-version",
        "0.32.0",
        env=env,
    )
    assert r.code == 0 and r.doc["kind"] == "multimodal" and r.doc["chat_template"]["source"] == "chat_template.json"
    assert r.doc["primary_endpoint"] == "chat_completions" and r.doc["launchable"]


def test_a_broken_tokenizer_file_beside_config_is_an_error_naming_it(script, tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / "Qwen3-0.6B" / "config.json").read_text())
    (folder / "tokenizer_config.json").write_text('{"chat_template": ')  # a copy cut short
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(folder / "config.json"))
    assert r.code == 1 and "tokenizer_config.json" in r.doc["error"] and "tokenizer_config.json" in r.doc["fix"]


def test_an_architecture_another_stack_lists_is_refused_with_its_setup_line(script, tmp_path):
    """vLLM 0.25.1 (the seed's image) does not list ExaoneMoeForCausalLM, 0.32 does: the refusal's fix names that
    stack and the one command that sets it up; a pooling model 0.32 lists gets no such offer."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["ExaoneMoeForCausalLM"], "model_type": "exaone_moe"}))
    r = check(script, "LGAI-EXAONE/some-moe", "--config", str(cfg), "--vllm-version", "0.25.1")
    assert r.code == 1 and r.doc["kind"] == "unsupported", r.doc
    image = bundle.load_epyc()["stacks"]["local_image"]["image"]
    assert r.doc["fix"] == (
        "vLLM 0.32.0 has it (the measured stack, as an image built on this host): python3 scripts/setup_host_stack.py"
        f" --image, then python3 scripts/validate.py --image {image}, then this"
    )
    bert = check(script, FIXTURES / "bert-base-uncased", "--vllm-version", "0.25.1")
    assert bert.code == 1 and "setup_host_stack" not in bert.doc["fix"]
