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
                    f"{device_summary(service)}.")
        with gr.Tab("Library"):
            documents, _ = library.build(service)
        with gr.Tab("Chat"):
            chat_parts = chat.build(service)
        with gr.Tab("Inspect"):
            inspect_parts = inspect.build()
        with gr.Tab("Settings"):
            settings_inputs = settings.build(service)
        chat.wire(service, chat_parts, documents, settings_inputs, inspect_parts)
    # Model work is serialised (concurrency_id "model"); everything queues, nothing bypasses it.
    demo.queue(default_concurrency_limit=4, api_open=False)
    return demo


def launch(service: DocQA, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    demo = build_app(service)
    demo.launch(server_name=host, server_port=port, share=False, max_file_size=service.config.max_upload_bytes,
                show_error=True, enable_monitoring=False, prevent_thread_lock=not block, quiet=not block)
    return demo
