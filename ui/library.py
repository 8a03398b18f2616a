"""Library panel: upload with progress, the documents table, delete, and choosing documents.

Everything that lists documents is filled when a page loads (`refresh`), not when the server
starts: a reload, another tab or the CLI may have changed the library since.
"""

from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr
import pandas as pd

from app.errors import IngestError, StorageError
from app.service import DocQA

logger = logging.getLogger(__name__)

COLUMNS = ["name", "pages", "tokens", "chunks", "cached", "MiB", "status", "id"]


def documents_frame(service: DocQA) -> pd.DataFrame:
    rows = [[d.record.name, d.record.page_count, d.tokens, d.chunks, "yes" if d.cached else "no",
             round(d.kv_bytes / 2**20, 1),
             "ready" if d.record.status == "ready" else f"failed: {d.record.error} (add it again to retry)",
             d.record.id[:12]] for d in service.documents(include_failed=True)]
    return pd.DataFrame(rows, columns=COLUMNS)


def choices(service: DocQA, include_failed: bool = False) -> list[tuple[str, str]]:
    return [(d.record.name, d.record.id) for d in service.documents(include_failed=include_failed)]


def is_upload(service: DocQA, path: str | Path) -> bool:
    """Whether `path` is a file this app's upload folder holds (the only paths ingest accepts: the
    machine's shared temporary folder may hold other apps' files)."""
    try:
        return Path(path).resolve().is_relative_to(service.upload_dir.resolve())
    except (OSError, ValueError):
        return False


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
                victim = gr.Dropdown(choices=choices(service, include_failed=True), label="Delete a document",
                                     elem_id="delete-choice")
                delete = gr.Button("Delete", variant="stop", elem_id="delete")
    # A dropdown that takes any id: the API may name a document added after this page was built;
    # the service checks every id it is given.
    selected = gr.Dropdown(choices=choices(service), value=[c[1] for c in choices(service)], multiselect=True,
                           allow_custom_value=True, label="Documents the chat uses", elem_id="chat-documents")
    with gr.Row():
        collection = gr.Dropdown(choices=sorted(service.collections()), label="Use a collection", scale=2)
        collection_name = gr.Textbox(label="Save the chosen documents as a collection named", scale=2)
        save = gr.Button("Save collection", scale=1)

    def use_collection(name):
        return gr.update(value=service.collections().get(name, [])) if name else gr.update()

    def save_collection(name, doc_ids):
        try:
            service.save_collection(name or "", list(doc_ids or []))
        except (ValueError, StorageError) as exc:
            raise gr.Error(str(exc)) from None
        return gr.update(choices=sorted(service.collections()), value=name.strip())

    collection.change(use_collection, collection, selected, api_visibility="private")
    save.click(save_collection, [collection_name, selected], collection, api_name="save_collection")

    def lists():
        """The table and every document list, as the library is now."""
        docs = choices(service)
        return (documents_frame(service), gr.Dropdown(choices=choices(service, include_failed=True), value=None),
                gr.Dropdown(choices=docs, value=[d[1] for d in docs]))

    def ingest_one(path: str, pw: str | None, progress) -> str:
        name = Path(path).name
        if not is_upload(service, path):
            return f"- **{name}**: not added: only files uploaded to this page can be added"
        try:
            data = Path(path).read_bytes()
            info, added = service.ingest(data, name, password=pw or None,
                                         progress=lambda stage, frac: progress(frac, desc=f"{name}: {stage}"))
            return (f"- **{info.record.name}**: {'added' if added else 'already in the library'} "
                    f"({info.record.page_count} pages, {info.chunks} chunks)")
        except (IngestError, StorageError, ValueError, OSError) as exc:
            gr.Warning(f"{name}: {exc}")
            return f"- **{name}**: not added: {exc}"
        except Exception as exc:  # noqa: BLE001 - one file's failure must not hide the others'
            logger.exception("ingest of %s failed", name)
            return f"- **{name}**: not added: an internal error ({type(exc).__name__}); see the server log"
        finally:  # the upload is not kept in the temporary folder, where it could still be served
            service.discard_upload_file(path)

    def ingest(paths, pw, progress=gr.Progress()):  # noqa: B008 (Gradio injects the tracker)
        lines = [ingest_one(path, pw, progress) for path in paths or []]
        return ("\n".join(lines) or "Choose files first.", None, *lists())

    def remove(doc_id):
        if doc_id:
            try:
                service.delete(doc_id)
            except (StorageError, ValueError) as exc:
                raise gr.Error(str(exc)) from None
        return lists()

    def active_jobs():
        running = service.jobs(active_only=True)
        return "\n".join(f"- {j['name']}: {j['stage']} ({100 * j['fraction']:.0f}%)" for j in running)

    # One progress bar an ingest, on the status panel: by default Gradio draws it over every output.
    add.click(ingest, [files, password], [status, files, table, victim, selected], api_name="ingest",
              concurrency_id="model", show_progress="full", show_progress_on=[status])
    delete.click(remove, [victim], [table, victim, selected], api_name="delete_document")
    gr.Timer(1.0).tick(active_jobs, None, jobs, api_visibility="private", show_progress="hidden")

    def list_documents() -> list[dict]:
        """Every stored document: id, name, pages, chunks, cached, status."""
        return [{"id": d.record.id, "name": d.record.name, "pages": d.record.page_count, "chunks": d.chunks,
                 "cached": d.cached, "status": d.record.status} for d in service.documents(include_failed=True)]

    gr.api(list_documents, api_name="list_documents")

    def on_load():
        return (*lists(), gr.Dropdown(choices=sorted(service.collections())))

    return selected, table, (on_load, [table, victim, selected, collection])
