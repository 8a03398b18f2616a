"""The token layout of a question about documents: [prefix] [chunks...] [query] [answer].

The prompt is rendered once (through the model's chat template when it has one) with sentinels in
place of the documents and the question, then cut at them: the prefix is everything before the
documents (it starts with BOS), the query everything after (the question, the answer cue and the
assistant header). Each piece is tokenized on its own, so the question's token span is known:
chunk scoring targets exactly those tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_INSTRUCTION = "Answer the question using only the documents. Answer briefly."
_DOCS = "\uE000DOCUMENTS\uE000"  # private-use sentinels never produced by real text
_QUESTION = "\uE000QUESTION\uE000"


@dataclass(frozen=True)
class QuestionPrompt:
    prefix_ids: list[int]  # BOS first
    query_ids: list[int]
    question_span: tuple[int, int]  # [start, end) of the question's tokens inside query_ids

    @property
    def question_ids(self) -> list[int]:
        return self.query_ids[self.question_span[0]:self.question_span[1]]


def build_question_prompt(tokenizer, question: str, bos_id: int,
                          instruction: str = DEFAULT_INSTRUCTION,
                          use_chat_template: bool = True) -> QuestionPrompt:
    """Token layout for `question`; the documents go between prefix and query."""
    question = question.strip()
    if not question:
        raise ValueError("the question is empty")
    content = f"{instruction}\n\n{_DOCS}\n\nQuestion: {_QUESTION}"
    if use_chat_template and tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = content + "\nAnswer:"
    before_docs, after_docs = text.split(_DOCS)
    before_q, after_q = after_docs.split(_QUESTION)

    def enc(s: str) -> list[int]:
        return tokenizer(s, add_special_tokens=False)["input_ids"] if s else []

    prefix = enc(before_docs)
    if not prefix or prefix[0] != bos_id:
        prefix = [bos_id] + prefix
    head, q_ids, tail = enc(before_q), enc(question), enc(after_q)
    return QuestionPrompt(prefix_ids=prefix, query_ids=head + q_ids + tail,
                          question_span=(len(head), len(head) + len(q_ids)))
