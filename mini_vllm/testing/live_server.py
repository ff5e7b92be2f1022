"""Run mini's OpenAI server in this process on a free loopback port (tests and Phase 16's lab 03).

``LiveServer(**engine_args)`` starts uvicorn on a background thread, bound to 127.0.0.1 on a port
the OS picks, and waits (bounded) until ``/health`` answers; ``stop()`` shuts it down. The engine
stays reachable (``server.engine``) so a test can read the block pool. ``checkpoint`` serves a model
directory instead of the toy engine, under ``served_model_name`` when given.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from typing import Any


class LiveServer:
    def __init__(
        self,
        api_key: str | None = None,
        reasoning_parser: str | None = None,
        checkpoint: str | None = None,
        served_model_name: str | None = None,
        **engine_args: Any,
    ) -> None:
        from mini_vllm.entrypoints.api_server import build_app, load_model

        self.model = load_model(checkpoint, reasoning_parser, **engine_args)
        if served_model_name:
            self.model.name = served_model_name
        self.engine = self.model.llm.engine
        self.app = LiveApp(build_app(self.model, api_key), "mini's server")
        self.port, self.base_url = self.app.port, self.app.base_url

    def num_free_blocks(self) -> int:
        return self.engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """True once the engine holds no request (aborts applied); False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.engine.has_unfinished_requests() or self.model.llm._sent:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        self.app.stop()


class LiveApp:
    """Any ASGI app (mini's server, the prefill/decode proxy) on uvicorn, on a free loopback port,
    on a background thread; waits (bounded) until ``/health`` answers."""

    def __init__(self, app: Any, what: str = "the app") -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(self.base_url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or not self.thread.is_alive():
                    raise RuntimeError(f"{what} did not come up within 20 s") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
