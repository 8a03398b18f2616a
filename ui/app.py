"""The Gradio app: Library, Chat, Inspect and Settings tabs over one DocQA service, served with
the OpenAI-compatible API (ui.openai_api) on the same port."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

import gradio as gr
import uvicorn
from fastapi import FastAPI
from starlette.routing import Mount

from app.service import DocQA, ModelInfo, model_info
from ui import chat, inspect, library, settings
from ui.openai_api import create_api


def header(info: ModelInfo, read_only: bool) -> str:
    """Which model runs where, in one line under the title."""
    size = f"{info.parameters / 1e9:.1f}B" if info.parameters >= 1e9 else f"{info.parameters / 1e6:.0f}M"
    kind = "the bundled lookup model" if info.bundled else f"a {'Dream' if info.family == 'dream' else 'LLaDA'} model"
    line = (f"## dllm-docqa\nAsk questions of long documents with a diffusion LM. **Model:** {info.name} ({kind}, "
            f"{size} parameters) **on {info.device}**, {info.dtype}.")
    if read_only:
        line += " The data folder is read-only: documents can be asked, not added or deleted."
    return line


def model_note(info: ModelInfo) -> str:
    """What the model running can answer, for the Chat tab: honest about the bundled one."""
    if info.bundled:
        return ("**What this model can answer:** docqa-tiny is a small model (27M parameters) trained for "
                "lookups: it copies a short fact (a number, name, date or code) that a sentence of the documents "
                "states, and says \"not found\" when the passages it chose do not hold it. On held-out questions "
                "it is right 47-100% of the time depending on the kind of question and the document's length (its "
                "model card, `models/docqa-tiny/README.md`). It cannot summarise, explain or reason over several "
                "passages; for that, start the app on a Dream or LLaDA checkpoint "
                "(`docqa serve --model /path/to/Dream-v0-Instruct-7B`). Always check the answer against its source.")
    return (f"**What this model can answer:** {info.name} is a general instruction-tuned diffusion model: it answers "
            "from the few chunks chosen for each question (see Inspect), so questions whose answer lies in one or "
            "a few passages work best. Check each answer against its highlighted source.")


def build_app(service: DocQA) -> gr.Blocks:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    info = model_info(service)
    with gr.Blocks(title="dllm-docqa", analytics_enabled=False) as demo:
        gr.Markdown(header(info, service.read_only), elem_id="header")
        with gr.Tabs() as tabs:
            with gr.Tab("Library", id="library"):
                documents, _, (refresh_library, library_outputs) = library.build(service)
            with gr.Tab("Chat", id="chat"):
                chat_parts = chat.build(service, model_note(info))
            with gr.Tab("Inspect", id="inspect"):
                inspect_parts = inspect.build()
            with gr.Tab("Settings", id="settings"):
                settings_inputs = settings.build(service)
        cancel_closed_session, (refresh_chat, chat_outputs) = chat.wire(service, chat_parts, documents,
                                                                        settings_inputs, inspect_parts, tabs)
        # Each page load shows the library as it is now (a reload, another tab or the CLI changed it).
        demo.load(lambda: (*refresh_library(), *refresh_chat()), None, library_outputs + chat_outputs,
                  api_visibility="private")
        demo.unload(cancel_closed_session)  # a closed tab's question stops, freeing the model
    # Model work is serialised (concurrency_id "model"); everything queues, nothing bypasses it.
    demo.queue(default_concurrency_limit=4, api_open=False)
    return demo


class WebServer:
    """The Gradio app at / and the OpenAI-compatible API at /v1 (ui.openai_api), on one port,
    served by uvicorn. `serve` runs it in this thread until interrupted; `start` in a thread of its
    own, returning once it listens; `close` stops it."""

    def __init__(self, service: DocQA, demo: gr.Blocks, host: str, port: int) -> None:
        root = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        root.mount("/v1", create_api(service))  # before Gradio's mount at /, which takes every path
        gr.mount_gradio_app(root, demo, path="/", server_name=host, server_port=port, show_error=True,
                            max_file_size=service.config.max_upload_bytes, enable_monitoring=False)
        # Gradio checks that the files an event names are uploads only in apps it launched itself
        # (gradio.processing_utils._check_allowed); a mounted app is served all the same, so it is
        # marked launched, else a request could name any file on the machine for ingest.
        demo.has_launched = True
        self.demo = demo
        self._gradio = next(r.app for r in root.routes if isinstance(r, Mount) and r.path == "")
        # Bound here, so that a port in use is an OSError from `launch` (the CLI's one-line error).
        try:
            self._socket = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise OSError(f"cannot listen on {host}:{port}: {reason}") from None
        self.port = self._socket.getsockname()[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"
        config = uvicorn.Config(root, host=host, port=self.port, log_level="warning", access_log=False,
                                lifespan="on",  # Gradio's queue starts in the app's lifespan
                                timeout_graceful_shutdown=5)  # then streams still open are cut
        self._server = _Uvicorn(config, on_shutdown=self._end_sessions)
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl+C it stopped on: a normal end
            self._server.run(sockets=[self._socket])

    def start(self, timeout_s: float = 60.0) -> None:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="docqa-web", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the web server did not start on {self.url} (see the log above)")
            time.sleep(0.02)

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._socket.close()

    def _end_sessions(self) -> None:
        """Ends what keeps connections open, on the server's loop as it shuts down: Gradio's queue
        and its browser sessions' heartbeats (else every open tab holds the shutdown)."""
        self.demo.close(verbose=False)
        self._gradio.stop_event.set()


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def launch(service: DocQA, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> WebServer:
    """Serves the web app and the OpenAI-compatible API on `host:port` (loopback by default). With
    `block`, until interrupted; else in the background: `close()` the server returned."""
    # Uploads go to the app's own folder inside the data folder, not the machine-wide one, where
    # every Gradio app's files lie: only those are served and only those can be added.
    os.environ["GRADIO_TEMP_DIR"] = str(service.upload_dir)
    server = WebServer(service, build_app(service), host, port)
    if block:
        print(f"* Running on {server.url} (the web app; the OpenAI-compatible API at {server.url}v1)", flush=True)
        server.serve()
    else:
        server.start()
    return server
