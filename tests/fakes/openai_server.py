#!/usr/bin/env python3
"""A real HTTP server that imitates vLLM's OpenAI endpoints and misbehaves on request.

Started by `launch.py start` (host path) in place of `vllm serve`, so verify's phases run against real
sockets and a real process: a fake venv's `bin/vllm` (tests/test_launch.py) runs this file with the
plan's own argv (`serve MODEL --served-model-name NAME --host H --port P ...`), and the mode comes from
$FAKE_SERVER_MODE. Or run it directly with --mode/--port/--model. Modes:
  good            healthy after --delay s, lists the model, answers chat and completions
  exit_early      exits before it is ever healthy
  never_healthy   /health answers 503 forever
  wrong_model     /v1/models lists another id
  models_reflect  /v1/models lists the caller's Authorization header as its model id (a hostile server)
  models_reflect_also  /v1/models lists the model and, beside it, the caller's Authorization header
  error_payload   the request answers HTTP 200 with an error object
  empty_choices   the request answers HTTP 200 with no choices
  die_on_request  the process exits on the first request, without answering
  die_after_answer  answers the first request, then exits
  no_chat_template  chat answers 400 as vLLM does for a model without a chat template; completions work
  trickle_health  /health promises 1000 bytes and sends one every 2 s (each read is quick, the whole is not)
  huge_int_usage  the completion's usage.completion_tokens is a 5000-digit integer
  many_models     /v1/models lists the model among 40,000 others
  redirect_health  /health redirects (302) to a path that answers 200: a client following it is fooled
  slow_term       as never_healthy, and takes 3 s to exit on SIGTERM (a stop that is still waiting)
  fork_on_term    on SIGTERM forks a `sleep 300` into its group, then exits (a worker respawned on the way down)
  renamed_worker  as good, with a `sleep 300` in its group whose environ is empty (vLLM's setproctitle'd worker)
  (any mode)      SIGUSR1 marks the engine dead: /health answers 503 from then on, the process lives on
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--mode", default=os.environ.get("FAKE_SERVER_MODE", "good"))
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--model", "--served-model-name", dest="model", default="fake-model")
ap.add_argument("--delay", type=float, default=float(os.environ.get("FAKE_SERVER_DELAY", "1.0")))
argv = sys.argv[1:]
if argv[:1] == ["serve"]:  # vLLM's own command line: serve MODEL [options]; options we do not model are ignored
    argv = argv[2:]
a, _ignored = ap.parse_known_args(argv)
t0 = time.monotonic()
print(
    f"fake server: mode={a.mode} port={a.port} VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND')} "
    f"api_key_set={bool(os.environ.get('VLLM_API_KEY'))}",
    flush=True,
)
engine_dead = threading.Event()  # any mode: SIGUSR1 kills the "engine", the API process lives on as vLLM's does
signal.signal(signal.SIGUSR1, lambda signum, frame: engine_dead.set())
if a.mode == "slow_term":

    def _slow_exit(signum, frame):
        time.sleep(3)
        os._exit(0)

    signal.signal(signal.SIGTERM, _slow_exit)
if a.mode == "fork_on_term":
    import subprocess

    def _fork_and_exit(signum, frame):
        subprocess.Popen(["sleep", "300"])  # same group and environment (the run's marker) as the server
        os._exit(0)

    signal.signal(signal.SIGTERM, _fork_and_exit)
if a.mode == "renamed_worker":
    import subprocess

    subprocess.Popen(["sleep", "300"], env={})  # same group; no marker to be read, as a renamed worker
if a.mode == "exit_early":
    time.sleep(0.5)
    print("fatal: engine core failed to start", flush=True)
    sys.exit(3)


class H(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        print("request:", fmt % args, flush=True)

    def send(self, status, doc):
        sys.set_int_max_str_digits(0)  # huge_int_usage: Python's writer refuses 5000 digits by default
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        key = os.environ.get("VLLM_API_KEY")
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        if self.path == "/health" and a.mode == "slow_term":
            self.send(503, {"error": "loading"})
            return
        if self.path == "/health" and a.mode == "trickle_health":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(2)
            return
        if self.path == "/health" and a.mode == "redirect_health":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/elsewhere":
            return self.send(200, {})
        if self.path == "/health":
            ready = a.mode != "never_healthy" and time.monotonic() - t0 >= a.delay and not engine_dead.is_set()
            return self.send(200 if ready else 503, {})
        if not self.authorized():
            return
        if self.path == "/v1/models":
            name = "someone-else" if a.mode == "wrong_model" else a.model
            if a.mode == "models_reflect":  # a hostile server: lists the caller's Authorization header as a model
                name = self.headers.get("Authorization", "")
            if a.mode == "models_reflect_also":  # ... beside the right model: verify passes, and must not print it
                return self.send(
                    200, {"object": "list", "data": [{"id": a.model}, {"id": self.headers.get("Authorization", "")}]}
                )
            if a.mode == "many_models":
                return self.send(
                    200,
                    {
                        "object": "list",
                        "data": [{"id": f"other-{i}"} for i in range(20_000)]
                        + [{"id": a.model}]
                        + [{"id": f"more-{i}"} for i in range(20_000)],
                    },
                )
            return self.send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
        self.send(404, {"error": "not found"})

    def do_POST(self):
        if not self.authorized():
            return
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if a.mode == "die_on_request":
            print("fatal: engine died on the first request", flush=True)
            os._exit(1)
        if a.mode == "error_payload":
            return self.send(200, {"object": "error", "message": "EngineCore encountered an issue", "code": 500})
        if a.mode == "empty_choices":
            return self.send(200, {"id": "x", "choices": [], "usage": {"completion_tokens": 0}})
        if a.mode == "no_chat_template" and self.path == "/v1/chat/completions":
            return self.send(
                400,
                {
                    "object": "error",
                    "type": "BadRequestError",
                    "code": 400,
                    "message": "As of transformers v4.44, default chat template is no longer allowed, so you "
                    "must provide a chat template if the tokenizer does not define one.",
                },
            )
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        if a.mode == "huge_int_usage":
            usage["completion_tokens"] = int("9" * 5000)
        if self.path == "/v1/chat/completions":
            doc = {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"}}],
            }
        else:
            doc = {"object": "text_completion", "choices": [{"index": 0, "text": " hello there"}]}
        self.send(200, {**doc, "usage": usage})
        if a.mode == "die_after_answer":
            threading.Timer(0.2, lambda: os._exit(1)).start()


ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()
