"""An MCP server over stdio written against the wire alone (no SDK), to misbehave on purpose.

Run by the sandbox's /usr/bin/python3. ``hang`` never answers its handshake.
"""

import json
import os
import socket
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"
lock = threading.Lock()
cancelled: list = []
counted: list = []
extra_tools: list = []


def send(message: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def tool(name: str, schema: dict | None = None, description: str = "") -> dict:
    return {"name": name, "description": description or f"the {name} tool",
            "inputSchema": schema if schema is not None else {"type": "object", "properties": {}}}


TOOLS = [
    tool(
        "echo",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        "Say the text back",
    ),
    tool("die"),
    tool("fail"),
    tool("slow"),
    tool("cancelled"),
    tool("grow"),
    tool("peek"),
    tool("huge", {"type": "object", "properties": {"mb": {"type": "number"}}}),
    tool("a.b"),
    tool("a_b"),
    tool("bad_schema", {"type": "object", "properties": {"a": {"type": "banana"}}}),
    tool("not_an_object", {"type": "string"}),
    tool("image"),
    tool("noop"),
    tool("count"),
    tool("touch"),
]


def text(value: str, *, error: bool = False) -> dict:
    return {"content": [{"type": "text", "text": value}], "isError": error}


def peek() -> str:
    seen = []
    for path in ("/etc/shadow", "/root", "/home", os.path.expanduser("~")):
        try:
            if os.path.isdir(path):
                seen.append(f"{path}: {sorted(os.listdir(path))[:3]}")
            else:
                with open(path) as file:
                    seen.append(f"{path}: read {len(file.read(10))}")
        except OSError as exc:
            seen.append(f"{path}: refused {exc.errno}")
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
        seen.append("network: connected")
    except OSError as exc:
        seen.append(f"network: refused {exc.errno}")
    seen.append(f"uid: {os.getuid()}")
    return "\n".join(seen)


def call(request_id, name: str, args: dict) -> None:
    if name == "echo":
        send({"jsonrpc": "2.0", "id": request_id, "result": text(f"echo: {args['text']}")})
    elif name == "die":
        os._exit(3)
    elif name == "fail":
        send({"jsonrpc": "2.0", "id": request_id, "result": text("the disk is on fire", error=True)})
    elif name == "huge":
        send({"jsonrpc": "2.0", "id": request_id, "result": text("x" * int(args.get("mb", 1) * 1024 * 1024))})
    elif name == "slow":
        token = (args.get("_meta") or {}).get("progressToken")
        for step in range(300):
            if request_id in cancelled:
                return  # a cancelled request gets no answer
            if step == 1:
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": 1, "total": 300, "message": "working"}})
            time.sleep(0.1)
        send({"jsonrpc": "2.0", "id": request_id, "result": text("slow done")})
    elif name == "touch":
        try:
            with open("/workspace/mcp-touched.txt", "w") as file:
                file.write("touched")
            said = "wrote"
        except OSError as exc:
            said = f"refused {exc.errno}"
        send({"jsonrpc": "2.0", "id": request_id, "result": text(f"{said} in {os.getcwd()}")})
    elif name == "count":
        counted.append(1)
        send({"jsonrpc": "2.0", "id": request_id, "result": text(str(len(counted)))})
    elif name == "cancelled":
        send({"jsonrpc": "2.0", "id": request_id, "result": text(json.dumps(cancelled))})
    elif name == "grow":
        extra_tools.append(tool(f"grown_{len(extra_tools)}"))
        send({"jsonrpc": "2.0", "id": request_id, "result": text("grown")})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    elif name == "peek":
        send({"jsonrpc": "2.0", "id": request_id, "result": text(peek())})
    elif name == "image":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "hi"}}],
            "structuredContent": {"width": 1}}})
    else:
        send({"jsonrpc": "2.0", "id": request_id, "result": text(f"{name}: done")})


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if MODE == "hang":
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS + extra_tools}})
    elif method == "tools/call":
        params = message["params"]
        args = dict(params.get("arguments") or {}, _meta=params.get("_meta"))
        threading.Thread(target=call, args=(request_id, params["name"], args), daemon=True).start()
    elif method == "notifications/cancelled":
        cancelled.append(message["params"]["requestId"])
    elif request_id is not None and method == "ping":
        send({"jsonrpc": "2.0", "id": request_id, "result": {}})
    elif request_id is not None:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
