"""Chat panel: the answer streams while it is denoised, then the final answer with its sources;
a source (or the answer, clicked in the conversation) opens in the document viewer beside it.

Each answer of the conversation shown is kept in a gr.State as an AskResult, in the order of the
chat's answers, so clicking an earlier answer brings back its sources and its Inspect view; a
conversation chosen from the list is rebuilt from the store (`DocQA.stored_results`), also after
a restart.
"""

from __future__ import annotations

import html
import logging
import threading

import gradio as gr

from app.errors import StorageError
from app.service import AskEvent, AskResult, DocQA, QuestionStopped, ServiceBusy, may_yet_abstain
from ui import inspect, viewer
from ui.settings import SettingsInputs, to_params

logger = logging.getLogger(__name__)

FAILED = "failed"  # `last` after a question that joined the chat and failed there

# A click on a source chip (anything carrying data-cite) asks for that citation of the answer shown.
SOURCE_CLICKS = """
element.addEventListener('click', (e) => {
  const chip = e.target.closest('[data-cite]');
  if (chip) trigger('click', {cite: Number(chip.dataset.cite)});
});
"""


def build(service: DocQA, model_note: str):
    gr.Markdown(model_note, elem_id="model-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            with gr.Row():
                conversation = gr.Dropdown(choices=conversation_choices(service), label="Conversation", scale=3,
                                           elem_id="conversation")
                new = gr.Button("New conversation", scale=1)
            chatbot = gr.Chatbot(label="Answers (click an answer to see its sources)", elem_id="chatbot", height=420)
            sources = gr.HTML("", elem_id="sources", js_on_load=SOURCE_CLICKS)
            question = gr.Textbox(label="Question", placeholder="Ask about the chosen documents", elem_id="question")
            ask = gr.Button("Ask", variant="primary", elem_id="ask")
        with gr.Column(scale=2):
            viewer_parts = viewer.build()
    answers = gr.State([])  # AskResult per answer of the chat, in order (None: a failed question)
    shown = gr.State(-1)  # the answer whose sources and Inspect view are shown
    return conversation, new, chatbot, sources, question, ask, answers, shown, viewer_parts


def conversation_choices(service: DocQA) -> list[tuple[str, str]]:
    return [(c["title"], c["id"]) for c in service.conversations()]


def answer_markdown(result: AskResult) -> str:
    """The answer as the chat shows it: text, warning, and its sources numbered as in the chips."""
    text = html.escape(result.reply)
    # A "not found" reply is the warning's first sentence: the rest of it is what is left to say.
    warning = result.warning.removeprefix(result.reply).strip() if result.warning else ""
    if warning:
        text += f"\n\n**Warning:** {html.escape(warning)}"
    if result.citations:
        cites = "; ".join(f"[{i + 1}] {html.escape(c.document)}, p. {html.escape(c.pages)} ({c.score:.2f})"
                          for i, c in enumerate(result.citations))
        text += f"\n\n*Sources: {cites}*"
    return text


def sources_html(result: AskResult | None, question: str = "") -> str:
    if result is None or not result.citations:
        return ""
    chips = "".join(
        f'<button type="button" class="docqa-cite" data-cite="{i}" title="Show it in the document" '
        f'style="margin:2px 6px 2px 0;padding:3px 8px;border:1px solid #e67e00;border-radius:12px;'
        f'background:#fff7ec;cursor:pointer">[{i + 1}] {html.escape(c.document)}, p. {html.escape(c.pages)}'
        f' <span style="color:#777">({c.score:.2f})</span></button>' for i, c in enumerate(result.citations))
    about = f" of &ldquo;{html.escape(question[:80])}&rdquo;" if question else ""
    return f'<div style="margin:4px 0"><span style="color:#555">Sources{about}:</span> {chips}</div>'


def sources_pending(question: str) -> str:
    """The sources line while `question` is answered: none yet, not the previous answer's."""
    return (f'<div style="margin:4px 0;color:#555">Sources of &ldquo;{html.escape(question[:80])}&rdquo;: '
            'when the answer is given...</div>')


def refusal_note(why: str) -> str:
    """Why a question was not asked, in the line under the chat (beside the toast): the page shows
    it in place, and a client of the page's API gets it among the outputs."""
    return f'<div style="margin:4px 0;color:#a00">Not asked: {html.escape(why)}</div>'


READING = "*reading the chosen passages...*"


def partial_markdown(event: AskEvent, abstain_answer: str | None) -> str:
    """An answer being read, as the chat shows it: the partial answer as denoised so far, with what
    is being done (checking it); a neutral note instead while it may still end as the model's
    abstain answer, which is no answer to show before it is settled."""
    if may_yet_abstain(event.partial, abstain_answer):
        return READING
    text = html.escape(event.partial)
    return f"{text}\n\n*{html.escape(event.message)}...*" if event.message else text


def history_of(service: DocQA, conversation_id: str | None) -> tuple[list[dict], list[AskResult], list[str]]:
    """The chat's messages, the answers' results and their questions for a stored conversation."""
    if not conversation_id:
        return [], [], []
    messages, results, questions = [], [], []
    for q, result in service.stored_results(conversation_id):
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": answer_markdown(result)}]
        results.append(result)
        questions.append(q)
    return messages, results, questions


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


def _question_of(history: list[dict], answer_index: int) -> str:
    users = [m for m in history or [] if m.get("role") == "user"]
    if not 0 <= answer_index < len(users):
        return ""
    content = users[answer_index].get("content")
    if isinstance(content, list):  # Gradio may hand back messages as parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def wire(service: DocQA, parts, documents, settings: SettingsInputs, inspect_parts, tabs):
    """Connects the chat to the service. Returns the function that cancels a closed session's
    questions (for the app's unload event) and the one that refreshes the conversation list."""
    conversation, new, chatbot, sources, question, ask, answers, shown, viewer_parts = parts
    scores = inspect_parts[0]
    v_title, v_page, _, v_number, _, v_state = viewer_parts
    viewer_outputs = [v_title, v_page, v_number, v_state]
    viewer.wire(service, viewer_parts)
    running = RunningQuestions()

    def checked(q, doc_ids, setting_values):
        """(question, params, chunk_size) as they will be asked, or the sentence saying why the
        question cannot be asked as it is."""
        if not q or not q.strip():
            return "Type a question first."
        if not doc_ids:
            return "Add a document in the Library tab first."
        try:
            params, chunk_size = to_params(service, *setting_values)
            return service.check_question(q), params, chunk_size
        except gr.Error as exc:
            return exc.message
        except ValueError as exc:
            return str(exc)

    def answer(request: gr.Request, q, history, doc_ids, conv_id, *setting_values):
        doc_ids = list(doc_ids or []) or [d.record.id for d in service.documents()]  # none chosen: the library
        asked = checked(q, doc_ids, setting_values)
        if isinstance(asked, str):
            # A note, not gr.Error: an error would mark every output of the event as failed and
            # blank the conversation. `last` goes to None: nothing joins the chat.
            gr.Warning(asked)
            yield gr.update(), gr.update(), None, gr.update(), refusal_note(asked)
            return
        q, params, chunk_size = asked
        abstain = service.defaults.abstain_answer
        history = list(history or []) + [{"role": "user", "content": q},
                                         {"role": "assistant", "content": "selecting chunks..."}]
        # The previous answer's sources make way for this one's.
        yield history, gr.update(), None, "", sources_pending(q)
        session = getattr(request, "session_hash", None) or ""
        cancel = running.start(session)
        failure = None
        try:
            events = service.ask(q, list(doc_ids), params, conversation_id=conv_id or None, chunk_size=chunk_size,
                                 cancel=cancel)
            for event in events:
                if event.kind in ("step", "status") and event.partial:
                    history[-1] = {"role": "assistant", "content": partial_markdown(event, abstain)}
                    yield history, gr.update(), None, "", gr.update()
                elif event.kind == "done":
                    r = event.result
                    history[-1] = {"role": "assistant", "content": answer_markdown(r)}
                    yield (history, gr.update(choices=conversation_choices(service), value=r.conversation_id or None),
                           r, "", gr.update())
        except (ValueError, QuestionStopped, ServiceBusy, StorageError) as exc:
            failure = str(exc)
        except Exception as exc:  # a sentence in the page; the traceback goes to the server log only
            logger.exception("answering %r failed", q)
            failure = (f"the question could not be answered (an internal error: {type(exc).__name__}; "
                       "see the server log)")
        finally:  # also when Gradio closes this generator (the client went away)
            cancel.set()
            running.finish(session, cancel)
        if failure is not None:
            # The chat says why in place of the answer (the question stays in the box, to ask again);
            # a note too, not gr.Error, which would mark every output as failed.
            history[-1] = {"role": "assistant", "content": f"**Not answered:** {html.escape(failure)}"}
            yield history, gr.update(), FAILED, q, ""
            gr.Warning(failure)

    last = gr.State(None)  # the answer just given, until it joins `answers`

    def show_answer(results: list[AskResult], index: int, history):
        """Sources, Inspect panels and the viewer (its first source) for answer `index`."""
        result = results[index] if 0 <= index < len(results) else None
        first = None
        if result is not None and result.citations:
            first = viewer.target_of(_cite_dict(result, 0), viewer.citation_caption(1, result.citations[0]))
        view = viewer.show(service, first) if first is not None else (viewer.HINT, "", gr.update(), None)
        return (index, sources_html(result, _question_of(history, index)), *inspect.panels(result), *view)

    answer_outputs = [shown, sources, *inspect_parts, *viewer_outputs]

    def add_answer(results, result, history):
        if result is None:  # the question was refused before it joined the chat: nothing to add
            return (results, *[gr.update()] * len(answer_outputs))
        if result == FAILED:  # its place in the chat holds the reason; no sources to show
            return ([*results, None], *[gr.update()] * len(answer_outputs))
        results = [*results, result]
        return (results, *show_answer(results, len(results) - 1, history))

    inputs = [question, chatbot, documents, conversation, *settings.components()]
    outputs = [chatbot, conversation, last, question, sources]
    # The answer's sources, Inspect view and first source follow once it is given (`last`).
    for trigger, extra in ((ask.click, {"api_name": "ask", "concurrency_limit": 1}),
                           (question.submit, {"api_visibility": "private"})):
        trigger(answer, inputs, outputs, concurrency_id="model", **extra).then(
            add_answer, [answers, last, chatbot], [answers, *answer_outputs], api_visibility="private")

    def pick_answer(results, history, evt: gr.SelectData):
        """A click on a message of the chat: that answer's sources, Inspect view and first source."""
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        before = (history or [])[: int(index) + 1]
        answer_index = sum(1 for m in before if m.get("role") == "assistant") - 1
        if before and before[-1].get("role") == "user":  # the question: its answer, next
            answer_index += 1
        return show_answer(results, answer_index, history)

    chatbot.select(pick_answer, [answers, chatbot], answer_outputs, api_visibility="private")

    def open_source(results, index, evt: gr.EventData):
        picked = _clicked_item(results, index, evt, "cite", lambda result: result.citations)
        if picked is None:
            return viewer.HINT, "", gr.update(), None
        result, cite = picked
        return viewer.show(service, viewer.target_of(_cite_dict(result, cite),
                                                     viewer.citation_caption(cite + 1, result.citations[cite])))

    sources.click(open_source, [answers, shown], viewer_outputs, api_visibility="private")

    def open_bar(results, index, evt: gr.EventData):
        """A bar of the relevance plot: its chunk in the viewer, on the Chat tab."""
        picked = _clicked_item(results, index, evt, "bar", lambda result: result.scores)
        if picked is None:
            return gr.update(), viewer.HINT, "", gr.update(), None
        result, bar = picked
        s = result.scores[bar]
        caption = f"{s['document']}, p. {s['pages']} (score {s['score']:.2f}{', chosen' if s['selected'] else ''})"
        return (gr.Tabs(selected="chat"), *viewer.show(service, viewer.target_of(s, caption)))

    scores.click(open_bar, [answers, shown], [tabs, *viewer_outputs], api_visibility="private")

    def start_new():
        return None, [], [], -1, "", *inspect.panels(None), viewer.HINT, "", gr.update(value=None), None

    new.click(start_new, None, [conversation, chatbot, answers, *answer_outputs], api_visibility="private")

    def open_conversation(cid):
        messages, results, _ = history_of(service, cid)
        return (messages, results, *show_answer(results, len(results) - 1, messages))

    conversation.input(open_conversation, conversation, [chatbot, answers, *answer_outputs],
                       api_visibility="private")

    def cancel_closed_session(request: gr.Request) -> None:
        running.cancel_session(getattr(request, "session_hash", None) or "")

    def refresh_conversations():
        return (gr.Dropdown(choices=conversation_choices(service)),)

    return cancel_closed_session, (refresh_conversations, [conversation])


def _clicked_item(results: list[AskResult], index: int, evt: gr.EventData, key: str, items
                  ) -> tuple[AskResult, int] | None:
    """The answer shown and the item number a click in its HTML sent (`key` of the event's data),
    or None when either is out of range; `items(result)` is the list the number points into."""
    data = getattr(evt, "_data", None) or {}
    result = results[index] if 0 <= index < len(results) else None
    value = data.get(key)
    if result is None or not isinstance(value, int) or not 0 <= value < len(items(result)):
        return None
    return result, value


def _cite_dict(result: AskResult, i: int) -> dict:
    c = result.citations[i]
    return {"document_id": c.document_id, "document": c.document, "char_start": c.char_start,
            "char_end": c.char_end, "pages": c.pages, "score": c.score}
