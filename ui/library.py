"""Library panel: upload with progress, the documents table, delete, and choosing documents.

Everything that lists documents is filled when a page loads (`refresh`), not when the server
starts: a reload, another tab or the CLI may have changed the library since.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from app.errors import IngestError, StorageError, without_name
from app.jobs import JobProgress, describe
from app.service import DocQA

logger = logging.getLogger(__name__)

COLUMNS = ["name", "pages", "tokens", "chunks", "cached", "MiB", "status", "id"]


def documents_frame(service: DocQA) -> pd.DataFrame:
    """Every document, ready or failed, and below them those being added, with their progress."""
    rows = [[d.record.name, d.record.page_count, d.tokens, d.chunks, "yes" if d.cached else "no",
             round(d.kv_bytes / 2**20, 1),
             "ready" if d.record.status == "ready" else f"failed: {d.record.error} (add it again to retry)",
             d.record.id[:12]] for d in service.documents(include_failed=True)]
    rows += [[j.name, j.pages_total or "", "", j.chunks_total or "", "no", "",
              f"being added ({100 * j.fraction:.0f}%)", ""] for j in service.ingest_progress()]
    return pd.DataFrame(rows, columns=COLUMNS)


# A click on a job's Cancel button (anything carrying data-job) asks to stop that ingest.
CANCEL_CLICKS = """
element.addEventListener('click', (e) => {
  const button = e.target.closest('[data-job]');
  if (button) trigger('click', {job: Number(button.dataset.job)});
});
"""


def jobs_html(jobs: list[JobProgress]) -> str:
    """One progress bar an ingest running now: pages and chunks done, time left, a Cancel button."""
    out = []
    for j in jobs:
        out.append(
            f'<div class="docqa-job" data-name="{html.escape(j.name)}" style="margin:6px 0">'
            f'<div><b>{html.escape(j.name)}</b>: <span class="docqa-job-text">{html.escape(describe(j))}</span> '
            f'<button type="button" data-job="{j.id}" class="docqa-cancel" style="margin-left:8px;padding:1px 8px;'
            f'border:1px solid #b00020;color:#b00020;border-radius:4px;background:#fff;cursor:pointer">Cancel'
            f'</button></div><progress value="{j.fraction:.3f}" max="1" style="width:100%"></progress></div>')
    return "".join(out)


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
            jobs = gr.HTML("", elem_id="jobs", js_on_load=CANCEL_CLICKS)
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

    def ingest_one(path: str, pw: str | None) -> str:
        name = Path(path).name
        if not is_upload(service, path):
            return f"- **{name}**: not added: only files uploaded to this page can be added"
        try:
            data = Path(path).read_bytes()
            info, added = service.ingest(data, name, password=pw or None)
            return (f"- **{info.record.name}**: {'added' if added else 'already in the library'} "
                    f"({info.record.page_count} pages, {info.chunks} chunks)")
        except (IngestError, StorageError, ValueError, OSError) as exc:
            gr.Warning(f"{name}: {without_name(str(exc), name)}")
            return f"- **{name}**: not added: {without_name(str(exc), name)}"
        except Exception as exc:  # noqa: BLE001 - one file's failure must not hide the others'
            logger.exception("ingest of %s failed", name)
            return f"- **{name}**: not added: an internal error ({type(exc).__name__}); see the server log"
        finally:  # the upload is not kept in the temporary folder, where it could still be served
            service.discard_upload_file(path)

    def ingest(paths, pw):
        began = time.time()
        try:
            lines = [ingest_one(path, pw) for path in paths or []]
        finally:  # the empty files Gradio left for this event's uploads (made before it began)
            service.discard_upload_debris(before=began)
        nothing = "No file to add: choose PDF, text or Markdown files (other types are refused on upload)."
        return ("\n".join(lines) or nothing, None, *lists())

    def remove(doc_id):
        if doc_id:
            try:
                service.delete(doc_id)
            except (StorageError, ValueError) as exc:
                raise gr.Error(str(exc)) from None
        return lists()

    def tick(were_running: list[int]):
        """The progress panel every second; the table too while something is being added, and
        once more when it ends (so the document appears as ready or failed)."""
        running = service.ingest_progress()
        ids = [j.id for j in running]
        if not ids and not were_running:
            return gr.update(), gr.update(), ids
        return jobs_html(running), documents_frame(service), ids

    def cancel_job(evt: gr.EventData):
        job = (getattr(evt, "_data", None) or {}).get("job")
        if isinstance(job, int) and not service.cancel_job(job):
            gr.Warning("That ingest is not running in this server any more (it may have just finished).")

    # The progress of an ingest is drawn once, as its bar in the jobs panel (from the jobs table,
    # so it survives a page refresh), not as Gradio's overlay on every output of the event.
    add.click(ingest, [files, password], [status, files, table, victim, selected], api_name="ingest",
              concurrency_id="model", show_progress="hidden")
    delete.click(remove, [victim], [table, victim, selected], api_name="delete_document")
    was_running = gr.State([])
    gr.Timer(1.0).tick(tick, was_running, [jobs, table, was_running], api_visibility="private",
                       show_progress="hidden")
    jobs.click(cancel_job, None, None, api_visibility="private")

    def list_documents() -> list[dict]:
        """Every stored document: id, name, pages, chunks, cached, status."""
        return [{"id": d.record.id, "name": d.record.name, "pages": d.record.page_count, "chunks": d.chunks,
                 "cached": d.cached, "status": d.record.status} for d in service.documents(include_failed=True)]

    gr.api(list_documents, api_name="list_documents")

    def on_load():
        return (*lists(), gr.Dropdown(choices=sorted(service.collections())))

    return selected, table, (on_load, [table, victim, selected, collection])
