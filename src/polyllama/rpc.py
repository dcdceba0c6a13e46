"""ggml RPC: serve a local device to other machines, and use remote devices here.

The protocol has no authentication and no encryption: anyone who can reach the port can
allocate memory and run graphs on the served device. Bind to loopback or a private
network only (docs/MORE_THAN_ONE_MACHINE.md).

ggml's RPC client has no timeouts and calls GGML_ABORT when a connection fails. Two things
keep that from hanging or killing the Python process:
  * `probe()` performs the same HELLO handshake from Python, with a timeout, before the
    endpoint is handed to ggml (unreachable server, wrong protocol version);
  * every native call that can reach a server runs under the RPC guard
    (csrc/remote.h): a server lost mid-call raises RemoteDeviceError. The
    connection to that endpoint is then lost for the rest of the process (ggml-rpc keeps
    one connection per endpoint and never reconnects), and the model that used it leaks.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from typing import List, Tuple

from ._llamacpp_loader import llamacpp
from .errors import PolyllamaError, RemoteDeviceError

__all__ = ["DEFAULT_PORT", "DEFAULT_TIMEOUT", "parse_endpoint", "probe", "add_rpc_server",
           "lost_endpoints", "PROTO_MAJOR", "PROTO_MINOR"]

DEFAULT_PORT = 50052
# seconds a call that reaches remote devices (load, decode, free) may take before the server
# counts as lost; LLM(rpc_timeout=) overrides it. A server that dies is noticed at once
# (its socket closes); this bounds a server that hangs or a network that drops packets.
DEFAULT_TIMEOUT = 300.0
# RPC_PROTO_MAJOR_VERSION / RPC_PROTO_MINOR_VERSION of the ggml-rpc.h the extension was
# compiled with. ggml accepts a server with the same major and a minor not above its own.
PROTO_MAJOR = llamacpp.RPC_PROTO_MAJOR
PROTO_MINOR = llamacpp.RPC_PROTO_MINOR
_CMD_HELLO = 14          # ggml-rpc.cpp static_asserts this value stays 14 across versions
_CAPS_SIZE = 24          # RPC_CONN_CAPS_SIZE in ggml-rpc/transport.h
_HELLO_RSP_SIZE = 4 + _CAPS_SIZE


def parse_endpoint(endpoint: str) -> Tuple[str, int]:
    """'host:port' -> (host, port), raising ValueError with the expected form."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PolyllamaError(f"RPC endpoint {endpoint!r} is not of the form host:port "
                             f"(e.g. 127.0.0.1:{DEFAULT_PORT})")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the server")
        buf += chunk
    return buf


def probe(endpoint: str, timeout: float = 5.0) -> Tuple[int, int, int]:
    """Connect and do the HELLO handshake; return the server's (major, minor, patch).

    Raises RemoteDeviceError when the server cannot be reached within `timeout` seconds,
    does not answer like an rpc-server, or speaks an incompatible protocol version.
    The server serves one client at a time, so a server busy with another client
    answers only when that client disconnects: that shows up here as a timeout.
    """
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            # request: | cmd (1 byte) | size (u64, little-endian on every ggml host) | caps |
            # zero caps = plain TCP, no transport upgrade
            s.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS_SIZE) + bytes(_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(s, 8))
            if size != _HELLO_RSP_SIZE:
                raise RemoteDeviceError(
                    f"RPC server {endpoint} answered the handshake with {size} bytes instead of "
                    f"{_HELLO_RSP_SIZE}: not a compatible ggml rpc-server")
            major, minor, patch = _recv_exact(s, _HELLO_RSP_SIZE)[:3]
    except RemoteDeviceError:
        raise
    except socket.timeout:
        raise RemoteDeviceError(
            f"RPC server {endpoint} did not answer within {timeout:g} s (not an rpc-server, "
            f"or busy serving another client)") from None
    except OSError as e:
        raise RemoteDeviceError(f"cannot reach RPC server {endpoint}: {e.strerror or e}") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise RemoteDeviceError(
            f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this build speaks "
            f"{PROTO_MAJOR}.{PROTO_MINOR}.x: run the same polyllama/llama.cpp version on both ends")
    return major, minor, patch


def lost_endpoints() -> List[str]:
    """Endpoints whose connection this process lost (they cannot be used again here)."""
    return sorted(llamacpp.LOST_ENDPOINTS)


def add_rpc_server(endpoint: str, timeout: float = 5.0) -> List[str]:
    """Probe `endpoint`, then register its devices with ggml; return their ggml names.

    After this, `polyllama.devices()` lists them with backend "rpc" (description: the
    endpoint), and `LLM(..., backend="rpc")` or `device=` can place layers on them.
    Adding the same endpoint again returns the same devices.
    """
    host, port = parse_endpoint(endpoint)
    endpoint = f"{host}:{port}"
    if endpoint in llamacpp.LOST_ENDPOINTS:
        raise RemoteDeviceError(
            f"the connection to RPC server {endpoint} was lost earlier in this process, and "
            "ggml-rpc cannot reconnect to an endpoint it lost: restart the rpc-server and use "
            "it from a new process (or serve it on another port)")
    probe(endpoint, timeout)
    return llamacpp.rpc_add_server(endpoint)
