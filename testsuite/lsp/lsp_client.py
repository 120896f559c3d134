#!/usr/bin/env python3
"""A minimal LSP client over a server's standard input/output, for the
ulplint-clangd tests (testsuite/tool/clangd-*.test) and the latency
measurement in testsuite/bench.

  lsp_client.py SERVER FILE [--expect-check CHECK] [--expect-fix TEXT]
                [--timeout S] [-- SERVER_ARGS...]

Opens FILE, waits for its publishDiagnostics, prints every diagnostic as
`line:col: [source code] message` (1-based), asks for code actions at the
first diagnostic of --expect-check and prints each action's title and
edits. Exits 1 when an expectation fails, 2 on protocol errors or timeout.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import queue


class Server:
    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.next_id = 1
        self.inbox = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            headers = {}
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                line = line.decode().strip()
                if not line:
                    break
                key, _, value = line.partition(":")
                headers[key.lower()] = value.strip()
            body = out.read(int(headers["content-length"]))
            self.inbox.put(json.loads(body))

    def send(self, msg):
        data = json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(data) + data)
        self.proc.stdin.flush()

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method, params, deadline):
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == rid and "method" not in m, deadline)

    def wait(self, pred, deadline):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the server")
            msg = self.inbox.get(timeout=left)
            if msg is None:
                raise EOFError("the server exited")
            if "method" in msg and "id" in msg:  # a request to the client
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
                continue
            if pred(msg):
                return msg


def main():
    argv = sys.argv[1:]
    server_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser()
    p.add_argument("server")
    p.add_argument("file")
    p.add_argument("--expect-check")
    p.add_argument("--expect-fix")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--print-latency", action="store_true")
    a = p.parse_args(argv)

    path = os.path.abspath(a.file)
    uri = "file://" + path
    root = os.path.dirname(path)
    deadline = time.monotonic() + a.timeout
    srv = Server([a.server] + server_args)
    try:
        srv.request("initialize", {
            "processId": os.getpid(), "rootUri": "file://" + root,
            "capabilities": {"textDocument": {
                "publishDiagnostics": {"relatedInformation": True},
                "codeAction": {"codeActionLiteralSupport": {
                    "codeActionKind": {"valueSet": ["quickfix"]}}}}}}, deadline)
        srv.notify("initialized", {})
        with open(path) as f:
            text = f.read()
        opened = time.monotonic()
        srv.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "c", "version": 1, "text": text}})
        diag = srv.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                        and m["params"]["uri"] == uri, deadline)
        latency = time.monotonic() - opened
        diags = diag["params"]["diagnostics"]
        for d in diags:
            s = d["range"]["start"]
            print("%d:%d: [%s %s] %s" % (s["line"] + 1, s["character"] + 1,
                                         d.get("source", ""), d.get("code", ""),
                                         d["message"].replace("\n", " | ")))
        if a.print_latency:
            print("latency: %.3f s" % latency)
        status = 0
        if a.expect_check:
            found = [d for d in diags if d.get("code") == a.expect_check]
            if not found:
                print("lsp_client: no %s diagnostic" % a.expect_check)
                status = 1
            else:
                resp = srv.request("textDocument/codeAction", {
                    "textDocument": {"uri": uri}, "range": found[0]["range"],
                    "context": {"diagnostics": [found[0]]}}, deadline)
                edits = []
                for act in resp.get("result") or []:
                    print("action: %s" % act.get("title"))
                    for changes in (act.get("edit") or {}).get("changes", {}).values():
                        for e in changes:
                            s = e["range"]["start"]
                            print("  edit %d:%d: %s" % (s["line"] + 1, s["character"] + 1,
                                                         e["newText"]))
                            edits.append(e["newText"])
                if a.expect_fix and a.expect_fix not in edits:
                    print("lsp_client: no code action edit %r" % a.expect_fix)
                    status = 1
        srv.request("shutdown", None, deadline)
        srv.notify("exit", None)
        srv.proc.wait(timeout=10)
        return status
    except (TimeoutError, EOFError, queue.Empty) as e:
        print("lsp_client: %s" % e)
        srv.proc.kill()
        return 2


if __name__ == "__main__":
    sys.exit(main())
