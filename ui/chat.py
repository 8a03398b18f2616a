"""Chat panel: the answer streams while it is denoised, then the final answer with citations."""

from __future__ import annotations

import html

import gradio as gr

from app.service import DocQA
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


def wire(service: DocQA, parts, documents, settings: SettingsInputs, inspect_parts) -> None:
    conversation, new, chatbot, question, ask = parts
    scores, chosen, anchors, timings = inspect_parts

    def answer(q, history, doc_ids, conv_id, *setting_values):
        if not q or not q.strip():
            raise gr.Error("Type a question first.")
        doc_ids = list(doc_ids or []) or [d.record.id for d in service.documents()]  # none chosen: the library
        if not doc_ids:
            raise gr.Error("Add a document in the Library tab first.")
        params, chunk_size = to_params(service, *setting_values)
        history = list(history or []) + [{"role": "user", "content": q},
                                         {"role": "assistant", "content": "selecting chunks..."}]
        yield history, gr.update(), None, None, None, None, ""
        try:
            events = service.ask(q, list(doc_ids), params, conversation_id=conv_id or None, chunk_size=chunk_size)
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
                    yield (history, gr.update(choices=conversation_choices(service), value=r.conversation_id),
                           inspect.scores_frame(r), inspect.chosen_spans(service, r), inspect.anchors_figure(r),
                           r.timings, "")
        except ValueError as exc:
            raise gr.Error(str(exc)) from None

    inputs = [question, chatbot, documents, conversation, *settings.components()]
    outputs = [chatbot, conversation, scores, chosen, anchors, timings, question]
    ask.click(answer, inputs, outputs, api_name="ask", concurrency_id="model", concurrency_limit=1)
    question.submit(answer, inputs, outputs, api_visibility="private", concurrency_id="model")
    new.click(lambda: (None, []), None, [conversation, chatbot], api_visibility="private")
    conversation.change(lambda cid: history_of(service, cid), conversation, chatbot, api_visibility="private")
