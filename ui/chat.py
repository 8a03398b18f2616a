"""Chat panel: the answer streams while it is denoised, then the final answer with citations."""

from __future__ import annotations

import html
import threading

import gradio as gr

from app.errors import StorageError
from app.service import DocQA, QuestionStopped, ServiceBusy
from ui import inspect
from ui.settings import SettingsInputs, to_params


def build(service: DocQA):
    with gr.Row():
        conversation = gr.Dropdown(choices=conversation_choices(service), label="Conversation", scale=3)
        new = gr.Button("New conversation", scale=1)
    chatbot = gr.Chatbot(label="Answers", elem_id="chatbot", height=420)
    question = gr.Textbox(label="Question", placeholder="Ask about the chosen documents", elem_id="question")
    ask = gr.Button("Ask", variant="primary", elem_id="ask")
    return conversation, new, chatbot, question, ask


def conversation_choices(service: DocQA) -> list[tuple[str, str]]:
    return [(c["title"], c["id"]) for c in service.conversations()]


def history_of(service: DocQA, conversation_id: str | None) -> list[dict]:
    if not conversation_id:
        return []
    out = []
    for m in service.messages(conversation_id):
        out.append({"role": "user", "content": m.question})
        cites = "; ".join(f"{html.escape(c['document'])} p. {c['pages']}" for c in m.selected_chunks)
        out.append({"role": "assistant", "content": f"{html.escape(m.answer)}\n\n*Sources: {cites}*"})
    return out


class RunningQuestions:
    """The questions each browser session has running, so that closing its tab cancels them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, set[threading.Event]] = {}

    def start(self, session: str) -> threading.Event:
        cancel = threading.Event()
        with self._lock:
            self._by_session.setdefault(session, set()).add(cancel)
        return cancel

    def finish(self, session: str, cancel: threading.Event) -> None:
        with self._lock:
            self._by_session.get(session, set()).discard(cancel)
            if not self._by_session.get(session):
                self._by_session.pop(session, None)

    def cancel_session(self, session: str) -> int:
        with self._lock:
            events = self._by_session.pop(session, set())
        for event in events:
            event.set()
        return len(events)


def wire(service: DocQA, parts, documents, settings: SettingsInputs, inspect_parts):
    """Connects the chat to the service. Returns the function that cancels a closed session's
    questions (for the app's unload event) and the one that refreshes the conversation list."""
    conversation, new, chatbot, question, ask = parts
    scores, chosen, anchors, timings = inspect_parts
    running = RunningQuestions()

    def answer(request: gr.Request, q, history, doc_ids, conv_id, *setting_values):
        if not q or not q.strip():
            raise gr.Error("Type a question first.")
        doc_ids = list(doc_ids or []) or [d.record.id for d in service.documents()]  # none chosen: the library
        if not doc_ids:
            raise gr.Error("Add a document in the Library tab first.")
        params, chunk_size = to_params(service, *setting_values)
        try:
            q = service.check_question(q)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        history = list(history or []) + [{"role": "user", "content": q},
                                         {"role": "assistant", "content": "selecting chunks..."}]
        yield history, gr.update(), None, None, None, None, ""
        session = getattr(request, "session_hash", None) or ""
        cancel = running.start(session)
        try:
            events = service.ask(q, list(doc_ids), params, conversation_id=conv_id or None, chunk_size=chunk_size,
                                 cancel=cancel)
            for event in events:
                if event.kind == "step":
                    history[-1] = {"role": "assistant", "content": html.escape(event.partial)}
                    yield history, gr.update(), None, None, None, None, ""
                elif event.kind == "done":
                    r = event.result
                    cites = "; ".join(f"[{i + 1}] {html.escape(c.document)}, p. {c.pages} ({c.score:.2f})"
                                      for i, c in enumerate(r.citations))
                    text = html.escape(r.answer) or "(no answer)"
                    if r.warning:
                        text += f"\n\n**Warning:** {html.escape(r.warning)}"
                    history[-1] = {"role": "assistant", "content": f"{text}\n\n*Sources: {cites}*"}
                    yield (history, gr.update(choices=conversation_choices(service), value=r.conversation_id or None),
                           inspect.scores_frame(r), inspect.chosen_spans(r), inspect.anchors_figure(r),
                           r.timings, "")
        except (ValueError, QuestionStopped, ServiceBusy, StorageError) as exc:
            raise gr.Error(str(exc)) from None
        finally:  # also when Gradio closes this generator (the client went away)
            cancel.set()
            running.finish(session, cancel)

    def cancel_closed_session(request: gr.Request) -> None:
        running.cancel_session(getattr(request, "session_hash", None) or "")

    inputs = [question, chatbot, documents, conversation, *settings.components()]
    outputs = [chatbot, conversation, scores, chosen, anchors, timings, question]
    ask.click(answer, inputs, outputs, api_name="ask", concurrency_id="model", concurrency_limit=1)
    question.submit(answer, inputs, outputs, api_visibility="private", concurrency_id="model")
    new.click(lambda: (None, []), None, [conversation, chatbot], api_visibility="private")
    conversation.change(lambda cid: history_of(service, cid), conversation, chatbot, api_visibility="private")

    def refresh_conversations():
        return (gr.Dropdown(choices=conversation_choices(service)),)

    return cancel_closed_session, (refresh_conversations, [conversation])
