#!/usr/bin/env python3
"""Does the model fit in RAM? Weights + KV cache + a reserve, without downloading weights.

    python3 scripts/estimate_memory.py --model Qwen/Qwen3-0.6B --ram-gb 24 --max-model-len 4096 --num-prompts 1

On CPU, RAM is the ceiling: weights and the KV cache both live there. Sizes are GiB (2^30 bytes), as vLLM reports them.
Exit 0: fits (or no --ram-gb verdict asked); exit 1: does not fit, or an error ({"error", "fix"}).
"""

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors
from epyc.decisions import estimate
from epyc.deployments import runs


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    runs.keep_before_parsing(argv, "estimate_memory")
    a = parser(epyc).parse_args(argv)
    a.avx512_bf16 = None if a.avx512_bf16 is None else a.avx512_bf16 == "yes"
    folder = runs.keep(a, "estimate_memory")
    # where no flag says otherwise: the model and revision check_model judged, detect's RAM and AVX-512 BF16
    if a.model is None:
        checked = runs.earlier(folder, "check_model") or {}
        a.model = checked.get("model") or epyc["default_model"]
        a.revision = a.revision if a.revision is not None else checked.get("revision")
    detected = (runs.earlier(folder, "detect") or {}) if a.ram_gb is None or a.avx512_bf16 is None else {}
    a.ram_gb = a.ram_gb if a.ram_gb is not None else detected.get("ram_gb")
    if a.avx512_bf16 is None and "avx512_bf16" in detected:  # the serving CPU's, not this one's
        a.avx512_bf16 = bool(detected["avx512_bf16"])
    req = estimate.Request(**{f.name: getattr(a, f.name) for f in dataclasses.fields(estimate.Request)})
    doc = estimate.estimate(req, epyc)
    return doc, errors.EXIT_FAIL if "error" in doc else errors.EXIT_OK


def parser(epyc: dict) -> cli.JsonArgumentParser:
    p = cli.JsonArgumentParser(prog="scripts/estimate_memory.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        "--model-id",
        dest="model",
        help=f"Hub id or local folder (default: the one the run's check_model.json checked, else {epyc['default_model']})",
    )
    p.add_argument(
        "--revision",
        type=argtypes.revision_arg,
        help="branch, tag or commit (Hub ids; default main): the one check_model.py checked, which plan serves",
    )
    p.add_argument(
        "--ram-gb",
        type=argtypes.float_in(0, 1 << 20, lo_open=True),
        help="RAM to fit in (default: ram_gb of the run's detect.json; without either, no verdict)",
    )
    p.add_argument("--max-model-len", type=argtypes.int_in(16, 1 << 24), default=epyc["serve"]["default_max_model_len"])
    p.add_argument(
        "--num-prompts", type=argtypes.int_in(1, 65536), default=1, help="concurrent sequences at full length"
    )
    p.add_argument("--weight-gb", type=argtypes.float_in(0, 65536, lo_open=True), help="override the weight size (GiB)")
    p.add_argument(
        "--os-reserve-gb",
        type=argtypes.float_in(0, 65536),
        default=epyc["memory"]["os_reserve_gb"],
        help="RAM kept for the OS and vLLM's own process (default %(default)s)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=argtypes.int_in(16, 1 << 24),
        default=epyc["serve"]["max_num_batched_tokens"],
        help="tokens one scheduler step may take; "
        "sliding-window layers keep that many beyond their window (default: vLLM's CPU server default, "
        "%(default)s; the plan pins it)",
    )
    p.add_argument("--dtype", choices=epyc["precision"]["supported"], default=epyc["precision"]["default"])
    p.add_argument(
        "--hub-timeout",
        type=argtypes.float_in(0, 3600, lo_open=True),
        default=60,
        help="overall deadline for Hub requests, seconds",
    )
    p.add_argument(
        "--avx512-bf16",
        choices=("yes", "no"),
        help="does the serving CPU have AVX-512 BF16 "
        "(avx512_bf16 from detect.py)? vLLM keeps a recurrent layer's SSM state in float32 there, in the "
        "serving dtype elsewhere (default: this machine's CPU)",
    )
    p.add_argument(
        "--config",
        type=argtypes.nonempty,
        help="a config.json to size from, offline (no Hub, no folder); weights from --weight-gb, else counted",
    )
    runs.add_run_arg(p)
    return p


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
