"""`python -m polyllama` / `polyllama`: info, devices, run, chat, serve, bench, model, rpc-server.

`run` and `chat` take llama.cpp's own flag spellings (-m -p -n -c -t --temp --top-k
--top-p --seed -ngl --device --list-devices -sm -ts -mg) and default to the embedded
SmolLM2 model when -m is absent.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys


def _progress_bar(stream=sys.stderr):
    """A loading progress callback drawing a one-line bar (llama.cpp's progress callback)."""
    state = {"last": -1}

    def cb(fraction: float) -> bool:
        pct = int(fraction * 100)
        if pct != state["last"]:
            state["last"] = pct
            filled = pct // 4
            stream.write(f"\rloading model [{'#' * filled}{'.' * (25 - filled)}] {pct:3d}%")
            if pct >= 100:
                stream.write("\n")
            stream.flush()
        return True

    return cb


# ---- argparse types: llama.cpp's spellings (common/arg.cpp of the pinned tree) ----------
def _ngl_type(text: str):
    """-ngl as llama.cpp's common/arg.cpp reads it (common.h: -1 is auto, <= -2 is all).

    Returns what LLM(n_gpu_layers=) takes: "auto", -1 (every layer) or N >= 0.
    """
    t = text.strip().lower()
    if t == "auto":
        return "auto"
    if t == "all":
        return -1
    try:
        n = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto', 'all' or a number of layers, not {text!r}") from None
    if n == -1:
        return "auto"
    return -1 if n < -1 else n


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {v}")
    return v


def _tensor_split_type(text: str) -> list[float]:
    """-ts as llama.cpp splits it: proportions separated by ',' or '/'."""
    parts = [x.strip() for x in re.split(r"[,/]+", text.strip()) if x.strip()]
    try:
        values = [float(x) for x in parts]
    except ValueError:
        values = None
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected proportions per device separated by ',' or '/', e.g. 3,1, not {text!r}")
    if any(not math.isfinite(v) or v < 0 for v in values) or not any(v > 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"proportions must be finite numbers >= 0, at least one > 0, not {text!r}")
    return values


def _device_type(text: str):
    """-dev: 'none' (llama.cpp: no offload), or comma-separated index / backend:N / ggml name."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("no devices specified")
    if any(not x for x in items):
        raise argparse.ArgumentTypeError(f"empty entry in the device list {text!r}")
    if len(items) == 1 and items[0].lower() == "none":
        return "none"
    if any(x.lower() == "none" for x in items):
        raise argparse.ArgumentTypeError("'none' (no offload) cannot be combined with devices")
    parsed = [int(x) if x.isdigit() else x for x in items]
    return parsed[0] if len(parsed) == 1 else parsed


NGL_HELP = ("layers to offload, read as llama.cpp reads -ngl: 'auto' or -1 (default): as many as fit "
            "in free device memory; 'all' or any N <= -2: every layer (n_gpu_layers=-1 in the "
            "Python API); N >= 0: that many layers (0: none)")


def _add_placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default=None, help="auto, cpu, cuda, hip, sycl, metal, vulkan, opencl, rpc")
    p.add_argument("-dev", "--device", type=_device_type, default=None,
                   help="device(s), comma-separated: index, backend:N or ggml name (e.g. CUDA0); "
                        "'none': no offload, run on the CPU (as --backend cpu)")
    p.add_argument("--list-devices", action="store_true", help="list devices and exit")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=_ngl_type, default="auto",
                   metavar="auto|all|N", help=NGL_HELP)
    p.add_argument("-sm", "--split-mode", choices=("none", "layer", "row", "tensor"), default=None)
    p.add_argument("-ts", "--tensor-split", type=_tensor_split_type, default=None,
                   help="proportions per device, separated by ',' or '/', e.g. 3,1")
    p.add_argument("-mg", "--main-gpu", type=int, default=None, help="main device (index into --device)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (0: the model's)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--no-fallback", action="store_true", help="fail instead of trying the next backend")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (-1: until done)")
    p.add_argument("--temp", type=float, default=0.8,
                   help="temperature: 0.8 as in llama.cpp's CLI (the Python API defaults to 0, greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--grammar", default=None, help="GBNF grammar text")
    p.add_argument("-j", "--json-schema", default=None, help="JSON schema constraining the output")


class _ArgumentError(Exception):
    """A command-line value the library's argument checks rejected: exit status 2."""


# library parameter names (as its ValueError/TypeError messages start) -> the CLI flag
_FLAGS = {"max_tokens": "-n/--n-predict", "temperature": "--temp", "top_k": "--top-k",
          "top_p": "--top-p", "min_p": "--min-p", "repeat_penalty": "--repeat-penalty",
          "seed": "-s/--seed", "stop strings": "-r/--reverse-prompt", "n_ctx": "-c/--ctx-size",
          "n_threads": "-t/--threads", "tensor_split": "-ts/--tensor-split",
          "json_schema": "-j/--json-schema", "grammar": "--grammar"}


@contextlib.contextmanager
def _checked_arguments():
    """Turn the ValueError/TypeError of the library's argument validation into _ArgumentError.

    Only wraps the calls that take command-line values (SamplingParams(...), LLM(...));
    polyllama's own errors (some are ValueErrors too) go on to main's PolyllamaError handler.
    """
    from .errors import PolyllamaError
    try:
        yield
    except PolyllamaError:
        raise
    except (ValueError, TypeError) as e:
        msg = str(e)
        flag = next((f for name, f in _FLAGS.items() if msg.startswith(name + " ")), None)
        raise _ArgumentError(f"argument {flag}: {msg}" if flag else msg) from e


def _load(args, progress=None, **extra):
    """The LLM the placement flags ask for. progress: a loading callback (default: the bar
    on a terminal); extra: more LLM arguments (serve's n_seq_max, chat_template)."""
    from .info import set_log_level
    from .llm import LLM
    if args.verbose:
        set_log_level("info")
    backend, dev, ngl = args.backend, args.device, args.n_gpu_layers
    if dev == "none":   # llama.cpp: offload nothing; here: the CPU backend, -ngl ignored as there
        if (backend or "auto").lower() not in ("auto", "cpu"):
            raise _ArgumentError(f"--device none (no offload) conflicts with --backend {backend}")
        if ngl not in ("auto", 0):
            print("polyllama: note: --device none offloads nothing; -ngl is ignored", file=sys.stderr)
        backend, dev, ngl = "cpu", None, "auto"
    main = None
    if args.main_gpu is not None:
        devs = dev if isinstance(dev, list) else ([dev] if dev is not None else None)
        if devs and not 0 <= args.main_gpu < len(devs):
            raise _ArgumentError(f"argument -mg/--main-gpu: {args.main_gpu} is not an index into "
                                 f"the --device list ({len(devs)} device(s))")
        main = devs[args.main_gpu] if devs else args.main_gpu
    with _checked_arguments():
        return LLM(args.model, backend=backend, device=dev, n_gpu_layers=ngl,
                   split_mode=args.split_mode, tensor_split=args.tensor_split, main_device=main,
                   fallback=not args.no_fallback, n_ctx=args.ctx_size, n_threads=args.threads,
                   progress=progress or (_progress_bar() if sys.stderr.isatty() or args.verbose else None),
                   **extra)


def _sampling(args):
    from .sampling import SamplingParams
    with _checked_arguments():
        return SamplingParams(max_tokens=None if args.n_predict < 0 else args.n_predict,
                              temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed,
                              stop=tuple(args.reverse_prompt), grammar=args.grammar,
                              json_schema=args.json_schema)


def cmd_info(args) -> int:
    from .discovery import backend_summary
    from .info import build_info
    info = build_info()
    if args.json:
        from .discovery import devices
        info["devices"] = [d.__dict__ for d in devices()]
        print(json.dumps(info, indent=2))
        return 0
    print(f"polyllama build: llama.cpp {info['llama_cpp_commit']} (pin llama-cpp-python "
          f"{info['pin_sdist_version']}), ggml {info['ggml_version_runtime']}, "
          f"{info['compiler']}, {info['build_type']}")
    print(f"compiled backends: {', '.join(info['backends'])}")
    print(f"CPU weight layouts: {', '.join(info['cpu_weight_buffers']) or 'plain only'}; "
          f"AMX: {info.get('cpu_amx', 'not recorded')}")
    if info.get("portable"):
        print(f"portable build (a wheel): ggml-cpu for {'/'.join(info.get('cpu_isa') or ['baseline'])}"
              + (f", CUDA for {info['flags'].get('CMAKE_CUDA_ARCHITECTURES')}" if "cuda" in info["backends"] else ""))
    else:
        print("local build: ggml-cpu for this machine's CPU (GGML_NATIVE)")
    if info.get("cuda_version"):
        how = ("NVIDIA's runtime wheels or the toolkit, loaded at run time" if info.get("cuda_runtime") == "shared"
               else "linked into the extension")
        print(f"CUDA {info['cuda_version']}: cudart and cuBLAS {how}")
    print()
    print(backend_summary())
    return 0


def cmd_devices(args) -> int:
    from .discovery import backend_summary
    print(backend_summary())
    return 0


def cmd_run(args) -> int:
    if args.list_devices:
        return cmd_devices(args)
    params = _sampling(args)   # before loading: a bad -n/--temp fails at once
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None:
            raise _ArgumentError("no prompt: stdin is closed; give -p TEXT or pipe the prompt in")
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError as e:
            raise _ArgumentError(f"the prompt on stdin is not valid text: {e}") from None
    if not prompt:
        raise _ArgumentError("the prompt is empty: give -p TEXT or pipe it on stdin")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        raise _ArgumentError(f"the prompt is not valid UTF-8 (a byte that cannot be decoded at index "
                             f"{e.start})") from None
    llm = _load(args)
    print(f"[{llm.placement}]", file=sys.stderr)
    sys.stdout.write(prompt)
    req = llm.engine.submit(prompt, params)
    for piece in req.text_stream():
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    r = req.result()
    print(f"[{r.prompt_tokens} prompt tokens at {r.prompt_tokens_per_second:.1f} t/s, "
          f"{r.generated_tokens} generated at {r.generation_tokens_per_second:.1f} t/s, "
          f"finish: {r.finish_reason}]", file=sys.stderr)
    llm.close()
    return 0


def cmd_chat(args) -> int:
    if args.list_devices:
        return cmd_devices(args)
    params = _sampling(args)
    llm = _load(args)
    print(f"[{llm.placement}] type /exit or Ctrl-D to quit", file=sys.stderr)
    history = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            break
        except RuntimeError:      # input() without a stdin at all (closed)
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if not line.strip():
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as e:
            print(f"polyllama: error: that line is not valid UTF-8 (a byte that cannot be decoded at "
                  f"index {e.start}); it was skipped", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        reply = []
        try:
            for piece in llm.chat(history, params, stream=True):
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [interrupted]")
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
    llm.close()
    return 0


def cmd_model(args) -> int:
    from .default_model import fetch_default_model
    print(fetch_default_model())
    return 0


def cmd_rpc_server(args) -> int:
    """Serve one local device over ggml RPC until Ctrl-C / SIGTERM."""
    import os
    import threading
    from . import rpc
    from .discovery import devices
    from .errors import DeviceNotFoundError, PolyllamaError
    from ._llamacpp_loader import llamacpp
    host = args.host if args.host is not None else "127.0.0.1"
    # the protocol has no authentication: say so every time, louder when it is not loopback
    print("polyllama rpc-server: WARNING: the ggml RPC protocol has no authentication and no "
          "encryption; anyone who can reach this port can use the device. Never expose it to "
          "an untrusted network.", file=sys.stderr, flush=True)
    if not rpc.is_loopback(host):
        if args.host is None:   # unreachable today; kept so a future default cannot widen it
            raise PolyllamaError("refusing a non-loopback bind without an explicit --host")
        print(f"polyllama rpc-server: WARNING: listening on {host}, reachable from the network",
              file=sys.stderr, flush=True)
    devs = devices()
    chosen = None
    if args.device is not None:
        want = args.device
        for d in devs:
            if want in (str(d.index), d.name, d.spec) or want.lower() == d.name.lower():
                chosen = d
        if chosen is None:
            raise DeviceNotFoundError(f"no device {want!r}; devices: {', '.join(d.spec + ' ' + d.name for d in devs)}")
    else:
        backend = (args.backend or "cpu").lower()
        chosen = next((d for d in devs if d.backend == backend), None)
        if chosen is None:
            raise DeviceNotFoundError(f"no {backend} device in this build/machine; devices: "
                                      f"{', '.join(d.spec for d in devs)}")
    if chosen.backend == "rpc":
        raise PolyllamaError("an rpc-server cannot serve a remote (rpc) device")
    # ggml prints "Failed to create server socket" and returns when the port is taken;
    # binding once here first turns that into a clear error
    import socket
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, args.port))
    except OSError as e:
        raise PolyllamaError(f"cannot listen on {host}:{args.port}: {e.strerror or e}") from None
    endpoint = f"{host}:{args.port}"
    threads = args.threads or os.cpu_count() or 1
    # ggml_backend_rpc_start_server never returns while it serves, and a thread blocked in
    # C cannot be interrupted: it runs in a daemon thread while the main thread waits for
    # signals, and Ctrl-C/SIGTERM end the process (the OS closes the sockets).
    failed = []

    def serve():
        try:
            llamacpp.rpc_start_server(endpoint, [chosen.index], args.cache, threads)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failed.append(e)

    import signal
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t = threading.Thread(target=serve, name="rpc-server", daemon=True)
    print(f"polyllama rpc-server: serving {chosen.spec} ({chosen.name}, {chosen.description}) "
          f"on {endpoint}, {threads} threads; Ctrl-C stops", file=sys.stderr, flush=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.5)
    except KeyboardInterrupt:
        print("polyllama rpc-server: stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)   # skip interpreter teardown: the serving thread is still inside ggml
    if failed:
        raise failed[0]
    raise PolyllamaError(f"the RPC server on {endpoint} stopped (see the messages above)")


def cmd_serve(args) -> int:
    """An OpenAI-compatible server on 127.0.0.1 (docs/SERVER.md) until SIGINT/SIGTERM."""
    import logging
    import os
    import signal
    import socket
    if args.list_devices:
        return cmd_devices(args)
    from .errors import PolyllamaError
    try:
        from .server import create_app
        import uvicorn
    except ImportError as e:   # ServerExtraMissing says what to install
        raise PolyllamaError(str(e)) from None
    api_key = args.api_key if args.api_key is not None else os.environ.get("POLYLLAMA_API_KEY") or None
    template = None
    if args.chat_template_file:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except OSError as e:
            raise _ArgumentError(f"argument --chat-template-file: {e.strerror or e}: {args.chat_template_file}") from None
    from .default_model import default_model_path
    model_path = args.model or str(default_model_path())
    if not os.path.isfile(model_path):
        raise PolyllamaError(f"model file not found: {model_path}")
    host = args.host
    # bind before loading: a port in use fails at once, and the URL printed is the real one
    try:
        infos = socket.getaddrinfo(host, args.port, type=socket.SOCK_STREAM)
        family = infos[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError as e:
        raise PolyllamaError(f"cannot listen on {host}:{args.port}: {e.strerror or e}") from None
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    say = logging.getLogger("polyllama.server").info
    if host not in ("127.0.0.1", "localhost", "::1"):
        say("polyllama serve: WARNING: listening on %s, reachable from the network%s; no TLS "
            "(put a TLS proxy in front, docs/SERVER.md)", host,
            "" if api_key else ", and no --api-key: anyone who reaches it can use it")
    say("polyllama serve: listening on %s (loading %s, %d slots)", url, model_path, args.parallel)
    failed: list[BaseException] = []
    server_box: list = []

    def loader(progress=None):
        return _load(args, progress=progress, n_seq_max=args.parallel, kv_unified=args.kv_unified,
                     chat_template=template)

    def on_ready(llm):
        say("polyllama serve: ready at %s/v1 : %s (model id %r)", url, llm.placement,
            app.state.server.model_id)

    def on_fatal(e):
        failed.append(e)
        if server_box:
            server_box[0].should_exit = True

    app = create_app(loader=loader, model_alias=args.model_alias, model_path=model_path, api_key=api_key,
                     queue=args.queue, on_ready=on_ready, on_fatal=on_fatal)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            say("polyllama serve: stopping (in-flight requests get %.0f s to finish)", args.shutdown_timeout)
            app.state.server.begin_shutdown()
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=args.shutdown_timeout, timeout_keep_alive=30,
                            loop="auto", http="auto")
    server = Server(config)
    server_box.append(server)
    # uvicorn re-raises the signal that stopped it once it is done; ours are no-ops, so a
    # graceful stop by SIGINT or SIGTERM ends with status 0
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
    if failed:
        e = failed[0]
        raise e if isinstance(e, (PolyllamaError, _ArgumentError)) else PolyllamaError(
            f"the model could not be loaded: {e}")
    say("polyllama serve: stopped")
    return 0


def cmd_bench(args) -> int:
    from .bench import compare
    from .default_model import default_model_path
    import os
    import subprocess
    from .errors import PolyllamaError
    model = args.model or str(default_model_path())
    try:
        figures, report = compare(model, backend=args.backend, threads=args.threads, n_prompt=args.n_prompt,
                                  n_gen=args.n_gen, reps=args.reps, ngl=args.n_gpu_layers, device=args.device,
                                  bin_dir=args.llama_bench_dir, rounds=args.rounds)
    except subprocess.CalledProcessError as e:
        err = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        last = err.strip().splitlines()[-1:] or [""]
        raise PolyllamaError(f"{os.path.basename(str(e.cmd[0]))} exited with status {e.returncode}"
                             + (f": {last[0]}" if last[0] else "")) from None
    print(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="polyllama", description="llama.cpp on the device you choose")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="build information and every device found")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("devices", help="backends and devices (✓/✗, memory, recommended backend)")
    p.set_defaults(func=cmd_devices)
    p = sub.add_parser("run", help="complete a prompt, streaming to the terminal")
    _add_placement_args(p)
    _add_sampling_args(p)
    p.add_argument("-p", "--prompt", default=None, help="prompt (default: read stdin)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("chat", help="interactive chat with history")
    _add_placement_args(p)
    _add_sampling_args(p)
    p.add_argument("-sys", "--system", default=None, help="system message")
    p.set_defaults(func=cmd_chat)
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (docs/SERVER.md)")
    _add_placement_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 is reachable from the network)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free port)")
    p.add_argument("-np", "--parallel", type=_positive_int, default=4,
                   help="requests decoded together (the engine's slots, n_seq_max; default 4)")
    p.add_argument("-kvu", "--kv-unified", action="store_true",
                   help="one KV cache shared by all slots (a request may use all of -c); default: "
                        "each slot has -c/--parallel cells of its own, as llama-server with -np, "
                        "which keeps a greedy answer the same whatever runs beside it")
    p.add_argument("--queue", type=_non_negative_int, default=64,
                   help="requests waiting for a slot at most; beyond: 429 (default 64)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $POLYLLAMA_API_KEY, else none)")
    p.add_argument("-a", "--alias", "--model-alias", dest="model_alias", default=None,
                   help="model id in the API (default: the file name without .gguf)")
    p.add_argument("--chat-template-file", default=None, help="Jinja chat template replacing the model's")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests get to finish after SIGINT/SIGTERM (default 10)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("bench", help="prompt and generation tokens/s beside llama-bench from the same tree")
    p.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="cpu", help="backend polyllama runs on (default cpu)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-p", "--n-prompt", type=_positive_int, default=512)
    p.add_argument("-n", "--n-gen", type=_positive_int, default=128)
    p.add_argument("-r", "--reps", type=_positive_int, default=5)
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="measure every runner this many times, in turn; report medians and ranges")
    p.add_argument("-ngl", "--n-gpu-layers", type=_ngl_type, default="auto", metavar="auto|all|N",
                   help=NGL_HELP + "; llama-bench gets 99 for 'auto'")
    p.add_argument("-dev", "--device", default=None, help="llama-bench's -dev value, e.g. CUDA0")
    p.add_argument("--llama-bench-dir", default=None,
                   help="folder holding llama-bench (default: build/cmake/bin of this checkout, then PATH)")
    p.add_argument("--json", default=None, help="also write the raw figures to this file")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("model", help="fetch the default model, print its path")
    p.set_defaults(func=cmd_model)
    p = sub.add_parser("rpc-server", help="serve one local device to other machines over ggml RPC "
                                          "(no authentication: trusted networks only)")
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1; "
                                                  "anything else is reachable from the network)")
    p.add_argument("-p", "--port", type=int, default=50052)
    p.add_argument("--backend", default=None, help="serve the first device of this backend (default cpu)")
    p.add_argument("-d", "--device", default=None, help="device to serve: index, backend:N or ggml name")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (CPU device)")
    p.add_argument("-c", "--cache", default=None, help="directory caching large tensors sent by clients")
    p.set_defaults(func=cmd_rpc_server)
    return ap


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: after a write to it failed, the interpreter's own flush at
    exit would fail again and print a traceback."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import PolyllamaError
    if sys.stdout is None and args.command in ("run", "chat", "info", "devices", "bench", "model"):
        print("polyllama: error: stdout is closed; the output has nowhere to go", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away (`| head`): the usual end of a pipeline, not an error to report
        _quiet_stdout()
        return 141
    except OSError as e:
        if e.filename is None and getattr(e, "errno", None) is not None and _is_output_error(e):
            _quiet_stdout()
            print(f"polyllama: error: cannot write the output: {e.strerror}", file=sys.stderr)
            return 1
        raise
    except PolyllamaError as e:
        print(f"polyllama: error: {e}", file=sys.stderr)
        return 1
    except _ArgumentError as e:
        # a value the library rejected: reported like argparse's own errors (status 2);
        # -v also shows where the library raised it. Other exceptions keep their traceback.
        if getattr(args, "verbose", False) and e.__cause__ is not None:
            import traceback
            traceback.print_exception(type(e.__cause__), e.__cause__, e.__cause__.__traceback__)
        print(f"polyllama: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _is_output_error(e: OSError) -> bool:
    """A failed write to stdout (a full disk, a closed or broken descriptor)."""
    import errno
    return e.errno in (errno.ENOSPC, errno.EPIPE, errno.EBADF, errno.EIO, errno.EDQUOT)


if __name__ == "__main__":
    sys.exit(main())
