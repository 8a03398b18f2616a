"""The Gradio app: Library, Chat, Inspect and Settings tabs over one DocQA service."""

from __future__ import annotations

import os

import gradio as gr

from app.service import DocQA, device_summary
from ui import chat, inspect, library, settings


def build_app(service: DocQA) -> gr.Blocks:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    with gr.Blocks(title="dllm-docqa", analytics_enabled=False) as demo:
        gr.Markdown(f"## dllm-docqa\nAsk questions of long documents with a diffusion LM. Model: "
                    f"{device_summary(service)}."
                    + (" The data folder is read-only: documents can be asked, not added or deleted."
                       if service.read_only else ""))
        with gr.Tab("Library"):
            documents, _, (refresh_library, library_outputs) = library.build(service)
        with gr.Tab("Chat"):
            chat_parts = chat.build(service)
        with gr.Tab("Inspect"):
            inspect_parts = inspect.build()
        with gr.Tab("Settings"):
            settings_inputs = settings.build(service)
        cancel_closed_session, (refresh_chat, chat_outputs) = chat.wire(service, chat_parts, documents,
                                                                        settings_inputs, inspect_parts)
        # Each page load shows the library as it is now (a reload, another tab or the CLI changed it).
        demo.load(lambda: (*refresh_library(), *refresh_chat()), None, library_outputs + chat_outputs,
                  api_visibility="private")
        demo.unload(cancel_closed_session)  # a closed tab's question stops, freeing the model
    # Model work is serialised (concurrency_id "model"); everything queues, nothing bypasses it.
    demo.queue(default_concurrency_limit=4, api_open=False)
    return demo


def launch(service: DocQA, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    # Uploads go to the app's own folder inside the data folder, not the machine-wide one, where
    # every Gradio app's files lie: only those are served and only those can be added.
    os.environ["GRADIO_TEMP_DIR"] = str(service.upload_dir)
    demo = build_app(service)
    demo.launch(server_name=host, server_port=port, share=False, max_file_size=service.config.max_upload_bytes,
                show_error=True, enable_monitoring=False, prevent_thread_lock=not block, quiet=not block)
    return demo
