"""Library panel: upload with progress, the documents table, delete, and choosing documents."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from app.ingest import IngestError
from app.service import DocQA

COLUMNS = ["name", "pages", "tokens", "chunks", "cached", "MiB", "id"]


def documents_frame(service: DocQA) -> pd.DataFrame:
    rows = [[d.record.name, d.record.page_count, d.tokens, d.chunks, "yes" if d.cached else "no",
             round(d.kv_bytes / 2**20, 1), d.record.id[:12]] for d in service.documents()]
    return pd.DataFrame(rows, columns=COLUMNS)


def choices(service: DocQA) -> list[tuple[str, str]]:
    return [(d.record.name, d.record.id) for d in service.documents()]


def build(service: DocQA):
    with gr.Row():
        with gr.Column(scale=2):
            files = gr.File(label="Add documents (PDF, TXT, Markdown)", file_count="multiple",
                            file_types=[".pdf", ".txt", ".md", ".markdown"], elem_id="upload")
            password = gr.Textbox(label="PDF password (only for encrypted files)", type="password")
            add = gr.Button("Add documents", variant="primary", elem_id="add-documents")
            status = gr.Markdown(elem_id="ingest-status")
            jobs = gr.Markdown(elem_id="jobs")
        with gr.Column(scale=3):
            table = gr.Dataframe(value=documents_frame(service), headers=COLUMNS, interactive=False,
                                 label="Documents", elem_id="documents")
            with gr.Row():
                victim = gr.Dropdown(choices=choices(service), label="Delete a document")
                delete = gr.Button("Delete", variant="stop")
    selected = gr.CheckboxGroup(choices=choices(service), value=[c[1] for c in choices(service)],
                                label="Documents the chat uses", elem_id="chat-documents")
    with gr.Row():
        collection = gr.Dropdown(choices=sorted(service.collections()), label="Use a collection", scale=2)
        collection_name = gr.Textbox(label="Save the chosen documents as a collection named", scale=2)
        save = gr.Button("Save collection", scale=1)

    def use_collection(name):
        return gr.update(value=service.collections().get(name, [])) if name else gr.update()

    def save_collection(name, doc_ids):
        try:
            service.save_collection(name or "", list(doc_ids or []))
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return gr.update(choices=sorted(service.collections()), value=name.strip())

    collection.change(use_collection, collection, selected, api_visibility="private")
    save.click(save_collection, [collection_name, selected], collection, api_name="save_collection")

    def ingest(paths, pw, progress=gr.Progress()):  # noqa: B008 (Gradio injects the tracker)
        lines = []
        for path in paths or []:
            name = Path(path).name
            try:
                data = Path(path).read_bytes()
                info, added = service.ingest(data, name, password=pw or None,
                                             progress=lambda stage, frac, n=name: progress(frac, desc=f"{n}: {stage}"))
                lines.append(f"- **{info.record.name}**: {'added' if added else 'already in the library'} "
                             f"({info.record.page_count} pages, {info.chunks} chunks)")
            except IngestError as exc:
                gr.Warning(f"{name}: {exc}")
                lines.append(f"- **{name}**: not added: {exc}")
        docs = choices(service)
        return ("\n".join(lines) or "Choose files first.", documents_frame(service),
                gr.Dropdown(choices=docs), gr.CheckboxGroup(choices=docs, value=[d[1] for d in docs]))

    def remove(doc_id):
        if doc_id:
            service.delete(doc_id)
        docs = choices(service)
        return (documents_frame(service), gr.Dropdown(choices=docs, value=None),
                gr.CheckboxGroup(choices=docs, value=[d[1] for d in docs]))

    def active_jobs():
        running = service.jobs(active_only=True)
        return "\n".join(f"- {j['name']}: {j['stage']} ({100 * j['fraction']:.0f}%)" for j in running)

    add.click(ingest, [files, password], [status, table, victim, selected], api_name="ingest",
              concurrency_id="model")
    delete.click(remove, [victim], [table, victim, selected], api_name="delete_document")
    gr.Timer(1.0).tick(active_jobs, None, jobs, api_visibility="private")
    def list_documents() -> list[dict]:
        """Every stored document: id, name, pages, chunks, cached."""
        return [{"id": d.record.id, "name": d.record.name, "pages": d.record.page_count, "chunks": d.chunks,
                 "cached": d.cached} for d in service.documents()]

    gr.api(list_documents, api_name="list_documents")
    return selected, table
